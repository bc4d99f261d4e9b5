"""allocscope.torch's hook cost (ALLOCSCOPE_LOG=debug): each hook's calls
and average time, one line each at exit."""

from ._common import _say

_hook_cost = {}  # hook name -> [calls, ns]


def _timed(hook):
    """`hook`, timing its calls; the totals are printed at exit."""
    import atexit
    import time

    counter = time.perf_counter_ns
    cost = _hook_cost.setdefault(hook.__name__, [0, 0])
    if len(_hook_cost) == 1:
        atexit.register(_print_hook_cost)

    def timed_hook(*args):
        start = counter()
        try:
            return hook(*args)
        finally:
            cost[0] += 1
            cost[1] += counter() - start

    timed_hook.__name__ = hook.__name__
    return timed_hook


def _print_hook_cost():
    for name, (calls, ns) in sorted(_hook_cost.items()):
        if not calls:
            continue
        _say(
            "cost " + name,
            "hook %s: %d calls, %d ns each on average (%d ms in all)"
            % (name.lstrip("_"), calls, ns // max(calls, 1), ns // 1000000),
        )
