"""allocscope.torch's layer names: the qualified names of the modules of
every known model (roots found lazily or passed to enable()), provisional
names of modules of no known model, and the registration of each root's
parameters (with the provenance observer, when installed)."""

import ctypes
import weakref

import torch

import allocscope as _allocscope

from . import _params, _provenance
from ._common import _lock, _say

# id(module) -> (weakref to the module, name, provisional, name as UTF-8 bytes)
_names = {}
# id(root) -> [weakref, prefix, params registered]
_roots = {}
_root_prefixes = set()


_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float64: "fp64",
}
for _attr, _text in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
    if hasattr(torch, _attr):
        _DTYPES[getattr(torch, _attr)] = _text


def _dtype_name(dtype):
    return _DTYPES.get(dtype) or str(dtype).replace("torch.", "")


def _dtensor_type():
    for module in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            mod = __import__(module, fromlist=["DTensor"])
            return getattr(mod, "DTensor")
        except Exception:
            continue
    return None



# Components that wrappers insert into qualified names (torch's state dicts
# leave them out too): torch.compile's OptimizedModule, checkpoint_wrapper,
# FSDP1.
_WRAPPER_COMPONENTS = _params.WRAPPER_COMPONENTS


def _join(prefix, name):
    """prefix.name without wrapper components (naming time only)."""
    name = ".".join(c for c in name.split(".") if c not in _WRAPPER_COMPONENTS)
    if not prefix:
        return name
    if not name:
        return prefix
    return prefix + "." + name


def layer_name(module):
    """The layer name allocscope gives `module`, or None when it has none yet."""
    entry = _names.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    return None


def _set_name(module, name, provisional):
    key = id(module)
    try:
        ref = weakref.ref(module, lambda _r, key=key: _forget(key, _r))
    except TypeError:
        return
    _names[key] = (ref, name, provisional, name.encode("utf-8", "replace"))


def _forget(key, ref):
    entry = _names.get(key)
    if entry is not None and entry[0] is ref:
        _names.pop(key, None)
    root = _roots.get(key)
    if root is not None and root[0] is ref:
        _roots.pop(key, None)


def _add_root(module, prefix=None):
    """Names `module` and its sub-modules; returns the root's entry."""
    with _lock:
        entry = _roots.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry
        if prefix is None:
            if not _root_prefixes:
                prefix = ""
            else:
                base = type(module).__name__
                prefix, n = base, 2
                while prefix in _root_prefixes:
                    prefix = "%s#%d" % (base, n)
                    n += 1
        _root_prefixes.add(prefix)
        for name, sub in module.named_modules():
            existing = _names.get(id(sub))
            if existing is not None and existing[0]() is sub and not existing[2] and sub is not module:
                continue  # already named by another known model
            _set_name(sub, _join(prefix, name), False)
        entry = [weakref.ref(module), prefix, False]
        _roots[id(module)] = entry
        return entry


def _register_params(root, prefix):
    _provenance.registering()
    dtensor = _dtensor_type()
    seen = set()
    for name, sub in root.named_modules():
        layer = _join(prefix, name)
        for pname, p in sub.named_parameters(recurse=False):
            key = (id(sub), pname)
            if key in seen or p is None:
                continue
            seen.add(key)
            try:
                numel = int(p.numel())
                sharded = numel
                if dtensor is not None and isinstance(p, dtensor):
                    sharded = int(p.to_local().numel())
                _allocscope.register_param(layer, pname, numel, _dtype_name(p.dtype), sharded)
                _params.remember(p, layer, pname)  # for out-of-memory errors (_oom.py)
                provenance_param = _provenance._provenance_param
                if provenance_param is not None:
                    shape = [int(d) for d in p.shape]  # a DTensor's: the global shape
                    provenance_param(
                        layer.encode("utf-8", "replace"),
                        pname.encode("utf-8", "replace"),
                        (ctypes.c_int64 * max(len(shape), 1))(*shape),
                        len(shape),
                    )
            except Exception as e:  # never break the training step
                _say("param", "cannot register parameter %s.%s: %s" % (layer, pname, e))


def _current_layer(api):
    """The layer of the calling thread's innermost tag (the enclosing layer of
    a module of no known model)."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = api.current_layer(buf, size)
        if n < size:
            return buf.value.decode("utf-8", "replace")
        size = n + 1
