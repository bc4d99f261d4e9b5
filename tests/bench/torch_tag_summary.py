#!/usr/bin/env python3
"""Allocations and bytes per (layer, phase) of one rank of a run, from
`allocscope report --format json` (for comparing how two versions of the
PyTorch hooks attribute the same run).

    python3 tests/bench/torch_tag_summary.py CLI RUN_DIR [RANK]
"""

import json
import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    cli, run_dir = sys.argv[1], sys.argv[2]
    rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    out = subprocess.run([cli, "report", run_dir, "--format", "json"], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    ranks = [r for r in json.loads(out)["ranks"] if r.get("rank", 0) == rank]
    if not ranks:
        sys.stderr.write("no rank %d in %s\n" % (rank, run_dir))
        return 1
    print("%-24s %-10s %12s %16s" % ("layer", "phase", "allocations", "bytes"))
    for t in sorted(ranks[0].get("tags", []), key=lambda t: (t["phase"], t["layer"])):
        print("%-24s %-10s %12d %16d" % (t["layer"] or '""', t["phase"] or "-", t["allocations"],
                                         t["allocated_bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
