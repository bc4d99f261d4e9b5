"""The pytest gate on a real FSDP2 + FP8 training: tests/gpu/fsdp2_fp8_train.py
run inside tests marked @pytest.mark.allocscope, in the pytest process,
one rank on one GPU (NCCL, world size 1).

    allocscope run -- python3 -m pytest -p allocscope.pytest tests/gpu/fsdp2_fp8_gate_test.py

* seed mode keeps each layer's FP8 weight copy from its forward to its
  backward and caches the transposes: the check must find it, so the test
  is marked xfail(raises=FindingsFailed, strict=True): it passes only when
  the check ran and failed on findings, and the failure lists them.
* fixed mode frees its copies in the phase that made them: the check must
  pass.

Provenance (on by default) is needed: without it the weight detectors can
only match sizes, which gives info findings, never a failure
(run_torch_fsdp2.py checks the same). The seed test fails in one line when
the shim says it is off (--no-provenance, no bridge).
Skipped without torch, a CUDA GPU or FP8 support (sm_89 or newer); tests
of an `allocscope run` without the interposer fail, as marked tests do.
meson test torch_fsdp2_fp8_gate runs it so.
"""

import os
import socket
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
    pytest.skip("this torch has no float8_e4m3fn / _scaled_mm", allow_module_level=True)
if torch.cuda.get_device_capability(0) < (8, 9):
    pytest.skip("FP8 GEMMs need sm_89 or newer (sm_%d%d)" % torch.cuda.get_device_capability(0),
                allow_module_level=True)

from allocscope.pytest import FindingsFailed  # noqa: E402 (after the skips)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp2_fp8_train  # noqa: E402

PLUGINS = ["weight-copy-accumulation", "transpose-cache-retention"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    """The environment of rank 0 of 1; the seed mode's transpose cache
    emptied afterwards, so that one test's copies are not the next's."""
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    yield
    fsdp2_fp8_train._TRANSPOSE_CACHE.clear()


def train(mode, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fsdp2_fp8_train.py", "--mode", mode, "--steps", "2",
                                      "--backend", "nccl"])
    fsdp2_fp8_train.main()


@pytest.mark.xfail(raises=FindingsFailed, strict=True,
                   reason="seed mode keeps FP8 weight copies: the check must find them")
@pytest.mark.allocscope(plugins=PLUGINS, fail_on="warning")
def test_seed_mode_keeps_fp8_weight_copies_and_the_check_finds_them(one_rank, monkeypatch):
    from allocscope.torch import _provenance

    if _provenance._status != "on":
        pytest.fail("provenance is %s: run it under `allocscope run -- python3 -m pytest ...` "
                    "with the PyTorch bridge built; without provenance size matches are info "
                    "findings only" % (_provenance._status or "not installed"), pytrace=False)
    train("seed", monkeypatch)


@pytest.mark.allocscope(plugins=PLUGINS, fail_on="warning")
def test_fixed_mode_frees_its_copies_and_passes_the_check(one_rank, monkeypatch):
    train("fixed", monkeypatch)
