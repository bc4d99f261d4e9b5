#!/usr/bin/env python3
"""Runs a Python script under cProfile and writes where its main thread's
time went, one file per rank (for the overhead investigations of
docs/journal/RESULTS-2026.md; usable under torchrun and under `allocscope run`).

    torchrun --nproc_per_node 2 tests/bench/pyprofile.py OUTDIR SCRIPT [ARGS...]

Writes OUTDIR/profile.rank<RANK>.txt: the 40 functions with the most own
time, then the 40 with the most cumulative time. cProfile sees the thread
that runs the script only: time spent on autograd's threads shows as the
cumulative time of the call that waits for them (run_backward).
"""

import cProfile
import os
import pstats
import runpy
import sys


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    out, script = sys.argv[1], sys.argv[2]
    sys.argv = sys.argv[2:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    profile = cProfile.Profile()
    profile.enable()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        profile.disable()
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "profile.rank%s.txt" % os.environ.get("RANK", "0"))
        with open(path, "w") as f:
            stats = pstats.Stats(profile, stream=f)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
