"""The labelled corpus's compiled runs (tests/corpus/record.py,
compiled_labels): their labels come from torch.cuda.memory_allocated(),
never from the script alone. Seed's labels stand where seed keeps the
script's bytes over fixed, are dropped where it keeps nothing, and a
difference that is neither, or a "fixed" that keeps more than bf16, leaves
the group without truth (the runs are left out of the corpus)."""

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


def test_a_group_missing_its_bf16_run_has_no_truth():
    out = outputs(LAYERS * COPY, LAYERS * COPY)
    del out["compiled-bf16-t64"]
    labels, unknown = record.compiled_labels(out, NAMES[:2])
    assert "compiled-bf16-t64" in unknown["compiled-function-seed-t64"]
