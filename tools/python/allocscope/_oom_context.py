"""The parameter a program was processing when it ran out of memory, from
the Python frames that raised the error: no torch needed, so it is tested
on any machine (tests/python/oom_context_test.py)."""

# Frames looked into, innermost first: the one that called the failing op
# and a few callers (a helper that got the parameter from its caller). A
# training loop further out that holds a list of every parameter says
# nothing about the failing op.
_MAX_FRAMES = 4
_MAX_ITEMS = 100000  # a longer list or tuple is not looked into


def processing_parameter(frame, parameter_of):
    """(layer, name, count) of the parameter held in a local variable of the
    innermost frame, `frame` or one of its nearest callers (_MAX_FRAMES),
    that holds one (count 1); else, where `frame` itself (the one that
    called the failing op) holds a list or tuple of parameters, the first
    of them (count: how many of its items are parameters, as a foreach
    optimizer passes them).
    `parameter_of(obj)` is (layer, name) for a registered parameter, else
    None. None where no frame holds one; never raises."""
    try:
        for depth in range(_MAX_FRAMES):
            if frame is None:
                return None
            listed = None
            for value in list(frame.f_locals.values()):
                found = parameter_of(value)
                if found is not None:
                    return found[0], found[1], 1
                if (depth == 0 and listed is None and isinstance(value, (list, tuple))
                        and len(value) <= _MAX_ITEMS):
                    listed = _first_of(value, parameter_of)
            if listed is not None:
                return listed
            frame = frame.f_back
    except Exception:
        return None
    return None


def _first_of(items, parameter_of):
    first, count = None, 0
    for item in items:
        found = parameter_of(item)
        if found is not None:
            count += 1
            if first is None:
                first = found
    return (first[0], first[1], count) if count else None
