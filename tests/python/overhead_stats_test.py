#!/usr/bin/env python3
"""The statistics of tests/bench/torch_overhead.py, which the overhead
tables in docs/PERFORMANCE.md rest on, on step times whose answer is known:

    python3 tests/python/run_pytest.py tests/python/overhead_stats_test.py

(meson test overhead_stats).

No torch and no GPU: the side-by-side driver runs small Python programs that
print the training script's STEP_MS lines with sleeps of known length.
"""

import json
import os
import random
import statistics
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import torch_overhead as bench  # noqa: E402


def drifting_runs(factors, steps=600, seed=1, start=1000.0):
    """Runs side by side: every run's steps are slowed by the same drift
    (the host's phase at that moment: 60, 84 or 108 ms a step, changing
    every 3 s), then by the run's own factor and its own noise; each run
    starts a little later than the one before. {name: [(ms, end_s)]}"""
    rng = random.Random(seed)
    runs = {}
    for k, (name, factor) in enumerate(factors.items()):
        t = start + 0.05 * k
        out = []
        for i in range(steps):
            phase = 60.0 * (1 + 0.4 * ((int(t - start) // 3) % 3))
            ms = phase * factor * (1 + rng.gauss(0, 0.05))
            t += ms / 1e3
            out.append((ms, t))
        runs[name] = out
    return runs


def test_step_lines_are_read_per_rank_from_skip_on():
    out = "\n".join([
        "STEP_MS rank 0 step 0 100.0 10.0",
        "STEP_MS rank 1 step 0 120.0 10.1",
        "noise STEP_MS rank 0 step 1 1.0",
        "STEP_MS rank 0 step 1 50.0 10.2",
        "STEP_MS rank 1 step 1 70.0 10.3",
        "STEP_MS rank 0 step 2 60.5",  # an older script: no end time
        "STEP_MS rank 1 step 2 80.0",
    ])
    steps = bench.timed_steps(out, 1, 2)
    assert steps == [(70.0, 10.3), (80.0, None)], "the slower rank's steps from --skip on"
    assert bench.rank_steps(out, 0, 2) == [120.0, 70.0, 80.0], "step times without end times"
    with pytest.raises(RuntimeError) as e:  # a missing rank is noticed
        bench.timed_steps(out, 0, 3)
    assert "3 ranks" in str(e.value), "a missing rank is an error naming the ranks"


def test_buckets_cover_only_the_window_both_runs_stepped_in():
    runs = {
        # steps of 100 ms ending at 0.1, 0.2, ... 2.0 s
        "plain": [(100.0, 0.1 * (i + 1)) for i in range(20)],
        # 200 ms steps, starting 0.5 s later, ending at 0.7 ... 2.5 s
        "slow": [(200.0, 0.5 + 0.2 * (i + 1)) for i in range(10)],
    }
    buckets = bench.time_buckets(runs, 0.4)
    # shared window 0.5 s .. 2.0 s: three whole 0.4-s buckets
    assert len(buckets) == 3, "buckets cover only the window both runs stepped in"
    assert all(b == {"plain": 100.0, "slow": 200.0} for b in buckets), "each bucket's mean step"
    est, low, high = bench.paired_overhead([buckets], "slow", "plain")
    assert abs(est - 1.0) < 1e-9 and abs(low - 1.0) < 1e-9 and abs(high - 1.0) < 1e-9, (
        "a constant +100 % is +100 % with no spread"
    )


def test_the_paired_overhead_holds_under_host_drift():
    runs = drifting_runs({"plain": 1.0, "control": 1.0, "slower": 1.05})
    buckets = bench.time_buckets(runs, 2.0)
    est, low, high = bench.paired_overhead([buckets], "slower", "plain")
    assert abs(est - 0.05) < 0.01 and low < 0.05 < high and low > 0.0, (
        "+5 %% under a drift of +80 %%: %.3f (%.3f to %.3f)" % (est, low, high)
    )
    est, low, high = bench.paired_overhead([buckets], "control", "plain")
    assert low < 0.0 < high and abs(est) < 0.01, (
        "the control's interval holds 0: %.3f (%.3f to %.3f)" % (est, low, high)
    )


def test_rounds_that_disagree_give_an_interval_spanning_both():
    # The same comparison in three rounds: +10 % in one, 0 % in the others
    # (what a run's placement can do). Pooled buckets would give a narrow
    # interval around +3 %; drawing rounds must show the disagreement.
    rounds = []
    for shift in (1.10, 1.0, 1.0):
        rounds.append([{"plain": 60.0 + i % 3, "other": (60.0 + i % 3) * shift}
                       for i in range(12)])
    est, low, high = bench.paired_overhead(rounds, "other", "plain")
    assert abs(est - 0.0333) < 0.001, "the estimate pools every bucket: %.4f" % est
    assert low < 0.001 and high > 0.099, (
        "rounds that disagree give an interval spanning both: %.3f to %.3f" % (low, high)
    )


def test_sequential_runs_give_an_interval_around_the_overhead():
    rng = random.Random(3)
    base = [[60 * (1 + rng.gauss(0, 0.05)) for _ in range(200)] for _ in range(4)]
    slower = [[66 * (1 + rng.gauss(0, 0.05)) for _ in range(200)] for _ in range(4)]
    est, low, high = bench.paired_runs_overhead(slower, base, 10)
    assert abs(est - 0.10) < 0.01 and low < 0.10 < high and low > 0.05, (
        "sequential runs: +10 %% as %.3f, inside %.3f to %.3f" % (est, low, high)
    )
    # Rounds in which the host was slow for both runs: pairing the rounds
    # keeps the host's drift out of the interval.
    phases = [1.0, 1.4, 0.8, 1.2, 1.0]
    base = [[60 * p * (1 + rng.gauss(0, 0.02)) for _ in range(100)] for p in phases]
    slower = [[63 * p * (1 + rng.gauss(0, 0.02)) for _ in range(100)] for p in phases]
    est, low, high = bench.paired_runs_overhead(slower, base, 10)
    assert 0.02 < low < 0.05 < high < 0.08, (
        "+5 %% under drift between rounds: %.3f, %.3f to %.3f" % (est, low, high)
    )
    assert bench.block_means([1, 2, 3, 4, 5], 2) == [1.5, 3.5], "block means drop a short tail"
    assert bench.block_means([1, 2, 3], 5) == [2], "a single short block is kept"


def test_a_known_spread_gives_an_interval_of_its_width():
    # Buckets whose ratio is 1.0 or 1.2 at random: the estimate's spread is
    # known (binomial), so the interval must be about as wide as 95 % of it.
    rng = random.Random(5)
    buckets = [{"plain": 100.0, "x": 100.0 * (1.2 if rng.random() < 0.5 else 1.0)}
               for _ in range(400)]
    est, low, high = bench.paired_overhead([buckets], "x", "plain")
    # mean ratio p*0.2 with p ~ 0.5: sd of p over 400 buckets = 0.025, so
    # the 95 % interval of the overhead is about ±0.0098 around the estimate
    assert 0.015 < high - low < 0.025 and low < est < high, (
        "a known spread gives an interval of its width: %.4f to %.4f" % (low, high)
    )


# A stand-in for the training script: steps of 20 ms of sleep that report
# 20 ms times the factor (the time a step reports is the stand-in's to
# choose, so the driver's arithmetic is checked exactly on a loaded machine
# too; the end times are real, so the runs' buckets are), and 2 KB of other
# output per step (160 KB for 80 steps: more than a pipe holds, so a driver
# that read the runs one at a time through pipes would stall the others).
FAKE = r'''
import os, sys, time
factor = float(sys.argv[1]) * float(os.environ.get("FAKE_FACTOR", "1"))
for step in range(int(sys.argv[2])):
    time.sleep(0.02)
    print("log " * 500, flush=True)
    print("STEP_MS rank 0 step %d %.3f %.6f" % (step, 20.0 * factor, time.time()), flush=True)
'''


def test_the_side_by_side_driver_measures_known_overheads():
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "fake_step.py")
        with open(fake, "w") as f:
            f.write(FAKE)
        factors = {"plain": 1.0, "plain/control": 1.0, "half again": 1.5}
        # 160 steps of 20 ms: runs overlap for seconds even when a loaded
        # machine starts them a second apart.
        args = type("Args", (), dict(repeat=2, skip=3, nproc=1, bucket=0.5, steps=160,
                                     contrast="half again:plain/control",
                                     json=os.path.join(tmp, "out.json")))()
        configs = [(name, {}, []) for name in factors]
        bench.concurrent(args, configs,
                         lambda name, prefix: [sys.executable, fake, str(factors[name]), "160"],
                         dict(os.environ))
        with open(args.json) as f:
            data = json.load(f)
        rounds = data["rounds"]
        assert len(rounds) == 2 and all(len(r) >= 2 for r in rounds), (
            "shared buckets in each of 2 rounds: %s" % [len(r) for r in rounds]
        )
        est, _, _ = bench.paired_overhead(rounds, "half again", "plain")
        assert abs(est - 0.5) < 1e-6, "the slower program: %+.4f (want +0.5)" % est
        est, _, _ = bench.paired_overhead(rounds, "plain/control", "plain")
        assert abs(est) < 1e-6, "the control: %+.4f" % est
        assert len(data["mean_ms"]["plain"]) == 2, "one mean per round"


def test_a_failed_run_stops_every_side_by_side_run():
    args = type("Args", (), dict(repeat=1, skip=0, nproc=1, bucket=0.5, steps=5, contrast="",
                                 json=None))()
    with tempfile.TemporaryDirectory() as tmp:
        pid_file = os.path.join(tmp, "grandchild")
        # The run that waits comes first and has started a process of its
        # own, as a launcher starts its ranks.
        waits = ("import subprocess, sys, time\n"
                 "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                 "open(%r, 'w').write(str(p.pid))\n"
                 "time.sleep(120)\n" % pid_file)
        commands = {
            "waits": [sys.executable, "-c", waits],
            "plain": [sys.executable, "-c",
                      "import sys, time; time.sleep(1); print('boom'); sys.exit(3)"],
        }
        configs = [(name, {}, []) for name in commands]
        start = time.monotonic()
        with pytest.raises(RuntimeError) as e:  # a failed run is noticed
            bench.concurrent(args, configs, lambda name, prefix: commands[name],
                             dict(os.environ))
        assert "plain exited 3" in str(e.value) and "boom" in str(e.value), (
            "a failed run is an error with its exit status and output"
        )
        assert time.monotonic() - start < 30, "noticed while an earlier run still went on"
        with open(pid_file) as f:
            grandchild = int(f.read())
        gone = False
        for _ in range(50):
            try:
                os.kill(grandchild, 0)
            except ProcessLookupError:
                gone = True
                break
            time.sleep(0.1)
        assert gone, "the processes the other runs started are stopped too"


# A stand-in for the allocscope CLI: `run --force --out DIR [flags] -- CMD`
# runs CMD with its steps 30 % slower.
FAKE_CLI = r'''
import os, sys
args = sys.argv[1:]
assert args[:2] == ["run", "--force"], args
cmd = args[args.index("--") + 1:]
os.execve(cmd[0], cmd, dict(os.environ, FAKE_FACTOR="1.3"))
'''


@pytest.mark.parametrize("concurrent", [False, True], ids=["one-after-another", "side-by-side"])
def test_the_driver_runs_every_configuration_end_to_end(concurrent):
    """The driver end to end (configurations, order, table, JSON) with the
    training script and the CLI replaced by stand-ins."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "fake_step.py")
        cli = os.path.join(tmp, "fake_cli.py")
        with open(fake, "w") as f:
            f.write(FAKE)
        with open(cli, "w") as f:
            f.write("#!%s\n%s" % (sys.executable, FAKE_CLI))
        os.chmod(cli, 0o755)
        saved = bench.torchrun, sys.argv
        bench.torchrun = lambda steps, size=(), nproc=2: [sys.executable, fake, "1", str(steps)]
        out = os.path.join(tmp, "out.json")
        # 80 steps of 20 ms: the runs overlap even when a loaded machine
        # starts one of them a second late.
        sys.argv = ["torch_overhead.py", "--cli", cli, "--steps", "80", "--skip", "2",
                    "--repeat", "2", "--nproc", "1", "--only", "allocscope", "--json", out,
                    "--bucket", "0.3"] + (["--concurrent", "--contrast", ""] if concurrent else [])
        try:
            bench.main()
        finally:
            bench.torchrun, sys.argv = saved
        with open(out) as f:
            means = json.load(f)["mean_ms"]
        names = sorted(means)
        want = ["allocscope", "plain"] + (["plain/control"] if concurrent else [])
        assert names == sorted(want), ("%s: the configurations run: %s" % (
            "side by side" if concurrent else "one after another", names))
        ratio = statistics.fmean(means["allocscope"]) / statistics.fmean(means["plain"])
        assert abs(ratio - 1.3) < 1e-6, "the slowed run is %.4f times plain (want 1.3)" % ratio

