"""allocscope.torch's hook cost (ALLOCSCOPE_LOG=debug): each hook's calls
and average time, one line each at exit."""

from ._common import _say

_hook_cost = {}  # hook name -> [calls, ns]


def _timed(hook, is_compiling):
    """`hook`, timing its calls; the totals are printed at exit. Not while
    `is_compiling()`: inside a graph that Dynamo traces the hooks do nothing,
    and the timer is a call Dynamo cannot trace: a graph break at every
    module call inside a compiled block, so that ALLOCSCOPE_LOG=debug would
    change what the program compiles."""
    import atexit
    import time

    counter = time.perf_counter_ns
    cost = _hook_cost.setdefault(hook.__name__, [0, 0])
    if len(_hook_cost) == 1:
        atexit.register(_print_hook_cost)

    def timed_hook(*args):
        if is_compiling():
            return hook(*args)
        start = counter()
        try:
            return hook(*args)
        finally:
            cost[0] += 1
            cost[1] += counter() - start

    timed_hook.__name__ = hook.__name__
    return timed_hook


def _print_hook_cost():
    from . import _optimizer

    steps = _optimizer._steps
    total = 0
    for name, (calls, ns) in sorted(_hook_cost.items()):
        if not calls:
            continue
        total += ns
        _say(
            "cost " + name,
            "hook %s: %d calls, %d ns each on average (%d ms in all%s)"
            % (name.lstrip("_"), calls, ns // max(calls, 1), ns // 1000000,
               "; %d us a step" % (ns // steps // 1000) if steps else ""),
        )
    if steps and total:
        _say("cost hooks", "Python hooks: %d us a step over %d steps" % (total // steps // 1000, steps))
