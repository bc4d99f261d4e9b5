#!/usr/bin/env python3
"""The Python gate without torch and without a GPU (meson test
python_gate, pytest through tests/python/run_pytest.py).

* allocscope.pytest: an inner pytest session under `allocscope run` with
  -p allocscope.pytest, on a file whose tests make FP8-style weight copies
  through the C API (a registered parameter, a block declared derived from
  it inside the layer's forward): a marked test that keeps its copies
  fails listing the finding, one that frees them passes, an unmarked test
  that keeps them is left alone, an unknown plugin fails the marked test
  in one line; without the interposer marked tests fail with one line
  saying how to run and unmarked ones pass;
* allocscope.check() in a script, under `allocscope run` and without it;
  failing closed when a plugin does not load or none is found.

The run's own plugins are off (--plugins none): what is found is the
checks' alone. Environment (tests/meson.build): E2E_CLI,
ALLOCSCOPE_PYTHON_DIR.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest

CLI = os.environ["E2E_CLI"]
PYDIR = os.environ["ALLOCSCOPE_PYTHON_DIR"]
PY = sys.executable

# A layer's forward that makes a 1 MiB copy of its weight, as a block of
# the caching allocator declared derived from the weight, and keeps it past
# the forward or frees it in the forward.
WEIGHT_COPY = textwrap.dedent(
    """
    import ctypes

    import allocscope

    NUMEL = 1 << 20


    def layer_forward(layer, keep_copy, kept):
        allocscope.register_param(layer, "weight", NUMEL, "bf16")
        with allocscope.scope(layer, "forward"):
            copy = ctypes.create_string_buffer(NUMEL)
            address = ctypes.addressof(copy)
            allocscope.block_alloc(address, NUMEL)
            allocscope.derived(address, layer, "weight", "cast to fp8_e4m3")
            if keep_copy:
                kept.append(copy)
            else:
                allocscope.block_free(address)
    """
)

INNER_TESTS = WEIGHT_COPY + textwrap.dedent(
    """
    import pytest

    from allocscope.pytest import FindingsFailed

    KEPT = []


    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"], fail_on="warning")
    def test_marked_keeps_copies():
        layer_forward("layers.0", True, KEPT)


    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"], fail_on="warning")
    def test_marked_frees_copies():
        layer_forward("layers.1", False, KEPT)


    def test_unmarked_keeps_copies():
        layer_forward("layers.2", True, KEPT)


    @pytest.mark.allocscope(plugins="no-such-plugin")
    def test_marked_unknown_plugin():
        pass


    @pytest.mark.allocscope("weight-copy-accumulation")
    def test_marked_with_a_positional_argument():
        pass


    # A test meant to show the problem: it passes only when the check
    # finds it.
    @pytest.mark.xfail(raises=FindingsFailed, strict=True)
    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"])
    def test_expected_to_keep_copies():
        layer_forward("layers.3", True, KEPT)


    @pytest.mark.xfail(raises=FindingsFailed, strict=True)
    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"])
    def test_expected_to_keep_copies_but_frees_them():
        layer_forward("layers.4", False, KEPT)


    @pytest.mark.xfail(raises=FindingsFailed, strict=True)
    @pytest.mark.allocscope(plugins=["no-such-plugin"])
    def test_expected_to_keep_copies_but_not_checked():
        layer_forward("layers.5", True, KEPT)
    """
)


def clean_env(**extra):
    env = dict(os.environ)
    for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT", "ALLOCSCOPE_LIB",
                "ALLOCSCOPE_PLUGINS", "ALLOCSCOPE_PLUGIN_DIR", "ALLOCSCOPE_PLUGIN_OPTIONS",
                "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONSTARTUP"):
        env.pop(var, None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run(cmd, env, cwd):
    return subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)


def under_allocscope(scratch, command, *run_args):
    """`allocscope run --plugins none [run_args] -- command` in scratch."""
    out = os.path.join(scratch, "out-%d" % len(os.listdir(scratch)))
    return run([CLI, "run", "--out", out, "--plugins", "none"] + list(run_args) + ["--"] + command,
               clean_env(), scratch)


@pytest.fixture
def scratch():
    """A fresh directory, removed after the test."""
    path = tempfile.mkdtemp(prefix="allocscope-pygate-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ the pytest plugin


def inner_session(scratch, preloaded):
    """Runs INNER_TESTS in a pytest session of its own with -p
    allocscope.pytest; returns (process, {test name: (outcome, message)})."""
    with open(os.path.join(scratch, "inner_test.py"), "w") as f:
        f.write(INNER_TESTS)
    junit = os.path.join(scratch, "inner.xml")
    command = [PY, "-m", "pytest", "-p", "allocscope.pytest", "-p", "no:cacheprovider",
               "--junitxml", junit, "inner_test.py"]
    if preloaded:
        p = under_allocscope(scratch, command)
    else:
        p = run(command, clean_env(PYTHONPATH=PYDIR), scratch)
    assert os.path.exists(junit), "the inner session ran no tests:\n%s\n%s" % (p.stdout, p.stderr)
    results = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if case.find("skipped") is not None:
            results[case.get("name")] = ("xfailed", case.find("skipped").get("message") or "")
        elif failure is None:
            results[case.get("name")] = ("passed", "")
        else:
            # pytest 8 and later prefix pytest.fail's message with "Failed: "
            # in the JUnit XML; 7 does not.
            message = failure.get("message") or ""
            if message.startswith("Failed: "):
                message = message[len("Failed: "):]
            results[case.get("name")] = ("failed", message)
    return p, results


def test_a_marked_test_that_keeps_weight_copies_fails_listing_the_finding(scratch):
    p, results = inner_session(scratch, preloaded=True)
    outcome, message = results["test_marked_keeps_copies"]
    assert outcome == "failed", "passed although it keeps its copy:\n" + p.stdout
    assert "finding(s) at or above warning" in message, message
    assert "weight-copy-accumulation [error] layers.0 (forward)" in message, message
    assert p.returncode == 1, "inner pytest exit status %d" % p.returncode


def test_a_failing_marked_test_lists_the_stack_of_the_copy_under_its_finding(scratch):
    p, results = inner_session(scratch, preloaded=True)
    outcome, message = results["test_marked_keeps_copies"]
    assert outcome == "failed", "passed although it keeps its copy:\n" + p.stdout
    lines = message.splitlines()
    at = [i for i, line in enumerate(lines) if "weight-copy-accumulation [error]" in line]
    assert at, message
    finding = lines[at[0]]
    indent = len(finding) - len(finding.lstrip())
    stack = []
    for line in lines[at[0] + 1:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        stack.append(line.strip())
    assert stack, "no stack under the finding:\n" + message
    # The Python function of the test file that made the kept copy.
    assert any(frame.startswith("layer_forward (") and "inner_test.py:" in frame
               for frame in stack), message
    # It starts at the program's code, not allocscope's own frames.
    first = stack[0]
    assert not first.startswith("allocscope"), message
    assert "liballocscope" not in first and "/allocscope/" not in first, message


def test_a_marked_test_that_frees_its_copies_passes_and_unmarked_tests_are_left_alone(scratch):
    p, results = inner_session(scratch, preloaded=True)
    assert results["test_marked_frees_copies"] == ("passed", ""), p.stdout
    # It keeps its copy, as the failing one does, but nothing checks it.
    assert results["test_unmarked_keeps_copies"] == ("passed", ""), p.stdout


def test_a_marked_test_with_a_plugin_that_does_not_load_fails_in_one_line(scratch):
    p, results = inner_session(scratch, preloaded=True)
    outcome, message = results["test_marked_unknown_plugin"]
    assert outcome == "failed", "a check that could not look passed:\n" + p.stdout
    assert message.startswith("allocscope check did not run: "), message
    assert "no-such-plugin" in message and "\n" not in message.strip(), message


def test_a_test_expected_to_fail_on_findings_passes_only_when_the_check_finds_them(scratch):
    p, results = inner_session(scratch, preloaded=True)
    assert results["test_expected_to_keep_copies"][0] == "xfailed", p.stdout
    # strict: a check that finds nothing fails the test (XPASS(strict)).
    outcome, message = results["test_expected_to_keep_copies_but_frees_them"]
    assert outcome == "failed" and "XPASS(strict)" in message, (outcome, message)
    # A check that could not look is not the expected failure.
    outcome, message = results["test_expected_to_keep_copies_but_not_checked"]
    assert outcome == "failed" and "no-such-plugin" in message, (outcome, message)


def test_a_marker_with_arguments_the_check_does_not_take_fails_the_test(scratch):
    p, results = inner_session(scratch, preloaded=True)
    outcome, message = results["test_marked_with_a_positional_argument"]
    assert outcome == "failed", p.stdout
    assert "takes the keyword arguments plugins, options, fail_on only" in message, message


def test_without_the_interposer_marked_tests_fail_saying_how_to_run(scratch):
    p, results = inner_session(scratch, preloaded=False)
    for name in ("test_marked_keeps_copies", "test_marked_frees_copies",
                 "test_marked_unknown_plugin", "test_expected_to_keep_copies_but_not_checked"):
        outcome, message = results[name]
        assert outcome == "failed", "%s passed without the interposer" % name
        assert "\n" not in message.strip(), "more than one line: %r" % message
        assert "liballocscope.so is not loaded" in message, message
        assert "`allocscope run -- python3 -m pytest -p allocscope.pytest" in message, message
    assert results["test_unmarked_keeps_copies"] == ("passed", ""), p.stdout


def test_the_plugins_import_of_pytest_is_the_real_pytest():
    sys.path.insert(0, PYDIR)
    try:
        import allocscope.pytest as plugin
    finally:
        sys.path.remove(PYDIR)
    assert plugin.pytest is sys.modules["pytest"] and plugin.pytest is pytest
    assert plugin.__name__ == "allocscope.pytest"


# ------------------------------------------------------------------ allocscope.check in a script

SCRIPT = WEIGHT_COPY + textwrap.dedent(
    """
    import sys

    kept = []
    plugins = sys.argv[2] if len(sys.argv) > 2 else "weight-copy-accumulation"
    try:
        with allocscope.check(plugins, fail_on=sys.argv[3] if len(sys.argv) > 3 else "error") as c:
            layer_forward("layers.0", sys.argv[1] == "keep", kept)
    except allocscope.CheckFailed as failed:
        assert isinstance(failed, AssertionError)
        print("CheckFailed:\\n%s\\n(end)" % failed)
        sys.exit(1)
    print("passed with %d finding(s): %s" % (len(c.findings), [f.severity for f in c.findings]))
    """
)


def run_script(scratch, preloaded, *args, run_args=()):
    path = os.path.join(scratch, "train.py")
    with open(path, "w") as f:
        f.write(SCRIPT)
    if preloaded:
        return under_allocscope(scratch, [PY, path] + list(args), *run_args)
    return run([PY, path] + list(args), clean_env(PYTHONPATH=PYDIR), scratch)


def check_failed(p):
    """What the script printed of the CheckFailed it caught."""
    assert p.returncode == 1 and "passed with" not in p.stdout, (
        "the check did not fail (exit status %d):\n%s%s" % (p.returncode, p.stdout, p.stderr)
    )
    _, found, rest = p.stdout.partition("CheckFailed:\n")
    assert found, "no CheckFailed:\n" + p.stdout + p.stderr
    return rest[: rest.rindex("\n(end)")]


def test_a_check_in_a_script_raises_on_a_kept_weight_copy(scratch):
    p = run_script(scratch, True, "keep")
    report = check_failed(p)
    assert report.startswith("allocscope: 2 finding(s) at or above error:"), report
    assert "weight-copy-accumulation [error] layers.0 (forward):" in report, report


def test_a_check_in_a_script_passes_when_the_copies_are_freed(scratch):
    p = run_script(scratch, True, "free")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "passed with 0 finding(s)" in p.stdout, p.stdout


def test_findings_below_fail_on_are_listed_but_do_not_fail(scratch):
    p = run_script(scratch, True, "free", "peak-owner", "warning")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "passed with" in p.stdout and "'info'" in p.stdout, p.stdout
    p = run_script(scratch, True, "free", "peak-owner", "info")
    assert "peak-owner [info]" in check_failed(p), p.stdout


def test_a_check_in_a_script_without_the_interposer_says_how_to_run_in_one_line(scratch):
    p = run_script(scratch, False, "free")
    message = check_failed(p)
    assert "\n" not in message, "more than one line: %r" % message
    assert "`allocscope run -- python3 script.py`" in message, message


def test_a_check_whose_plugin_does_not_exist_fails_closed(scratch):
    p = run_script(scratch, True, "keep", "no-such-plugin")
    message = check_failed(p)
    assert message.startswith("allocscope check did not run: ") and "no-such-plugin" in message
    assert "\n" not in message, message


def test_a_check_with_no_plugin_to_run_fails_closed(scratch):
    empty = os.path.join(scratch, "no-plugins")
    os.mkdir(empty)
    p = run_script(scratch, True, "keep", "", run_args=("--plugin-dir", empty))
    message = check_failed(p)
    assert message == "allocscope check did not run: no plugin found in '%s'" % empty, message
