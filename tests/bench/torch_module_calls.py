#!/usr/bin/env python3
"""What a module call costs the host with global module hooks, and what the
step hook's allocator counters cost: the parts of allocscope's Python-side
cost that a training step cannot separate from its own work.

    python3 tests/bench/torch_module_calls.py plain
    build-gpu/tools/allocscope run --force --out OUT -- \\
        python3 tests/bench/torch_module_calls.py allocscope

Times, per module call (20 nn.Identity in an nn.Sequential, called on a
CPU tensor, best of 7 rounds):

  plain         no hooks (torch's fast path); then a no-op global forward
                pre-hook; then also a no-op global forward hook
                (always_call, as allocscope's): torch's slow path for
                modules with hooks plus the calls; then, no hooks, a Python
                wrapper of Module.__call__ (what tagging modules without
                hooks would cost instead)
  allocscope    allocscope's own hooks (the process must run under
                `allocscope run`)

and, with CUDA: torch.cuda.mem_get_info, torch.cuda.memory_stats and, under
allocscope, the optimizer step hook's allocator counters
(allocscope.torch._optimizer._allocator_counters, through the bridge) and
allocscope.step.
"""

import sys
import time

import torch
import torch.nn as nn


def best_ns(run, calls, rounds=7):
    """The fastest of `rounds` timings of run(calls), per call."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        run(calls)
        out.append((time.perf_counter() - start) / calls * 1e9)
    return round(min(out))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("plain", "allocscope"):
        sys.exit("usage: torch_module_calls.py plain|allocscope")
    mode = sys.argv[1]
    chain = nn.Sequential(*[nn.Identity() for _ in range(20)])
    x = torch.zeros(1)

    def module_calls(n):
        for _ in range(n // 20):
            chain(x)

    n = 40000
    print("torch %s, %s" % (torch.__version__, mode))
    print("module call, ns: %d" % best_ns(module_calls, n))
    if mode == "plain":
        from torch.nn.modules import module as nn_module

        pre = nn_module.register_module_forward_pre_hook(lambda m, a: None)
        print("  with a no-op global pre-hook: %d" % best_ns(module_calls, n))
        try:
            post = nn_module.register_module_forward_hook(lambda m, a, o: None, always_call=True)
        except TypeError:  # torch < 2.0: no always_call
            post = nn_module.register_module_forward_hook(lambda m, a, o: None)
        print("  with no-op global pre- and post-hooks: %d" % best_ns(module_calls, n))
        pre.remove()
        post.remove()
        call = nn.Module.__call__

        def wrapped(self, *args, **kwargs):
            return call(self, *args, **kwargs)

        nn.Module.__call__ = wrapped
        print("  no hooks, Module.__call__ wrapped in Python: %d" % best_ns(module_calls, n))
        nn.Module.__call__ = call
    if not torch.cuda.is_available():
        return
    torch.cuda.init()
    torch.zeros(1024, device="cuda")
    print("torch.cuda.mem_get_info, ns: %d" % best_ns(lambda k: [torch.cuda.mem_get_info() for _ in range(k)], 2000))
    print("torch.cuda.memory_stats, ns: %d" % best_ns(lambda k: [torch.cuda.memory_stats() for _ in range(k)], 2000))
    if mode == "allocscope":
        import allocscope
        from allocscope.torch import _optimizer

        print("step hook's allocator counters, ns: %d"
              % best_ns(lambda k: [_optimizer._allocator_counters() for _ in range(k)], 2000))
        print("allocscope.step, ns: %d" % best_ns(lambda k: [allocscope.step(1) for _ in range(k)], 2000))


if __name__ == "__main__":
    main()
