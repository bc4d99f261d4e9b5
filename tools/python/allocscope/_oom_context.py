"""The parameter a program was processing when it ran out of memory, from
the Python frames that raised the error: no torch needed, so it is tested
on any machine (tests/python/oom_context_test.py)."""

_MAX_FRAMES = 24  # callers looked into, innermost first
_MAX_ITEMS = 100000  # a longer list or tuple is not looked into


def processing_parameter(frame, parameter_of):
    """(layer, name, count) of the parameter held in a local variable of the
    innermost frame, `frame` or one of its callers, that holds one: a
    parameter itself (count 1) or, where a frame holds none itself, the
    first of the parameters in a list or tuple of its locals (count: how
    many of its items are parameters, as a foreach optimizer passes them).
    `parameter_of(obj)` is (layer, name) for a registered parameter, else
    None. None where no frame holds one; never raises."""
    try:
        for _ in range(_MAX_FRAMES):
            if frame is None:
                return None
            listed = None
            for value in list(frame.f_locals.values()):
                found = parameter_of(value)
                if found is not None:
                    return found[0], found[1], 1
                if listed is None and isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
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
