#!/usr/bin/env python3
"""A model compiled with torch.compile(mode="reduce-overhead"): inductor's
CUDA graph trees run its forward and backward from a private memory pool.
Trains STEPS steps, then prints what torch's own snapshot counts in pools
other than the allocator's default one (this script makes none of its
own: they are the graphs'): the blocks in use and the segments' bytes, as

    GRAPH_POOLS active <bytes> in <blocks> blocks, reserved <bytes>

for a run under `allocscope run` to set its report's "CUDA graph pools"
line against. Needs a GPU.

    python3 tests/gpu/compiled_cudagraphs.py [--steps N] [--hidden H]
"""

import argparse

import torch
import torch.nn as nn


def graph_pool_usage():
    """(active bytes, active blocks, reserved bytes) in pools other than the
    default one, from torch.cuda.memory_snapshot()."""
    active = blocks = reserved = 0
    for segment in torch.cuda.memory_snapshot():
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        if pool in ((), (0, 0)):
            continue
        reserved += segment["total_size"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                active += block["size"]
                blocks += 1
    return active, blocks, reserved


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(77)
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(256, h, device="cuda")
    for step in range(args.steps):
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("step %d loss %.6f" % (step, loss.item()), flush=True)
    torch.cuda.synchronize()
    active, blocks, reserved = graph_pool_usage()
    print("GRAPH_POOLS active %d in %d blocks, reserved %d" % (active, blocks, reserved), flush=True)


if __name__ == "__main__":
    main()
