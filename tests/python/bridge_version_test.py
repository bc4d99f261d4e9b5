#!/usr/bin/env python3
"""The PyTorch bridge is loaded only into the torch it was built for
(meson test python_bridge_version; SKIP without torch or torch headers):
a copy of the tag hooks library stamped as built for torch 0.0.0 is refused
in one line, and the program runs on, tagged through ctypes, provenance
(on by default) off: the findings file says why, and so does the run's
summary line; the library built for this torch is used, provenance on.

Environment (tests/meson.build): E2E_CLI, SIM_CUDART, FAKE_VERSION_BRIDGE,
REAL_BRIDGE ("" where it is not built).
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

try:
    import torch  # noqa: F401
except Exception as e:
    pytest.skip("python3 cannot import torch (%s)" % e, allow_module_level=True)

CLI = os.environ["E2E_CLI"]

SCRIPT = """
import torch
layer = torch.nn.Linear(8, 8)
layer(torch.ones(2, 8)).sum().backward()
print("done")
"""


def run_with(bridge):
    """The script under a plain `allocscope run` (every plugin, provenance by
    default): (process, findings.json's ranks)."""
    with tempfile.TemporaryDirectory(prefix="allocscope-bridge-version-") as d:
        script = os.path.join(d, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env = dict(os.environ, ALLOCSCOPE_TORCH_BRIDGE=bridge, PYTHONDONTWRITEBYTECODE="1",
                   ALLOCSCOPE_LOG="debug")
        for var in ("PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT", "ALLOCSCOPE_BRIDGE_HOOKS",
                    "PYTORCH_CUDA_ALLOC_CONF"):
            env.pop(var, None)
        p = subprocess.run(
            [CLI, "run", "--out", os.path.join(d, "out"), "--", sys.executable, script],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
            timeout=240)
        with open(os.path.join(d, "out", "findings.json")) as f:
            return p, json.load(f)["ranks"]


def test_a_bridge_built_for_another_torch_is_refused_in_one_line_and_the_run_goes_on():
    p, ranks = run_with(os.environ["FAKE_VERSION_BRIDGE"])
    print(p.stderr)
    assert p.returncode == 0 and "done" in p.stdout
    refused = [line for line in p.stderr.splitlines()
               if "was built for torch 0.0.0 cxx11abi=1" in line and "had sizes only" not in line]
    assert len(refused) == 2, refused  # the bridge's line, and provenance saying why it is off
    assert "this is torch %s" % torch.__version__ in refused[0]
    assert "not loaded" in refused[0]
    assert "tag calls through ctypes" in p.stderr
    assert "tag hooks cannot be used" not in p.stderr
    # Provenance could not run: the findings file says why, and the run's
    # summary says what that means for the weight detectors.
    assert len(ranks) == 1 and ranks[0]["provenance"].startswith("off: "), ranks
    assert "was built for torch 0.0.0 cxx11abi=1" in ranks[0]["provenance"], ranks
    summary = [l for l in p.stderr.splitlines() if "had sizes only" in l]
    assert len(summary) == 1 and summary[0].startswith("allocscope: provenance was off: "), summary


def test_the_bridge_built_for_this_torch_is_used():
    real = os.environ.get("REAL_BRIDGE", "")
    if not real:
        pytest.skip("no tag hooks library built for this torch")
    p, ranks = run_with(real)
    print(p.stderr)
    assert p.returncode == 0 and "done" in p.stdout
    assert "was built for torch" not in p.stderr
    assert "tag calls through the PyTorch bridge" in p.stderr
    assert [r.get("provenance") for r in ranks] == ["on"], ranks
    assert "had sizes only" not in p.stderr
