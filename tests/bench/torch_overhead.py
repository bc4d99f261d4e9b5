#!/usr/bin/env python3
"""Step-time overhead of allocscope on the PyTorch FSDP2 FP8 run, against
PyTorch's own memory history recording (the benchmark behind the overhead
table in docs/RESULTS.md). Needs torch and 2 GPUs (--nproc 1: one).

    python3 tests/bench/torch_overhead.py --cli build-gpu/tools/allocscope \
        [--harness build-gpu/harness/allocscope-harness] [--steps 60] [--skip 10] [--repeat 2]
        [--hidden H --tokens T]   (a larger, GPU-bound step; default: the proof's sizes)
        [--nproc N]               (ranks, default 2 as in the proof)

Runs tests/gpu/fsdp2_fp8_train.py --mode seed --time under torchrun (2 ranks)
for each configuration:
  plain               no recording
  allocscope/nostack  allocscope run --stack-depth 0 (tags, blocks, plugins live)
  allocscope          allocscope run (24 native frames + Python frames)
  allocscope/depth16  allocscope run --stack-depth 16
  allocscope/ctypes-hooks  the same, ALLOCSCOPE_BRIDGE_HOOKS=0
  torch/python        _record_memory_history(stacks="python")
  torch/all           _record_memory_history(stacks="all")
The step time of a run is the median over steps >= --skip of the slower
rank; a configuration's is the median over --repeat runs (configurations
interleave, so drifts of the machine hit all of them alike); the table also
gives the fastest run of each and the median of the runs' 10th-percentile
steps, the figures least disturbed by other load on the host. With --harness,
also the C++ harness (cuda backend, 2 ranks) wall time with and without
allocscope.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "gpu", "fsdp2_fp8_train.py")
STEP = re.compile(r"^STEP_MS rank (\d+) step (\d+) ([0-9.]+)$")


def torchrun(steps, size=(), nproc=2):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(nproc), SCRIPT, "--mode", "seed", "--steps", str(steps), "--time"] + list(size)


def p10(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 10]


def step_ms(output, skip, nproc):
    """(median step time of the slower rank, its first-10 and last-10
    medians, its 10th percentile)."""
    per_rank = {}
    for line in output.splitlines():
        m = STEP.match(line.strip())
        if m and int(m.group(2)) >= skip:
            per_rank.setdefault(int(m.group(1)), []).append(float(m.group(3)))
    if len(per_rank) != nproc:
        raise RuntimeError("expected step times from %d ranks:\n%s" % (nproc, output[-2000:]))
    slow = max(per_rank.values(), key=statistics.median)
    return (statistics.median(slow), statistics.median(slow[:10]), statistics.median(slow[-10:]),
            p10(slow))


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--harness")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hidden", type=int, help="the script's --hidden (default: the proof's)")
    ap.add_argument("--tokens", type=int, help="the script's --tokens (default: the proof's)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs), default 2")
    ap.add_argument("--json")
    ap.add_argument("--breakdown", action="store_true",
                    help="also the interposer alone, + shim and bridge, + stacks, one at a time")
    ap.add_argument("--only", help="configuration names to run, separated by ';' (plain is the base)")
    ap.add_argument("--no-baselines", action="store_true",
                    help="with --breakdown: only plain and the breakdown")
    args = ap.parse_args()

    size = []
    if args.hidden:
        size += ["--hidden", str(args.hidden)]
    if args.tokens:
        size += ["--tokens", str(args.tokens)]
    scratch = tempfile.mkdtemp(prefix="allocscope-overhead-")
    env = dict(os.environ)
    def under(out, *flags):
        return [args.cli, "run", "--force", "--out", os.path.join(scratch, out)] + list(flags) + ["--"]

    # (name, extra environment, command prefix; None: torch's own recording)
    configs = [
        ("plain", {}, []),
        ("allocscope/nostack", {}, under("a0", "--stack-depth", "0")),
        ("allocscope", {}, under("a1")),
        # 16 native frames instead of 24 (the Python frames follow either way)
        ("allocscope/depth16", {}, under("a16", "--stack-depth", "16")),
        # the module hooks through ctypes and Python tensor hooks, not the bridge's
        ("allocscope/ctypes-hooks", {"ALLOCSCOPE_BRIDGE_HOOKS": "0"}, under("a2")),
        ("torch/python", {}, None),
        ("torch/all", {}, None),
    ]
    if args.breakdown and args.no_baselines:
        configs = configs[:1]
    if args.breakdown:
        configs += [
            # the library preloaded with recording off: what loading it costs
            ("preloaded, off", {"ALLOCSCOPE_DISABLE": "1"},
             under("b00", "--no-python", "--plugins", "none", "--stack-depth", "0")),
            # the interposer alone: segments only, no Python shim, no bridge, no plugins
            ("interposer only", {}, under("b0", "--no-python", "--plugins", "none",
                                          "--stack-depth", "0")),
            # the same without the driver-level hooks
            ("interposer only, no driver hooks", {"ALLOCSCOPE_DRIVER_HOOKS": "0"},
             under("b01", "--no-python", "--plugins", "none", "--stack-depth", "0")),
            # + the shim's module hooks and the bridge's blocks
            ("+ shim, bridge", {}, under("b1", "--plugins", "none", "--stack-depth", "0")),
            # the same without the backward tensor hooks
            ("+ shim w/o backward hooks", {"ALLOCSCOPE_PYTHON_BACKWARD": "0"},
             under("b2", "--plugins", "none", "--stack-depth", "0")),
            # + native stacks, no Python frames
            ("+ native stacks", {"ALLOCSCOPE_PYTHON_STACKS": "0"},
             under("b3", "--plugins", "none")),
            # + Python frames
            ("+ python frames", {}, under("b4", "--plugins", "none")),
        ]
    if args.only:
        wanted = set(args.only.split(";"))
        configs = [c for c in configs if c[0] in wanted or c[0] == "plain"]
    results = {}
    fast_steps = {}  # name -> each run's 10th-percentile step time
    try:
        for rep in range(args.repeat):
            for name, extra, prefix in configs:
                if prefix is None:
                    cmd = torchrun(args.steps, size, args.nproc) + ["--record-history",
                                                                    name.split("/")[1]]
                else:
                    cmd = prefix + torchrun(args.steps, size, args.nproc)
                median, first, last, fast = step_ms(run(cmd, dict(env, **extra)), args.skip,
                                                    args.nproc)
                results.setdefault(name, []).append(median)
                fast_steps.setdefault(name, []).append(fast)
                print("%-20s run %d: %.3f ms/step (first 10 steps %.3f, last 10 %.3f, "
                      "10th percentile %.3f)" % (name, rep, median, first, last, fast), flush=True)
        base = statistics.median(results["plain"])
        fastest = min(results["plain"])
        base_p10 = statistics.median(fast_steps["plain"])
        print("\n| configuration | step time (ms, median of runs) | overhead | fastest run (ms) "
              "| overhead | 10th-percentile step (ms, median of runs) | overhead |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, _, _ in configs:
            t = statistics.median(results[name])
            f = min(results[name])
            q = statistics.median(fast_steps[name])
            print("| %s | %.3f | %+.1f %% | %.3f | %+.1f %% | %.3f | %+.1f %% |"
                  % (name, t, (t / base - 1) * 100, f, (f / fastest - 1) * 100,
                     q, (q / base_p10 - 1) * 100))

        if args.harness:
            harness = [args.harness, "--backend", "cuda", "--ranks", str(args.nproc), "--steps", "200",
                       "--warmup", "2"]
            walls = {"harness plain": [], "harness allocscope": []}
            for rep in range(args.repeat):
                for name, cmd in (("harness plain", harness),
                                  ("harness allocscope", [args.cli, "run", "--force", "--out",
                                                          os.path.join(scratch, "h"), "--"] +
                                   harness)):
                    start = time.perf_counter()
                    run(cmd, env)
                    walls[name].append(time.perf_counter() - start)
            hb = statistics.median(walls["harness plain"])
            for name, v in walls.items():
                t = statistics.median(v)
                print("| %s (200 steps, wall) | %.3f s | %+.1f %% |" % (name, t, (t / hb - 1) * 100))
            results.update(walls)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
