"""Compiled and eager runs must agree on findings wherever their memory
agrees (tests/gpu/run_torch_fsdp2.py --compile --against-eager,
against_eager): per rank, where torch.cuda.memory_allocated() after forward
and at the step's end match eager's, the weight-copy and transpose errors
and warnings must be eager's; where memory differs nothing is compared."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpu"))
import run_torch_fsdp2 as proof  # noqa: E402

COPY = 786432


def finding(plugin, rank, layer, nbytes, severity="error"):
    return {"plugin": plugin, "rank": rank, "layer": layer, "bytes": nbytes,
            "severity": severity, "phase": "forward", "summary": ""}


def findings(*fs):
    return {"findings": list(fs)}


SEED = [finding("weight-copy-accumulation", r, "layers.%d" % i, COPY + 2048)
        for r in range(2) for i in range(2)]
MEMORY = {0: (50_000_000, 80_000_000), 1: (50_000_000, 80_000_000)}


def compare(compiled, eager, compiled_memory=MEMORY, eager_memory=MEMORY):
    problems = []
    proof.against_eager("seed", compiled, eager, compiled_memory, eager_memory, 2, problems)
    return problems


def test_the_same_findings_where_memory_agrees_pass():
    assert compare(findings(*SEED), findings(*SEED)) == []


def test_a_finding_eager_gives_and_the_compiled_run_does_not_is_a_failure():
    problems = compare(findings(*SEED[1:]), findings(*SEED))
    assert len(problems) == 1
    assert "eager only" in problems[0] and "layers.0" in problems[0]


def test_a_finding_only_the_compiled_run_gives_is_a_failure():
    extra = finding("transpose-cache-retention", 1, "layers.1", COPY)
    problems = compare(findings(*SEED, extra), findings(*SEED))
    assert problems == ["seed rank 1: compiled only (memory as eager's): "
                        "transpose-cache-retention layers.1 error %d B" % COPY]


def test_bytes_beyond_the_scales_slack_are_a_failure():
    bigger = dict(SEED[0], bytes=2 * COPY)
    problems = compare(findings(bigger, *SEED[1:]), findings(*SEED))
    assert len(problems) == 1 and "compiled %d B, eager %d B" % (2 * COPY, COPY + 2048) in problems[0]


def test_where_memory_differs_nothing_is_compared():
    kept_less = {0: (50_000_000, 80_000_000 - 2 * COPY), 1: MEMORY[1]}
    problems = compare(findings(*SEED[2:]), findings(*SEED), compiled_memory=kept_less)
    assert problems == []  # rank 0 differs in memory; rank 1 agrees in both


def test_infos_are_not_compared():
    info = finding("weight-copy-accumulation", 0, "layers.0", 512, severity="info")
    assert compare(findings(*SEED, info), findings(*SEED)) == []


def test_a_rank_without_memory_lines_is_a_failure():
    problems = compare(findings(*SEED), findings(*SEED), compiled_memory={1: MEMORY[1]})
    assert problems and "no memory_allocated()" in problems[0]
