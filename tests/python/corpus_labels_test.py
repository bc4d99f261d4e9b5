"""The labelled corpus's compiled runs (tests/corpus/record.py,
compiled_labels): their labels come from torch.cuda.memory_allocated(),
never from the script alone. Seed's labels stand where seed keeps the
script's bytes over fixed, are dropped where it keeps nothing, and a
difference that is neither, or a "fixed" that keeps more than bf16 beyond
what eager fixed keeps over eager bf16, leaves the group without truth (the
runs are left out of the corpus)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "corpus"))
import record  # noqa: E402

COPY = 4 * 262144  # a layer's four FP8 weight copies (the script's bytes)
LAYERS = 2


def stdout(mode, end, forward):
    """A run's stdout as tests/gpu/fsdp2_fp8_train.py prints it: the
    expected bytes per layer and, per rank, the last step's memory."""
    lines = []
    for rank in range(2):
        for i in range(LAYERS):
            retained = mode == "seed"
            lines.append("ALLOCSCOPE_EXPECT_LAYER " + json.dumps({
                "rank": rank, "mode": mode, "layer": "layers.%d" % i,
                "forward_copy_bytes": COPY if retained else 0,
                "forward_end_bytes": COPY if retained else 0,
                "forward_scale_count": 4 if retained else 0,
                "transpose_bytes": COPY if retained else 0}))
        lines.append("rank %d step 3 loss 0.5 allocated %d forward_allocated %d"
                     % (rank, end, forward))
    return "\n".join(lines)


NAMES = ["compiled-function-seed-t64", "compiled-function-fixed-t64", "compiled-bf16-t64"]
BASE_END, BASE_FORWARD = 50_000_000, 80_000_000


def outputs(seed_forward_extra, seed_end_extra, fixed_extra=0):
    return {
        "compiled-function-seed-t64": stdout("seed", BASE_END + seed_end_extra,
                                             BASE_FORWARD + seed_forward_extra),
        "compiled-function-fixed-t64": stdout("fixed", BASE_END + fixed_extra,
                                              BASE_FORWARD + fixed_extra),
        "compiled-bf16-t64": stdout("bf16", BASE_END, BASE_FORWARD),
    }


def plugins(problems):
    return sorted({p["plugins"][0] for p in problems})


def test_a_compiled_seed_that_keeps_the_scripts_bytes_keeps_its_labels():
    labels, unknown = record.compiled_labels(outputs(LAYERS * COPY, LAYERS * COPY), NAMES)
    assert unknown == {}
    seed = labels["compiled-function-seed-t64"]
    assert plugins(seed) == ["transpose-cache-retention", "weight-copy-accumulation"]
    assert len([p for p in seed if p["layer"] != "layers"]) == 2 * LAYERS * 2  # 2 ranks
    assert labels["compiled-function-fixed-t64"] == []
    assert labels["compiled-bf16-t64"] == []


def test_a_compiled_seed_whose_graph_recomputes_the_copies_is_labelled_with_the_transposes_only():
    labels, unknown = record.compiled_labels(outputs(0, LAYERS * COPY), NAMES)
    assert unknown == {}
    assert plugins(labels["compiled-function-seed-t64"]) == ["transpose-cache-retention"]


def test_a_difference_that_is_neither_the_scripts_bytes_nor_nothing_leaves_the_group_without_truth():
    labels, unknown = record.compiled_labels(outputs(COPY // 2, LAYERS * COPY), NAMES)
    assert set(unknown) == {"compiled-function-seed-t64", "compiled-function-fixed-t64"}
    assert "neither" in unknown["compiled-function-seed-t64"]


def test_a_compiled_fixed_that_keeps_more_than_bf16_is_not_taken_as_clean():
    labels, unknown = record.compiled_labels(
        outputs(LAYERS * COPY + COPY, LAYERS * COPY + COPY, fixed_extra=COPY), NAMES)
    assert "compiled-function-fixed-t64" in unknown
    assert "more than bf16" in unknown["compiled-function-fixed-t64"]


def test_a_compiled_fixed_that_keeps_over_bf16_what_eager_fixed_keeps_is_clean():
    # What eager fixed, labelled clean by its script, keeps over bf16 too
    # (1 MiB on the GPU runs).
    out = outputs(LAYERS * COPY, LAYERS * COPY, fixed_extra=COPY)
    out["compiled-function-seed-t64"] = stdout("seed", BASE_END + COPY + LAYERS * COPY,
                                               BASE_FORWARD + COPY + LAYERS * COPY)
    out["function-fixed-t64"] = stdout("fixed", 2 * BASE_END + COPY, 2 * BASE_FORWARD + COPY)
    out["bf16-t64"] = stdout("bf16", 2 * BASE_END, 2 * BASE_FORWARD)
    labels, unknown = record.compiled_labels(out, NAMES)
    assert unknown == {}
    assert labels["compiled-function-fixed-t64"] == []
    assert plugins(labels["compiled-function-seed-t64"]) == [
        "transpose-cache-retention", "weight-copy-accumulation"]
    # More than eager fixed keeps: no truth.
    out["function-fixed-t64"] = stdout("fixed", 2 * BASE_END + COPY // 2,
                                       2 * BASE_FORWARD + COPY // 2)
    labels, unknown = record.compiled_labels(out, NAMES)
    assert "eager fixed: %d B" % (COPY // 2) in unknown["compiled-function-fixed-t64"]


def test_a_group_missing_its_bf16_run_has_no_truth():
    out = outputs(LAYERS * COPY, LAYERS * COPY)
    del out["compiled-bf16-t64"]
    labels, unknown = record.compiled_labels(out, NAMES[:2])
    assert "compiled-bf16-t64" in unknown["compiled-function-seed-t64"]


def write_proofs(root, out):
    """gpu-compiled-check's OUT/runs as the proofs keep them: per run its
    traces, the workload's stdout and command."""
    runs = {}
    for name, text in out.items():
        proof, mode = record.PROOF_RUNS[name]
        d = root / "runs" / proof / mode
        d.mkdir(parents=True)
        (d / "workload.stdout").write_text(text)
        script = os.path.join(os.path.dirname(record.HERE), "gpu", "fsdp2_fp8_train.py")
        (d / "workload.command").write_text(json.dumps(
            ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node", "2", script, "--mode", mode.split("-")[0], "--compile", "inplace"]))
        for r in range(2):
            (d / ("rank%d.trace" % r)).write_bytes(b"trace %s %d" % (name.encode(), r))
        runs[name] = d
    return root / "runs"


def test_compiled_runs_are_taken_from_a_proofs_kept_runs_with_labels_from_memory(tmp_path):
    out = outputs(0, LAYERS * COPY)  # the compiled graph recomputes the forward copies
    for impl in ("subclass",):
        out["compiled-%s-seed-t64" % impl] = out["compiled-function-seed-t64"]
        out["compiled-%s-fixed-t64" % impl] = out["compiled-function-fixed-t64"]
    runs = write_proofs(tmp_path, out)
    written, left_out = record.from_proofs(str(runs), str(tmp_path / "corpus"),
                                           ["2026-12-07", "H200", "torch 2.11"])
    assert left_out == {}
    assert sorted(written) == sorted(record.PROOF_RUNS)
    seed = json.loads((tmp_path / "corpus" / "compiled-function-seed-t64" / "labels.json").read_text())
    assert plugins(seed["problems"]) == ["transpose-cache-retention"]
    assert seed["command"][:6] == ["allocscope", "run", "--", "-m", "torch.distributed.run",
                                   "--standalone"]
    assert "tests/gpu/fsdp2_fp8_train.py" in seed["command"]
    assert seed["recorded"]["gpu"] == "H200" and seed["ranks"] == 2
    trace = tmp_path / "corpus" / "compiled-subclass-fixed-t64" / "rank1.trace"
    assert trace.read_bytes() == b"trace compiled-subclass-fixed-t64 1"


def test_a_proof_group_without_truth_is_left_out_of_the_corpus(tmp_path):
    out = outputs(COPY // 2, LAYERS * COPY)  # neither the script's bytes nor nothing
    runs = write_proofs(tmp_path, out)
    written, left_out = record.from_proofs(str(runs), str(tmp_path / "corpus"))
    assert written == ["compiled-bf16-t64"]
    assert "neither" in left_out["compiled-function-seed-t64"]
    assert left_out["compiled-subclass-seed-t64"].startswith("not in ")
    assert not (tmp_path / "corpus" / "compiled-function-seed-t64").exists()
