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

    python3 tests/corpus/record.py OUT --from-proofs GPU_OUT/runs

records nothing: it takes the compiled runs from the runs that
`tools/gpu-compiled-check BUILD GPU_OUT` kept (their traces, and the
workload's stdout and command beside them), labelled the same way.
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
# Each layer torch.compile'd in place (layer.compile(), as torchtitan does).
# What a compiled run keeps is not the script's to say: the partitioner may
# recompute what eager saves or save what eager recomputes. Its labels are
# the script's only where torch's own memory_allocated() agrees (see
# compiled_labels): every compiled group records seed, fixed and bf16.
COMPILED = ("--compile", "inplace")
for impl in ("function", "subclass"):
    for mode in ("seed", "fixed"):
        RUNS["compiled-%s-%s-t64" % (impl, mode)] = (
            FP8, 2, ["--mode", mode, "--fp8-impl", impl, "--tokens", "64"] + list(COMPILED))
RUNS["compiled-bf16-t64"] = (FP8, 2, ["--mode", "bf16", "--tokens", "64"] + list(COMPILED))


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


TRUTH = ("torch.cuda.memory_allocated(): seed against fixed, fixed against bf16 (beside what "
         "eager fixed keeps over eager bf16)")


def compiled_labels(outputs, names):
    """The labels of the compiled runs among names, from torch's own memory:
    per FP8 implementation, seed over fixed after forward (the forward
    copies) and at the step's end (the transposes) must be the script's
    bytes (seed keeps them: its labels stand) or nothing (the compiled graph
    keeps nothing: no label), and fixed over bf16 no more than eager fixed
    keeps over eager bf16 (the runs EAGER names, where outputs has them;
    nothing where it does not): a compiled "fixed" is not clean by
    construction, and an eager one, labelled clean by its script, still
    keeps more than bf16 (1 MiB on the 2026-12-07 runs, eager and compiled
    alike, docs/VALIDATION.md).
    outputs: name -> stdout of the recorded runs. Returns ({name: problems},
    {name: why it has no truth})."""
    sys.path.insert(0, GPU)
    from run_torch_fsdp2 import compiled_truth, expectations, step_memory

    labels, unknown = {}, {}
    bf16 = "compiled-bf16-t64"
    for name in names:
        if name.startswith("compiled-") and name != bf16:
            labels[name] = []  # filled below; a run left without truth is unknown
    if bf16 in names:
        labels[bf16] = labels_from(outputs[bf16]) if bf16 in outputs else []
    for impl in ("function", "subclass"):
        group = {mode: "compiled-%s-%s-t64" % (impl, mode) for mode in ("seed", "fixed")}
        if not any(n in labels for n in group.values()):
            continue
        missing = [n for n in list(group.values()) + [bf16] if n not in outputs]
        if missing:
            for n in group.values():
                unknown[n] = "no memory_allocated() of " + ", ".join(missing)
            continue
        memory = {}
        for mode, n in list(group.items()) + [("bf16", bf16)]:
            for rank, m in step_memory(outputs[n]).items():
                memory[(mode, rank)] = m
        ranks = RUNS[group["seed"]][1]
        expected = expectations(outputs[group["seed"]])
        problems = []
        truth = compiled_truth(memory, expected, ranks, problems)
        eager = {}
        eager_fixed, eager_bf16 = EAGER[impl + "-fixed"], EAGER["bf16"]
        if eager_fixed in outputs and eager_bf16 in outputs:
            fixed_runs = step_memory(outputs[eager_fixed])
            bf16_runs = step_memory(outputs[eager_bf16])
            eager = {rank: (fixed_runs[rank][0] - bf16_runs[rank][0],
                            fixed_runs[rank][1] - bf16_runs[rank][1])
                     for rank in fixed_runs if rank in bf16_runs}
        for rank in range(ranks):
            fixed, plain = memory.get(("fixed", rank)), memory.get(("bf16", rank))
            if fixed is None or plain is None:
                continue
            layers = max(1, len([1 for r, _ in expected if r == rank]))
            allowed = eager.get(rank)
            for i, what in ((1, "after forward"), (0, "at the step's end")):
                extra = fixed[i] - plain[i]
                if extra - (allowed[i] if allowed else 0) > SLACK * layers:
                    problems.append("compiled fixed rank %d keeps %d B more than bf16 %s (%s)" % (
                        rank, extra, what, "eager fixed: %d B" % allowed[i] if allowed
                        else "no eager runs to hold it to"))
        if problems:
            for n in group.values():
                unknown[n] = "; ".join(problems)
            continue
        kept = []
        for p in labels_from(outputs[group["seed"]]):
            copies, transposes = truth[p["rank"]]
            if "transpose-cache-retention" in p["plugins"]:
                if transposes:
                    kept.append(p)
            elif copies:
                kept.append(p)
        labels[group["seed"]] = kept
        labels[group["fixed"]] = labels_from(outputs[group["fixed"]])
    return labels, unknown


# The eager runs a compiled group's "fixed" is held to (compiled_labels):
# the corpus's own, or a proof's --against-eager runs (EAGER_PROOF_RUNS).
EAGER = {"function-fixed": "function-fixed-t64", "subclass-fixed": "subclass-fixed-t64",
         "bf16": "bf16-t64"}

# The compiled runs as gpu-compiled-check's proofs keep them (OUT/runs:
# tests/gpu/run_torch_fsdp2.py --keep): proof, mode directory.
PROOF_RUNS = {
    "compiled-function-seed-t64": ("function-inplace", "seed-default"),
    "compiled-function-fixed-t64": ("function-inplace", "fixed-default"),
    "compiled-subclass-seed-t64": ("subclass-inplace", "seed-default"),
    "compiled-subclass-fixed-t64": ("subclass-inplace", "fixed-default"),
    "compiled-bf16-t64": ("function-inplace", "bf16-default"),
}
# Their eager twins (--against-eager), read for compiled_labels only.
EAGER_PROOF_RUNS = {
    "function-fixed-t64": ("function-inplace", "fixed-default-eager"),
    "subclass-fixed-t64": ("subclass-inplace", "fixed-default-eager"),
    "bf16-t64": ("function-inplace", "bf16-default-eager"),
}


def from_proofs(runs, out, machine=None):
    """The compiled runs of the corpus taken from runs a proof recorded and
    kept (`tools/gpu-compiled-check BUILD OUT` keeps them in OUT/runs): each
    run's traces, labelled as record() labels a run it records (the
    workload's stdout, kept beside the traces; compiled_labels). machine:
    the lines of OUT/machine.txt (date, GPU, torch). Returns the names
    written and {name: why} for those left out."""
    outputs, commands = {}, {}
    for name, (proof, mode) in list(PROOF_RUNS.items()) + list(EAGER_PROOF_RUNS.items()):
        src = os.path.join(runs, proof, mode)
        try:
            with open(os.path.join(src, "workload.stdout")) as f:
                outputs[name] = f.read()
            with open(os.path.join(src, "workload.command")) as f:
                commands[name] = json.load(f)
        except OSError:
            continue
    labels, unknown = compiled_labels(outputs, [n for n in outputs if n in PROOF_RUNS])
    left_out = {n: "not in %s" % runs for n in PROOF_RUNS if n not in outputs}
    left_out.update(unknown)
    written = []
    for name, problems in sorted(labels.items()):
        if name in left_out:
            continue
        src = os.path.join(runs, *PROOF_RUNS[name])
        traces = sorted(f for f in os.listdir(src) if f.endswith(".trace"))
        if not traces:
            left_out[name] = "no traces in " + src
            continue
        dest = os.path.join(out, name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for t in traces:
            shutil.copy(os.path.join(src, t), dest)
        root = os.path.dirname(os.path.dirname(HERE))
        command = [os.path.relpath(c, root) if os.path.isabs(c) and c.startswith(root + os.sep)
                   else c for c in commands[name][1:]]  # as record() writes it: no interpreter
        doc = {
            "run": name,
            "command": ["allocscope", "run", "--"] + command,
            "recorded": dict(zip(("date", "gpu", "torch"), machine or []),
                             by="tools/gpu-compiled-check (tests/gpu/run_torch_fsdp2.py --keep)"),
            "ranks": len(traces),
            "problems": problems,
            "truth": TRUTH,
        }
        with open(os.path.join(dest, "labels.json"), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        written.append(name)
    return written, left_out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--only", help="comma list of run names")
    parser.add_argument("--steps", type=int, help="override the workloads' step counts")
    parser.add_argument("--jobs", type=int, default=1, help="runs recorded at the same time")
    parser.add_argument("--from-proofs", metavar="RUNS",
                        help="no recording: the compiled runs from a proof's kept runs "
                             "(tools/gpu-compiled-check's OUT/runs)")
    args = parser.parse_args()
    if args.from_proofs:
        machine = None
        path = os.path.join(os.path.dirname(os.path.abspath(args.from_proofs)), "machine.txt")
        if os.path.exists(path):
            with open(path) as f:
                machine = f.read().splitlines()[:3]
        written, left_out = from_proofs(args.from_proofs, args.out, machine)
        for name in written:
            print("labelled %s" % name)
        for name, why in sorted(left_out.items()):
            print("FAILED %s: %s" % (name, why))
        return 1 if left_out else 0
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

    outputs = {}  # name -> the workload's stdout, for the compiled runs' labels

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
        outputs[name] = result.stdout
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
    # The compiled runs' labels, once their group's runs are all recorded.
    labels, unknown = compiled_labels(outputs, [n for n in names if n not in failed])
    for name, problems in labels.items():
        if name in unknown:
            continue
        path = os.path.join(args.out, name, "labels.json")
        with open(path) as f:
            record_labels = json.load(f)
        record_labels["problems"] = problems
        record_labels["truth"] = TRUTH
        with open(path, "w") as f:
            json.dump(record_labels, f, indent=1, sort_keys=True)
            f.write("\n")
        print("labelled %s: %d problems" % (name, len(problems)), flush=True)
    for name, why in unknown.items():
        if name in failed:
            continue
        print("FAILED %s: the truth is unknown: %s" % (name, why), flush=True)
        shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
        failed.append(name)
    print("%d recorded, %d failed%s" % (len(names) - len(failed), len(failed),
                                        (": " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
