"""The registered parameters by object: _naming adds each one it registers,
_oom names the one an out-of-memory error's frames were processing. Imports
nothing of the package, so both can use it."""

import weakref

# Components that wrappers insert into module paths, left out of names as
# torch's state dicts leave them out: torch.compile's OptimizedModule,
# checkpoint_wrapper, FSDP1 (_naming for module names, _compiled for paths
# in compiled graphs).
WRAPPER_COMPONENTS = frozenset(("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"))

# id(parameter) -> (weakref to it, layer, name)
_parameters = {}


def remember(parameter, layer, name):
    """Keeps `parameter` as (layer, name) while it lives."""
    try:
        _parameters[id(parameter)] = (weakref.ref(parameter), layer, name)
    except TypeError:  # a parameter type without weak references: not named
        pass


def parameter_of(obj):
    """(layer, name) when `obj` is a registered parameter, else None."""
    entry = _parameters.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return None
    return entry[1], entry[2]
