#!/usr/bin/env python3
"""Do two runs have the same tags? `allocscope report --format json` of each;
per rank, the (layer, phase, allocations, bytes) rows must be equal. Used on
the GPU machine for the cuda backend of the harness, C API vs --nvtx (the
sim backend's check is the meson test harness_nvtx).

    python3 tests/gpu/nvtx_tags_match.py CLI RUN_DIR_A RUN_DIR_B
Exit 0 when identical, 1 otherwise.
"""
import json
import subprocess
import sys


def tags(cli, run_dir):
    out = subprocess.run([cli, "report", run_dir, "--format", "json"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    return [sorted((t["layer"], t["phase"], t["allocations"], t["allocated_bytes"])
                   for t in rank["tags"]) for rank in json.loads(out)["ranks"]]


def main():
    cli, a_dir, b_dir = sys.argv[1:4]
    a, b = tags(cli, a_dir), tags(cli, b_dir)
    print("ranks %d / %d, tag rows per rank %s / %s, identical: %s"
          % (len(a), len(b), [len(x) for x in a], [len(x) for x in b], a == b))
    return 0 if a == b and a else 1


if __name__ == "__main__":
    sys.exit(main())
