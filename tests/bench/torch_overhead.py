#!/usr/bin/env python3
"""Step-time overhead of allocscope on the PyTorch FSDP2 FP8 run, against
PyTorch's own memory history recording (the benchmark behind the overhead
table in docs/PERFORMANCE.md). Needs torch and 2 GPUs (--nproc 1: one).

    python3 tests/bench/torch_overhead.py --cli build-gpu/tools/allocscope \
        [--harness build-gpu/harness/allocscope-harness] [--steps 60] [--skip 10] [--repeat 2]
        [--concurrent [--bucket 2] [--contrast "A:B;..."]]  (side by side, paired by time)
        [--hidden H --tokens T]   (a larger, GPU-bound step; default: the proof's sizes)
        [--nproc N]               (ranks, default 2 as in the proof)

Runs tests/gpu/fsdp2_fp8_train.py --mode seed --time under torchrun (2 ranks)
for each configuration:
  plain               no recording
  allocscope/nostack  allocscope run --stack-depth 0 (tags, blocks, plugins, provenance live)
  allocscope          allocscope run: the defaults (24 native frames + Python frames,
                      plugins, provenance)
  allocscope/no-provenance  the same without the bridge's op observer (--no-provenance)
  allocscope/open-gate  the defaults with the observer on for every op
                      (ALLOCSCOPE_PROVENANCE_GATE=0: not only in parameter scopes)
  allocscope/depth16  allocscope run --stack-depth 16
  allocscope/ctypes-hooks  the same, ALLOCSCOPE_BRIDGE_HOOKS=0
  torch/python        _record_memory_history(stacks="python")
  torch/all           _record_memory_history(stacks="all")
  plain/control       plain again (added by --concurrent)
The step time of a run is the mean over steps >= --skip of the slower rank
(the rank with the larger median). Configurations interleave run by run, so
drifts of the machine hit all of them alike. The table gives each run's
mean, the mean over runs, its overhead against plain and a 95 % interval
for that overhead from a two-level bootstrap: runs resampled, and within a
run the means of consecutive blocks of --block steps (step times on a busy
host are correlated over a few steps; block means are close to
independent). An interval that excludes the target settles a claim; one
that straddles it says the runs are too few or too short. With --harness,
also the C++ harness (cuda backend) wall time with and without allocscope.

On a host whose speed drifts (the GPU machines' does, by tens of percent
over tens of seconds), runs one after another cannot resolve a few percent.
--concurrent runs the configurations of a round at the same time instead,
each pinned to its own share of the CPUs (the shares rotate between
rounds), on the same GPU(s): fair only while the step leaves the GPU mostly
idle, as the proof-sized step does. Steps are paired by when they ran: the
window in which every run was stepping is cut into --bucket-second buckets,
and a configuration's overhead is its mean step time over plain's in the
same buckets, with a 95 % interval from resampling rounds, then buckets
within them. The plain/control run shows what the method itself does to
the comparison.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "gpu", "fsdp2_fp8_train.py")
STEP = re.compile(r"^STEP_MS rank (\d+) step (\d+) ([0-9.]+)(?: ([0-9.]+))?$")


def torchrun(steps, size=(), nproc=2):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(nproc), SCRIPT, "--mode", "seed", "--steps", str(steps), "--time"] + list(size)


def timed_steps(output, skip, nproc):
    """(step time in ms, end of the step in wall-clock seconds or None) of
    steps >= skip, in order, of the slower rank."""
    per_rank = {}
    for line in output.splitlines():
        m = STEP.match(line.strip())
        if m and int(m.group(2)) >= skip:
            end = float(m.group(4)) if m.group(4) else None
            per_rank.setdefault(int(m.group(1)), []).append((float(m.group(3)), end))
    if len(per_rank) != nproc:
        raise RuntimeError("expected step times from %d ranks:\n%s" % (nproc, output[-2000:]))
    return max(per_rank.values(), key=lambda steps: statistics.median(ms for ms, _ in steps))


def rank_steps(output, skip, nproc):
    """The step times (steps >= skip, in order) of the slower rank."""
    return [ms for ms, _ in timed_steps(output, skip, nproc)]


def time_buckets(runs, bucket_s):
    """Pairs the steps of configurations that ran side by side.
    runs: {name: [(ms, end_s), ...]} from one round. The window all of them
    were stepping in is cut into buckets of bucket_s seconds; a step belongs
    to the bucket holding its midpoint. Returns one {name: mean step time
    (ms)} per bucket that holds steps of every configuration."""
    start = max(steps[0][1] - steps[0][0] / 1e3 for steps in runs.values())
    end = min(steps[-1][1] for steps in runs.values())
    count = int((end - start) // bucket_s)
    sums = [dict() for _ in range(count)]
    for name, steps in runs.items():
        for ms, t in steps:
            b = int((t - ms / 2e3 - start) // bucket_s)
            if 0 <= b < count:
                total, n = sums[b].get(name, (0.0, 0))
                sums[b][name] = (total + ms, n + 1)
    return [{name: total / n for name, (total, n) in b.items()} for b in sums
            if len(b) == len(runs)]


def paired_overhead(rounds, name, base, resamples=2000, seed=0):
    """(overhead, low, high): mean step time of `name` over that of `base`
    in the same time buckets, minus 1, and its 95 % bootstrap interval.
    rounds: one list of buckets (time_buckets) per round. The bootstrap
    draws rounds, then buckets within each drawn round: a run's own luck
    (the CPUs it got, what shared them) lasts a round, and only the rounds
    show how much it moves the result."""
    rounds = [r for r in rounds if r]

    def ratio(sample):
        return sum(b[name] for b in sample) / sum(b[base] for b in sample) - 1

    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        sample = []
        for _ in rounds:
            drawn = rounds[rng.randrange(len(rounds))]
            sample.extend(rng.choice(drawn) for _ in drawn)
        ratios.append(ratio(sample))
    ratios.sort()
    every = [b for r in rounds for b in r]
    return ratio(every), ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def block_means(steps, block):
    """Means of consecutive blocks of `block` steps (a short last block is
    dropped unless it is the only one)."""
    blocks = [steps[i:i + block] for i in range(0, len(steps), block)]
    if len(blocks) > 1 and len(blocks[-1]) < block:
        blocks.pop()
    return [statistics.fmean(b) for b in blocks]


def paired_runs_overhead(runs, base_runs, block, resamples=2000, seed=0):
    """(overhead, low, high): the mean step time of `runs` over that of
    `base_runs`, minus 1, and its 95 % bootstrap interval. Run i of each
    ran in the same round (one after the other), so rounds are drawn
    together for both sides, then each drawn run's block means."""
    a = [block_means(r, block) for r in runs]
    b = [block_means(r, block) for r in base_runs]
    if len(a) != len(b):
        raise ValueError("runs and base_runs come from different numbers of rounds")

    def mean(per_run):
        return statistics.fmean(statistics.fmean(m) for m in per_run)

    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = [rng.randrange(len(a)) for _ in a]
        sa = [[rng.choice(a[i]) for _ in a[i]] for i in drawn]
        sb = [[rng.choice(b[i]) for _ in b[i]] for i in drawn]
        ratios.append(mean(sa) / mean(sb) - 1)
    ratios.sort()
    return mean(a) / mean(b) - 1, ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


class Run:
    """One command in its own process group, its output in a file (a pipe
    nobody reads while other runs are waited for would fill and stop it)."""

    def __init__(self, name, cmd, env, cpus=None, scratch=None):
        self.name = name
        self.cmd = cmd
        self.out = tempfile.TemporaryFile(mode="w+", dir=scratch)
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT, universal_newlines=True,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def output(self):
        self.out.seek(0)
        return self.out.read()

    def failure(self):
        """None while running or after a clean exit; else what went wrong."""
        rc = self.proc.poll()
        if rc is None or rc == 0:
            return None
        return "%s exited %d:\n%s" % (self.name, rc, self.output()[-3000:])

    def stop(self):
        """Ends the run and every process it started (a launcher's ranks
        would otherwise go on)."""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                try:  # the leader is gone; its group may not be
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        self.out.close()


def wait_all(runs, timeout):
    """Waits for every run; on the first failure (or the timeout) stops
    the others and raises with that run's exit status and output."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            for r in runs:
                failure = r.failure()
                if failure:
                    raise RuntimeError(failure)
            if all(r.proc.poll() == 0 for r in runs):
                return [r.output() for r in runs]
            if time.monotonic() > deadline:
                raise RuntimeError("runs still going after %d s: %s" % (
                    timeout, ", ".join(r.name for r in runs if r.proc.poll() is None)))
            time.sleep(0.2)
    finally:
        for r in runs:
            r.stop()


def run(cmd, env, name=None, timeout=600):
    return wait_all([Run(name or " ".join(cmd), cmd, env)], timeout)[0]


def cpu_shares(cpus, count, rep):
    """Disjoint CPU sets for `count` runs side by side, the same size for
    each; round `rep` rotates which run gets which set. None (no pinning)
    when there are fewer CPUs than runs."""
    if count > len(cpus):
        return None
    share = len(cpus) // count
    sets = [set(cpus[i * share:(i + 1) * share]) for i in range(count)]
    k = rep % count
    return sets[k:] + sets[:k]


def overhead_table(columns, configs, values, overhead, difference=None):
    """A Markdown table: per configuration its `values` (ms, one per round)
    and, but for plain, difference(name) in ms when given, then
    overhead(name) = (estimate, low, high) against plain."""
    header = ["configuration"] + columns + ["overhead", "95 % interval"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for name, _, _ in configs:
        cells = [name, ", ".join("%.1f" % v for v in values[name])]
        if name == "plain":
            cells += ["—"] * (len(header) - 2)
        else:
            if difference:
                cells.append("%+.2f" % difference(name))
            est, low, high = overhead(name)
            cells += ["%+.1f %%" % (est * 100), "%+.1f %% to %+.1f %%" % (low * 100, high * 100)]
        print("| " + " | ".join(cells) + " |")


def concurrent(args, configs, command, env):
    """--concurrent: per round, every configuration at once, each pinned to
    its own share of this process's CPUs (the shares rotate from round to
    round); then one table of overheads paired by time."""
    cpus = sorted(os.sched_getaffinity(0))
    rounds = []  # per round, its buckets
    means = {}
    for rep in range(args.repeat):
        shares = cpu_shares(cpus, len(configs), rep)
        if rep == 0:
            print("%d runs side by side on %d CPUs: %s" % (
                len(configs), len(cpus), "%d CPUs each" % len(shares[0]) if shares
                else "not pinned (fewer CPUs than runs)"), flush=True)
        runs_now = [Run(name, command(name, prefix), dict(env, **extra),
                        shares[i] if shares else None)
                    for i, (name, extra, prefix) in enumerate(configs)]
        outputs = wait_all(runs_now, 900)
        runs = {}
        for (name, _, _), output in zip(configs, outputs):
            runs[name] = timed_steps(output, args.skip, args.nproc)
            if any(end is None for _, end in runs[name]):
                raise RuntimeError("%s: the script prints no step end times" % name)
        round_buckets = time_buckets(runs, args.bucket)
        if not round_buckets:
            print("round %d: the runs never stepped at the same time; the round is left out"
                  % rep, flush=True)
            continue
        rounds.append(round_buckets)
        for name, _, _ in configs:
            m = statistics.fmean(b[name] for b in round_buckets)
            means.setdefault(name, []).append(m)
            print("round %d %-24s %.3f ms/step in %d shared buckets"
                  % (rep, name, m, len(round_buckets)), flush=True)
    buckets = [b for r in rounds for b in r]
    if not buckets:
        raise RuntimeError("the runs never stepped at the same time: more --steps")
    print("\n%d rounds side by side, %d steps each (steps >= %d), %d buckets of %.1f s"
          % (len(rounds), args.steps, args.skip, len(buckets), args.bucket))
    if len(rounds) < 5:
        print("(fewer than 5 rounds: the intervals understate how much rounds differ)")
    overhead_table(["mean step per round (ms)", "difference, paired by time (ms)"], configs,
                   means, lambda name: paired_overhead(rounds, name, "plain"),
                   lambda name: statistics.fmean(b[name] - b["plain"] for b in buckets))
    names = {name for name, _, _ in configs}
    for pair in filter(None, args.contrast.split(";")):
        a, _, b = pair.partition(":")
        if a in names and b in names:
            est, low, high = paired_overhead(rounds, a, b)
            diff = statistics.fmean(x[a] - x[b] for x in buckets)
            print("%s against %s: %+.2f ms, %+.1f %% (95 %% interval %+.1f %% to %+.1f %%)"
                  % (a, b, diff, est * 100, low * 100, high * 100))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rounds, "mean_ms": means}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cli-base", help="a second build's allocscope CLI: the configuration "
                    "allocscope/base runs its defaults beside the others (before and after a change)")
    ap.add_argument("--harness")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--block", type=int, default=10,
                    help="steps per block for the bootstrap (default 10)")
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
    ap.add_argument("--concurrent", action="store_true",
                    help="run the configurations of a round side by side (each on its own "
                         "CPUs, one GPU) and compare their steps in the same time buckets; "
                         "adds a second plain run as a control")
    ap.add_argument("--bucket", type=float, default=2.0,
                    help="with --concurrent: seconds per time bucket (default 2)")
    ap.add_argument("--contrast", default="torch/python:allocscope;torch/all:allocscope",
                    help="with --concurrent: also these pairs A:B, A against B in the same "
                         "buckets, separated by ';' (pairs not run are left out)")
    args = ap.parse_args()
    if args.steps <= args.skip:
        ap.error("--steps must be more than --skip (%d)" % args.skip)
    if args.block < 1 or args.repeat < 1 or args.bucket <= 0:
        ap.error("--block and --repeat must be at least 1, --bucket more than 0")
    if args.concurrent and args.harness:
        ap.error("--harness runs one after another: leave out --concurrent")

    size = []
    if args.hidden:
        size += ["--hidden", str(args.hidden)]
    if args.tokens:
        size += ["--tokens", str(args.tokens)]
    # made once the arguments are known to be good
    scratch = os.path.join(tempfile.gettempdir(), "allocscope-overhead-%d" % os.getpid())
    env = dict(os.environ)
    def under(out, *flags):
        return [args.cli, "run", "--force", "--out", os.path.join(scratch, out)] + list(flags) + ["--"]

    # (name, extra environment, command prefix; None: torch's own recording)
    configs = [
        ("plain", {}, []),
        # with --concurrent: a second plain run, whose "overhead" shows what
        # running side by side alone does to the comparison
        ("plain/control", {}, []),
        ("allocscope/nostack", {}, under("a0", "--stack-depth", "0")),
        ("allocscope", {}, under("a1")),
        # without the bridge's op observer (provenance of weight-derived tensors)
        ("allocscope/no-provenance", {}, under("anp", "--no-provenance")),
        # the observer in every step, not the default's first 4 and 2 in every 100
        ("allocscope/every-step", {}, under("aes", "--provenance-steps", "all")),
        # the observer not gated to the parameters' scopes
        ("allocscope/open-gate", {"ALLOCSCOPE_PROVENANCE_GATE": "0"}, under("aog")),
        # 16 native frames instead of 24 (the Python frames follow either way)
        ("allocscope/depth16", {}, under("a16", "--stack-depth", "16")),
        # the module hooks through ctypes and Python tensor hooks, not the bridge's
        ("allocscope/ctypes-hooks", {"ALLOCSCOPE_BRIDGE_HOOKS": "0"}, under("a2")),
        ("torch/python", {}, None),
        ("torch/all", {}, None),
    ]
    if args.cli_base:
        configs.insert(4, ("allocscope/base", {},
                           [args.cli_base, "run", "--force", "--out", os.path.join(scratch, "base"), "--"]))
    all_configs = list(configs)
    if args.breakdown and args.no_baselines:
        configs = configs[:1]
    if args.breakdown:
        configs += [
            # no allocscope, global module hooks that do nothing (registered as
            # allocscope.torch registers its own): PyTorch's hooked module call
            ("plain + no-op module hooks", {"FSDP2_FP8_NOOP_MODULE_HOOKS": "1"}, []),
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
            ("+ shim, bridge", {}, under("b1", "--no-provenance", "--plugins", "none", "--stack-depth", "0")),
            # the shim's hooks, no blocks: the bridge not attached to the allocator
            ("+ shim, no blocks", {"ALLOCSCOPE_TORCH_BLOCKS": "0"},
             under("b11", "--no-provenance", "--plugins", "none", "--stack-depth", "0")),
            # the bridge's blocks, no module hooks (steps only, no layer tags)
            ("+ bridge, no module hooks", {"ALLOCSCOPE_PYTHON_MODULES": "0"},
             under("b12", "--no-provenance", "--plugins", "none", "--stack-depth", "0")),
            # the same without the backward tensor hooks
            ("+ shim w/o backward hooks", {"ALLOCSCOPE_PYTHON_BACKWARD": "0"},
             under("b2", "--no-provenance", "--plugins", "none", "--stack-depth", "0")),
            # + native stacks, no Python frames
            ("+ native stacks", {"ALLOCSCOPE_PYTHON_STACKS": "0"},
             under("b3", "--no-provenance", "--plugins", "none")),
            # + Python frames
            ("+ python frames", {}, under("b4", "--no-provenance", "--plugins", "none")),
            # + the plugins: allocscope/no-provenance; + provenance: allocscope
        ]
    known = {c[0] for c in configs} | {c[0] for c in all_configs}
    if args.only:
        wanted = set(filter(None, args.only.split(";")))
        unknown = sorted(wanted - {c[0] for c in configs})
        if unknown:
            ap.error("--only: no configuration %s (known%s: %s)" % (
                ", ".join(repr(u) for u in unknown), "" if args.breakdown else
                " without --breakdown", "; ".join(c[0] for c in configs)))
        configs = [c for c in configs if c[0] in wanted or c[0] == "plain"]
    for pair in filter(None, args.contrast.split(";")):
        a, sep, b = pair.partition(":")
        if not sep or a not in known or b not in known:
            ap.error("--contrast: %r is not A:B of two configuration names" % pair)
    if args.concurrent:
        if not any(c[0] == "plain/control" for c in configs):
            configs.insert(1, next(c for c in all_configs if c[0] == "plain/control"))
    else:
        configs = [c for c in configs if c[0] != "plain/control" or args.only]

    os.makedirs(scratch)

    def command(name, prefix):
        if prefix is None:
            return torchrun(args.steps, size, args.nproc) + ["--record-history",
                                                             name.split("/")[1]]
        return prefix + torchrun(args.steps, size, args.nproc)

    if args.concurrent:
        try:
            concurrent(args, configs, command, env)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    results = {}  # name -> each run's mean step time
    samples = {}  # name -> each run's step times
    try:
        for rep in range(args.repeat):
            k = rep % len(configs)  # each configuration takes each place in turn
            for name, extra, prefix in configs[k:] + configs[:k]:
                steps = rank_steps(run(command(name, prefix), dict(env, **extra), name),
                                   args.skip, args.nproc)
                samples.setdefault(name, []).append(steps)
                results.setdefault(name, []).append(statistics.fmean(steps))
                print("%-20s run %d: mean %.3f ms/step, median %.3f, first 10 steps %.3f, "
                      "last 10 %.3f" % (name, rep, statistics.fmean(steps),
                                        statistics.median(steps), statistics.fmean(steps[:10]),
                                        statistics.fmean(steps[-10:])), flush=True)
        print("\n%d runs of %d steps per configuration (steps >= %d counted, blocks of %d)"
              % (args.repeat, args.steps, args.skip, args.block))
        if args.repeat < 5:
            print("(fewer than 5 runs each: the intervals understate how much runs differ)")
        overhead_table(["runs, mean step (ms)"], configs, results,
                       lambda name: paired_runs_overhead(samples[name], samples["plain"],
                                                         args.block))
        output = {"mean_ms": results, "step_ms": samples}

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
                    run(cmd, env, name)
                    walls[name].append(time.perf_counter() - start)
            hb = statistics.median(walls["harness plain"])
            for name, v in walls.items():
                t = statistics.median(v)
                print("| %s (200 steps, wall) | %.3f s | %+.1f %% |" % (name, t, (t / hb - 1) * 100))
            output["harness_wall_s"] = walls
        if args.json:
            with open(args.json, "w") as f:
                json.dump(output, f)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
