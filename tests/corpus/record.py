#!/usr/bin/env python3
"""Records the labelled accuracy corpus (tools/accuracy) on a GPU machine.

    E2E_CLI=build-gpu/tools/allocscope python3 tests/corpus/record.py OUT [--only NAME,...]
        [--jobs N]

Each run is one workload script under `allocscope run` (provenance on,
plugins off: tools/accuracy replays them), 1 or 2 ranks (2 ranks share
one GPU over gloo where there are fewer GPUs than ranks). OUT/<name>/ gets
the traces and labels.json: the command, the machine, and the problems the
workload says it has, taken from its own stdout (ALLOCSCOPE_EXPECT_LAYER
lines of tests/gpu/fsdp2_fp8_train.py, ALLOCSCOPE_LABEL lines of
tests/gpu/generic_problems.py), never from a detector. A run whose
workload fails is reported and left out.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.join(os.path.dirname(HERE), "gpu")
FP8 = os.path.join(GPU, "fsdp2_fp8_train.py")
GENERIC = os.path.join(GPU, "generic_problems.py")
SLACK = 4096  # the scales' 512 B blocks beside a layer's copies (runner: SLACK)

# name -> (script, ranks, arguments). Hidden 256: tokens 256 is T == H,
# 1024 is T == 4H (a [T, 4H] bf16 activation has a [4H, H] bf16 weight's
# bytes), 64 the reference test's count, 96 coincides with nothing.
RUNS = {}
for impl in ("function", "subclass"):
    for mode in ("seed", "fixed"):
        for tokens in (64, 96, 256, 1024) if impl == "function" else (64, 256):
            RUNS["%s-%s-t%d" % (impl, mode, tokens)] = (
                FP8, 2, ["--mode", mode, "--fp8-impl", impl, "--tokens", str(tokens)])
for tokens in (64, 256, 1024):
    RUNS["bf16-t%d" % tokens] = (FP8, 2, ["--mode", "bf16", "--tokens", str(tokens)])
RUNS["bf16-autocast-fp32-master-t256"] = (
    FP8, 2, ["--mode", "bf16", "--master-fp32", "--tokens", "256"])
for mode in ("seed", "fixed"):
    RUNS["function-%s-checkpoint" % mode] = (FP8, 2, ["--mode", mode, "--checkpoint"])
    RUNS["function-%s-grad-accum" % mode] = (FP8, 2, ["--mode", mode, "--grad-accum", "2"])
RUNS["function-seed-t256-1rank"] = (FP8, 1, ["--mode", "seed", "--tokens", "256"])
RUNS["bf16-t256-1rank"] = (FP8, 1, ["--mode", "bf16", "--tokens", "256"])
for problem in ("none", "keep-last-output", "keep-outputs", "module-cache", "optimizer-hook"):
    RUNS["generic-" + problem] = (GENERIC, 2, ["--problem", problem])


def labels_from(stdout):
    """The problems a run's workload printed, per rank."""
    problems = []
    totals = {}  # rank -> [bytes, layers] of forward copies alive together
    for line in stdout.splitlines():
        if line.startswith("ALLOCSCOPE_EXPECT_LAYER "):
            e = json.loads(line.split(" ", 1)[1])
            if e["forward_copy_bytes"]:
                problems.append({
                    "rank": e["rank"], "plugins": ["weight-copy-accumulation"],
                    "layer": e["layer"], "bytes": e["forward_copy_bytes"], "slack": SLACK,
                    "severity": "error",
                    "what": "weight copies made in the layer's forward, saved for its backward",
                })
                t = totals.setdefault(e["rank"], [0, 0])
                t[0] += e.get("forward_end_bytes", e["forward_copy_bytes"])
                t[1] += 1
            if e["transpose_bytes"]:
                problems.append({
                    "rank": e["rank"], "plugins": ["transpose-cache-retention"],
                    "layer": e["layer"], "bytes": e["transpose_bytes"], "slack": SLACK,
                    "severity": "error",
                    "what": "transposed FP8 weight copies built in backward, kept in a cache",
                })
        elif line.startswith("ALLOCSCOPE_LABEL "):
            e = json.loads(line.split(" ", 1)[1])
            problems.append({
                "rank": e["rank"], "plugins": e["plugins"], "layer": e["layer"],
                "min_bytes": e["bytes_per_step"], "severity": "warning", "what": e["problem"],
            })
    for rank, (total, layers) in sorted(totals.items()):
        problems.append({
            "rank": rank, "plugins": ["weight-copy-accumulation"], "layer": "layers",
            "bytes": total, "slack": SLACK * layers, "severity": "error",
            "what": "every layer's weight copies alive together at the end of forward",
        })
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--only", help="comma list of run names")
    parser.add_argument("--steps", type=int, help="override the workloads' step counts")
    parser.add_argument("--jobs", type=int, default=1, help="runs recorded at the same time")
    args = parser.parse_args()
    cli = os.environ.get("E2E_CLI")
    if not cli:
        print("record.py: set E2E_CLI to the allocscope CLI", file=sys.stderr)
        return 2
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("SKIP: no GPU")
        return 77
    names = args.only.split(",") if args.only else list(RUNS)

    def record(name):
        """Records one run; returns its line for the log, and whether it failed."""
        script, ranks, extra = RUNS[name]
        backend = "nccl" if gpus >= ranks else "gloo"
        out = os.path.join(args.out, name)
        shutil.rmtree(out, ignore_errors=True)
        workload = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", str(ranks), os.path.relpath(script),
                    "--backend", backend] + extra
        if args.steps:
            workload += ["--steps", str(args.steps)]
        command = [cli, "run", "--out", out, "--plugins", "none", "--"] + workload
        env = dict(os.environ)
        env.pop("ALLOCSCOPE_PROVENANCE", None)  # the default: provenance on
        start = time.time()
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        elapsed = time.time() - start
        if result.returncode != 0:
            return ("FAILED %s (exit %d, %.0f s):\n%s" % (name, result.returncode, elapsed,
                                                         result.stdout[-3000:]), True)
        for extra_file in ("report.txt", "report.html", "findings.json"):
            path = os.path.join(out, extra_file)
            if os.path.exists(path):
                os.remove(path)
        labels = {
            "run": name,
            "command": ["allocscope", "run", "--"] + workload[1:],
            "recorded": {
                "date": time.strftime("%Y-%m-%d"),
                "gpu": torch.cuda.get_device_name(0),
                "gpus": gpus,
                "torch": torch.__version__,
                "backend": backend,
            },
            "ranks": ranks,
            "problems": labels_from(result.stdout),
        }
        with open(os.path.join(out, "labels.json"), "w") as f:
            json.dump(labels, f, indent=1, sort_keys=True)
            f.write("\n")
        size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
        return ("recorded %s: %d problems, %d bytes, %.0f s" % (name, len(labels["problems"]),
                                                                size, elapsed), False)

    # Runs are independent (each torchrun --standalone picks its own port):
    # --jobs N records N at a time, sharing the GPUs.
    from concurrent.futures import ThreadPoolExecutor

    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, (line, bad) in zip(names, pool.map(record, names)):
            print(line, flush=True)
            if bad:
                failed.append(name)
    print("%d recorded, %d failed%s" % (len(names) - len(failed), len(failed),
                                        (": " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
