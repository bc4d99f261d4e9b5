"""allocscope.torch's shared parts: the lock, one-line messages on stderr and
the kinds of the interposer's keyed tags."""

import sys
import threading

import allocscope as _allocscope

_lock = threading.RLock()

_said = set()


def _say(key, text):
    """One line on stderr, once per key."""
    if key in _said:
        return
    _said.add(key)
    rank = _allocscope.rank()
    prefix = "allocscope" if rank is None else "allocscope[rank %d]" % rank
    try:
        sys.stderr.write("%s: %s\n" % (prefix, text))
        sys.stderr.flush()
    except Exception:
        pass


# Kinds of the interposer's keyed tags (allocscope_enter in allocscope.h):
# a leave pops down to its own entry, whatever is above it.
_FORWARD = 1
_BACKWARD = 2
_OPTIMIZER = 3
_ANY_GENERATION = (1 << 64) - 1
