#!/usr/bin/env python3
"""The PyTorch proof: tests/gpu/fsdp2_fp8_train.py on 2 GPUs under
`allocscope run`, for each mode and allocator setting, checked against the
findings.

    E2E_CLI=build-gpu/tools/allocscope python3 tests/gpu/run_torch_fsdp2.py [--keep DIR]
        [--modes seed,fixed,bf16] [--allocators default,async,expandable] [--steps N]
        [--nproc N] [--checkpoint] [--grad-accum N] [--backend nccl|gloo|auto]
        [--fp8-impl function|subclass] [--tokens T] [--no-provenance]
        [--compile none|inplace|wrap]

Allocator settings: default (the native caching allocator: per-tensor blocks
come from the PyTorch bridge), async (PYTORCH_CUDA_ALLOC_CONF=
backend:cudaMallocAsync: every tensor is a runtime-API call) and expandable
(expandable_segments:True: segments through cuMemCreate/cuMemMap, blocks from
the bridge).

Every run is a plain `allocscope run`, provenance on by default (--no-provenance:
`allocscope run --no-provenance`), the script's FP8 linear written as
--fp8-impl says (function, subclass).

Checks, on both ranks:
  any    every weight-copy-accumulation or transpose-cache-retention warning
         or error has basis "proven"; info findings (size-only matches) are
         neither checked nor counted
  seed   a weight-copy-accumulation error for each of layers.0..7 whose bytes
         are the layer's FP8 weight copies (+ at most 4 KiB: the scales), and
         a transpose-cache-retention finding for each whose bytes are its
         transposed FP8 copies (+ at most 4 KiB)
         whose evidence stacks (allocscope report --format json) hold a
         Python frame of the script (the line that allocated) after native
         frames (the C++ site)
  fixed, bf16  neither plugin gives a warning or an error
  --no-provenance: no mode gives either plugin's warning or error
The expected sizes are the ones the script prints (ALLOCSCOPE_EXPECT_LAYER).
--compile inplace|wrap compiles each layer (the script's --compile): then
whether seed keeps its forward copies and its transposes is read from
torch.cuda.memory_allocated() (seed's over fixed's, after forward and at
the step's end; bf16's printed beside), never assumed, and seed's
weight-copy errors must name a linear of the layer. --against-eager (with
--compile) runs every mode uncompiled too: where a rank's memory after
forward and at the step's end is eager's, its weight-copy and transpose
errors and warnings must be eager's.
--nproc 1 runs one rank on one GPU (the same checks for rank 0).
--checkpoint runs the script with activation checkpointing: seed then keeps
no forward copy (no weight-copy-accumulation finding may appear) but still
retains the transposes, and every layer of every rank has allocations
tagged (layer, forward) and (layer, backward/recompute). --grad-accum N runs
N micro-batches per optimizer step: the same checks. --backend gloo runs the
ranks' collectives over gloo, so that --nproc ranks may share fewer GPUs
(NCCL refuses two ranks on one GPU): the same checks, without NCCL's own
allocations in the traces. --backend auto: nccl where there is a GPU per
rank, else gloo (said in one line).

Exit status: 0 all passed, 1 a check failed, 77 (skip) without torch, the
GPUs (--nproc, default 2) or FP8 support (sm_89 or newer).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fsdp2_fp8_train.py")
ALLOCATORS = {
    "default": None,
    "async": "backend:cudaMallocAsync",
    "expandable": "expandable_segments:True",
}
SLACK = 4096  # scale_inv blocks (512 B each after rounding) on top of the data


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(77)


def check_machine(nproc, backend):
    try:
        import torch
    except Exception as e:  # no torch
        skip("python3 cannot import torch (%s)" % e)
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        backend = "nccl" if found >= nproc else "gloo"
        if backend == "gloo" and found > 0:
            print("%d rank(s) on %d GPU(s): collectives over gloo, not NCCL" % (nproc, found))
    gpus = nproc if backend == "nccl" else 1
    if found < gpus:
        skip("needs %d CUDA GPU%s (found %d)" % (gpus, "s" if gpus > 1 else "", found))
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        skip("this torch has no float8_e4m3fn / _scaled_mm")
    for d in range(min(nproc, torch.cuda.device_count())):
        if torch.cuda.get_device_capability(d) < (8, 9):
            skip("FP8 GEMMs need sm_89 or newer (GPU %d is sm_%d%d)" % ((d,) + torch.cuda.get_device_capability(d)))
    return torch.__version__, backend


def run_one(cli, out_dir, mode, allocator, args, backend):
    env = dict(os.environ)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "ALLOCSCOPE_PROVENANCE"):
        env.pop(var, None)
    if ALLOCATORS[allocator]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[allocator]
    cmd = [
        cli, "run", "--out", out_dir, "--force"] + ([] if args.provenance else ["--no-provenance"]) + [
        "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
        str(args.nproc), SCRIPT, "--mode", mode, "--steps", str(args.steps),
        "--fp8-impl", args.fp8_impl,
    ] + (["--checkpoint"] if args.checkpoint else []) + [
        "--grad-accum", str(args.grad_accum), "--backend", backend
    ] + (["--tokens", str(args.tokens)] if args.tokens else []) + (
        ["--compile", args.compile] if args.compile != "none" else [])
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600)
    if args.keep and os.path.isdir(out_dir):
        # The workload's own lines (its expectations and memory), beside the
        # kept traces: what tests/corpus/record.py labels a run from.
        with open(os.path.join(out_dir, "workload.stdout"), "w") as f:
            f.write(proc.stdout)
        with open(os.path.join(out_dir, "workload.command"), "w") as f:
            json.dump(cmd[cmd.index("--") + 1:], f)
    return proc


def expectations(stdout):
    layers = {}
    for line in stdout.splitlines():
        if line.startswith("ALLOCSCOPE_EXPECT_LAYER "):
            e = json.loads(line[len("ALLOCSCOPE_EXPECT_LAYER "):])
            layers[(e["rank"], e["layer"])] = e
    return layers


def stacks_by_rank(cli, out_dir, problems):
    """rank -> {stack id: [frame text]} from the report's JSON."""
    p = subprocess.run([cli, "report", out_dir, "--format", "json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    if p.returncode != 0:
        problems.append("allocscope report --format json exited %d: %s" % (p.returncode, p.stderr[-500:]))
        return {}
    report = json.loads(p.stdout)
    return {r["rank"]: {int(k): v for k, v in r.get("stacks", {}).items()} for r in report["ranks"]}


def check_stacks(rank, plugin, finding, stacks, problems):
    """The finding's evidence shows where it was allocated: native frames,
    then the script's Python line."""
    script = os.path.basename(SCRIPT)
    for e in finding.get("evidence", []):
        frames = stacks.get(e.get("stack_id"), [])
        python = [i for i, f in enumerate(frames) if script + ":" in f]
        if python and python[0] > 0:
            return
    problems.append("seed rank %d: %s %s: no evidence stack has native frames and then a line "
                    "of %s (first evidence stack: %s)"
                    % (rank, plugin, finding["layer"], script,
                       " <- ".join(stacks.get(finding["evidence"][0].get("stack_id"), ["none"])[-4:])
                       if finding.get("evidence") else "no evidence"))


_STEP = re.compile(r"^rank (\d+) step (\d+) loss \S+ allocated (\d+) forward_allocated (\d+)$")


def step_memory(stdout):
    """rank -> (allocated at the end of the last step, allocated right after
    its forward), as the script read torch.cuda.memory_allocated()."""
    last = {}
    for line in stdout.splitlines():
        m = _STEP.match(line.strip())
        if m:
            rank, step, end, forward = (int(g) for g in m.groups())
            if rank not in last or step >= last[rank][0]:
                last[rank] = (step, end, forward)
    return {rank: (end, forward) for rank, (_, end, forward) in last.items()}


def compiled_truth(memory, expected, nproc, problems):
    """What a compiled seed run keeps, from torch's own counter, never
    assumed: the partitioner may recompute what eager saves, or save what
    eager recomputes. Per rank, seed's memory after forward over fixed's
    (the same FP8 linear without the retention) must be either the
    script's forward copies (kept) or nothing (not kept), and the same for
    the transposes at the step's end. Returns {rank: (copies kept,
    transposes kept)}; a difference that is neither is a failure: the
    truth is unknown, nothing can be judged."""
    truth = {}
    for rank in range(nproc):
        seed, fixed = memory.get(("seed", rank)), memory.get(("fixed", rank))
        if seed is None or fixed is None:
            problems.append("compiled rank %d: no memory_allocated() of seed and fixed" % rank)
            continue
        layers = [e for (r, _), e in expected.items() if r == rank]
        copies = sum(e["forward_copy_bytes"] for e in layers)
        transposes = sum(e["transpose_bytes"] for e in layers)
        slack = SLACK * max(len(layers), 1)
        kept = []
        for what, measured, want in (("forward copies", seed[1] - fixed[1], copies),
                                     ("transposes", seed[0] - fixed[0], transposes)):
            bf16 = memory.get(("bf16", rank))
            print("    truth rank %d: %s: seed - fixed = %d B (script: %d B)%s"
                  % (rank, what, measured, want,
                     "" if bf16 is None else "; seed - bf16 after forward %d B, at the end %d B"
                     % (seed[1] - bf16[1], seed[0] - bf16[0])))
            if abs(measured - want) <= slack:
                kept.append(True)
            elif abs(measured) <= slack:
                kept.append(False)
            else:
                problems.append("compiled rank %d: seed keeps %d B more %s than fixed: neither the "
                                "script's %d B nor nothing, so the truth is unknown"
                                % (rank, measured, what, want))
                kept.append(None)
        truth[rank] = tuple(kept)
    return truth


def _claims(findings):
    """(plugin, rank, layer, severity) -> bytes of the weight-copy and
    transpose errors and warnings: what a run tells its user."""
    out = {}
    for f in findings.get("findings", []):
        if f["plugin"] in ("weight-copy-accumulation", "transpose-cache-retention") and \
                f["severity"] in ("error", "warning"):
            out[(f["plugin"], f["rank"], f["layer"], f["severity"])] = f["bytes"]
    return out


def against_eager(mode, compiled, eager, compiled_memory, eager_memory, nproc, problems):
    """Compiled and eager runs of one mode must agree on findings wherever
    their memory agrees: per rank, where torch.cuda.memory_allocated() after
    forward and at the step's end are within the scales' slack of eager's,
    the compiled run's weight-copy and transpose errors and warnings must be
    eager's (the same plugin, layer and severity, bytes within the slack).
    Where memory differs the partitioner kept something else, and nothing is
    compared (said on stdout). compiled, eager: findings.json of each;
    *_memory: {rank: (end, forward)}."""
    ours, theirs = _claims(compiled), _claims(eager)
    for rank in range(nproc):
        c, e = compiled_memory.get(rank), eager_memory.get(rank)
        if c is None or e is None:
            problems.append("%s rank %d: no memory_allocated() of the compiled or the eager run"
                            % (mode, rank))
            continue
        slack = SLACK * 8
        if abs(c[1] - e[1]) > slack or abs(c[0] - e[0]) > slack:
            print("    %s rank %d: compiled - eager memory: after forward %d B, at the end %d B: "
                  "findings not compared" % (mode, rank, c[1] - e[1], c[0] - e[0]))
            continue
        mine = {k: v for k, v in ours.items() if k[1] == rank}
        other = {k: v for k, v in theirs.items() if k[1] == rank}
        for k in sorted(set(mine) | set(other)):
            if k not in other:
                problems.append("%s rank %d: compiled only (memory as eager's): %s %s %s %d B"
                                % (mode, rank, k[0], k[2], k[3], mine[k]))
            elif k not in mine:
                problems.append("%s rank %d: eager only (memory as compiled's): %s %s %s %d B"
                                % (mode, rank, k[0], k[2], k[3], other[k]))
            elif abs(mine[k] - other[k]) > SLACK:
                problems.append("%s rank %d: %s %s %s: compiled %d B, eager %d B"
                                % (mode, rank, k[0], k[2], k[3], mine[k], other[k]))
        print("    %s rank %d: memory as eager's; %d errors and warnings compared"
              % (mode, rank, len(mine)))


def check(mode, findings, expected, problems, nproc, stacks, provenance, truth=None):
    by = {}
    for f in findings.get("findings", []):
        if f["plugin"] not in ("weight-copy-accumulation", "transpose-cache-retention"):
            continue
        # Info findings claim nothing (sizes that match a weight form, which
        # only provenance could settle): never a failure, never a proof.
        if f["severity"] == "info":
            continue
        if f.get("basis") != "proven":
            problems.append("%s rank %d: a %s %s finding without proven provenance (basis %r): "
                            "%s" % (mode, f["rank"], f["severity"], f["plugin"], f.get("basis"),
                                    f["summary"]))
        by.setdefault((f["plugin"], f["rank"]), []).append(f)
    if mode != "seed" or not provenance:
        for (plugin, rank), fs in sorted(by.items()):
            for f in fs:
                problems.append("%s rank %d: unexpected %s finding: %s %s %d B: %s"
                                % (mode, rank, plugin, f["layer"], f["phase"], f["bytes"], f["summary"]))
        return
    for rank in range(nproc):
        for i in range(8):
            layer = "layers.%d" % i
            e = expected.get((rank, layer))
            if e is None:
                problems.append("seed rank %d: the script printed no expectation for %s" % (rank, layer))
                continue
            wants = [("weight-copy-accumulation", e["forward_copy_bytes"]),
                     ("transpose-cache-retention", e["transpose_bytes"])]
            if truth is not None:  # compiled: what memory says is kept
                kept = truth.get(rank)
                if kept is None or None in kept:
                    continue  # unknown: already a failure
                wants = [(plugin, want if k else 0) for (plugin, want), k in zip(wants, kept)]
            for plugin, want in wants:
                got = [f for f in by.get((plugin, rank), []) if f["layer"] == layer]
                if want == 0:  # nothing retained (checkpointing drops the forward copy)
                    for f in got:
                        problems.append("seed rank %d: unexpected %s finding: %s %s %d B"
                                        % (rank, plugin, layer, f["phase"], f["bytes"]))
                    continue
                if not got:
                    problems.append("seed rank %d: no %s finding for %s (want %d B)" % (rank, plugin, layer, want))
                    continue
                b = got[0]["bytes"]
                if not (want <= b <= want + SLACK):
                    problems.append("seed rank %d: %s %s: %d B, want %d..%d B"
                                    % (rank, plugin, layer, b, want, want + SLACK))
                check_stacks(rank, plugin, got[0], stacks.get(rank, {}), problems)
                if truth is not None and plugin == "weight-copy-accumulation":
                    # Compiled: the evidence names the linear, not only the block.
                    text = json.dumps(got[0])
                    if not re.search(re.escape(layer) + r"\.(qkv|proj|fc1|fc2)\b", text):
                        problems.append("seed rank %d: %s %s names no linear of the layer: %s"
                                        % (rank, plugin, layer, got[0]["summary"]))


def check_recompute(cli, out_dir, problems, nproc):
    """With --checkpoint: every layer's recomputation is tagged (layer,
    backward/recompute) on every rank, with the allocations of a forward."""
    p = subprocess.run([cli, "report", out_dir, "--format", "json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    if p.returncode != 0:
        problems.append("allocscope report --format json exited %d" % p.returncode)
        return
    for r in json.loads(p.stdout)["ranks"]:
        tags = {(t["layer"], t["phase"]): t for t in r.get("tags", [])}
        for i in range(8):
            layer = "layers.%d" % i
            rec = tags.get((layer, "backward/recompute"), {}).get("allocations", 0)
            fwd = tags.get((layer, "forward"), {}).get("allocations", 0)
            if rec == 0 or fwd == 0:
                problems.append("rank %d: %s: %d allocations in forward, %d recomputed in backward"
                                % (r.get("rank", -1), layer, fwd, rec))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", help="keep every run's output under this directory")
    parser.add_argument("--modes", default="seed,fixed,bf16")
    parser.add_argument("--allocators", default="default,async,expandable")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks, one GPU each (default 2)")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="N",
                        help="the script's micro-batches per optimizer step: the same checks")
    parser.add_argument("--checkpoint", action="store_true",
                        help="the script's activation checkpointing: no forward copy retained, "
                             "recomputations tagged backward/recompute")
    parser.add_argument("--fp8-impl", choices=("function", "subclass"), default="function",
                        help="the script's FP8 linear: an autograd.Function on plain tensors, or "
                             "a __torch_dispatch__ tensor subclass")
    parser.add_argument("--tokens", type=int, help="the script's tokens per rank (default its 64)")
    parser.add_argument("--no-provenance", dest="provenance", action="store_false",
                        help="run under `allocscope run --no-provenance`: then no mode may give "
                             "a weight-copy or transpose error or warning (size matches are info)")
    parser.add_argument("--backend", choices=("nccl", "gloo", "auto"), default="nccl",
                        help="the script's process group backend; gloo lets ranks share a GPU; "
                             "auto: nccl with a GPU per rank, else gloo")
    parser.add_argument("--compile", choices=("none", "inplace", "wrap"), default="none",
                        help="the script's torch.compile of each layer; then what seed keeps is "
                             "taken from torch.cuda.memory_allocated() against fixed, never "
                             "assumed, and seed's findings must name the linear (needs the modes "
                             "seed and fixed)")
    parser.add_argument("--against-eager", action="store_true",
                        help="with --compile: run every mode uncompiled too, and where a rank's "
                             "memory is eager's, its findings must be eager's")
    args = parser.parse_args()
    if args.against_eager and args.compile == "none":
        parser.error("--against-eager goes with --compile")
    cli = os.environ.get("E2E_CLI")
    if not cli or not os.access(cli, os.X_OK):
        print("E2E_CLI must name the allocscope executable")
        return 2
    version, backend = check_machine(args.nproc, args.backend)
    print("torch %s; allocscope %s; %d rank(s) over %s" % (version, cli, args.nproc, backend),
          flush=True)
    root = args.keep or tempfile.mkdtemp(prefix="allocscope-torch-")
    failed = []
    try:
        for allocator in args.allocators.split(","):
            runs = []
            for mode in args.modes.split(","):
                out_dir = os.path.join(root, "%s-%s" % (mode, allocator))
                runs.append((mode, out_dir, run_one(cli, out_dir, mode, allocator, args, backend)))
            truth = None
            if args.compile != "none" and {"seed", "fixed"} <= {m for m, _, _ in runs}:
                memory = {}
                for mode, _, proc in runs:
                    for rank, m in step_memory(proc.stdout).items():
                        memory[(mode, rank)] = m
                truth_problems = []
                truth = compiled_truth(memory, expectations(runs[0][2].stdout), args.nproc,
                                       truth_problems)
                if truth_problems:
                    failed.append("truth / %s" % allocator)
                    for p in truth_problems:
                        print("    " + p)
            if args.against_eager:
                eager_args = argparse.Namespace(**vars(args))
                eager_args.compile = "none"
                for mode, out_dir, proc in runs:
                    label = "%s / %s against eager" % (mode, allocator)
                    eager_dir = out_dir + "-eager"
                    eager = run_one(cli, eager_dir, mode, allocator, eager_args, backend)
                    problems = []
                    loaded = []
                    for d, p in ((out_dir, proc), (eager_dir, eager)):
                        path = os.path.join(d, "findings.json")
                        if p.returncode != 0 or not os.path.exists(path):
                            problems.append("%s: exit status %d, findings.json %s"
                                            % (d, p.returncode, "present" if os.path.exists(path)
                                               else "missing"))
                            continue
                        with open(path) as f:
                            loaded.append(json.load(f))
                    if not problems:
                        against_eager(mode, loaded[0], loaded[1], step_memory(proc.stdout),
                                      step_memory(eager.stdout), args.nproc, problems)
                    print("%-20s %s" % (label, "ok" if not problems else "FAILED"), flush=True)
                    for p in problems:
                        print("    " + p)
                    if problems:
                        failed.append(label)
            for mode, out_dir, proc in runs:
                label = "%s / %s" % (mode, allocator)
                problems = []
                if proc.returncode != 0:
                    problems.append("exit status %d" % proc.returncode)
                traces = sorted(f for f in os.listdir(out_dir) if f.endswith(".trace")) if os.path.isdir(out_dir) else []
                for want in ["rank%d.trace" % r for r in range(args.nproc)]:
                    if want not in traces:
                        problems.append("no %s (traces: %s)" % (want, ", ".join(traces) or "none"))
                findings_path = os.path.join(out_dir, "findings.json")
                findings = {}
                if os.path.exists(findings_path):
                    with open(findings_path) as f:
                        findings = json.load(f)
                else:
                    problems.append("no findings.json")
                if not problems or findings:
                    stacks = stacks_by_rank(cli, out_dir, problems) if mode == "seed" else {}
                    check(mode, findings, expectations(proc.stdout), problems, args.nproc, stacks,
                          args.provenance, truth)
                    if args.checkpoint:
                        check_recompute(cli, out_dir, problems, args.nproc)
                status = "ok" if not problems else "FAILED"
                print("%-20s %s" % (label, status), flush=True)
                for p in problems:
                    print("    " + p)
                if problems:
                    failed.append(label)
                    tail = "\n".join(proc.stderr.splitlines()[-40:])
                    print("    --- stderr (last 40 lines) ---\n" + tail)
                    summary = [f for f in findings.get("findings", [])
                               if f["plugin"] in ("weight-copy-accumulation", "transpose-cache-retention")]
                    for f in summary[:40]:
                        print("    finding: %s rank %d %s %s %d B" % (f["plugin"], f["rank"], f["layer"], f["phase"], f["bytes"]))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    print("all %d runs passed" % (len(args.modes.split(",")) * len(args.allocators.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
