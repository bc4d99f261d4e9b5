"""allocscope's pytest plugin: a test marked @pytest.mark.allocscope runs
inside an allocscope check (allocscope.check) and fails when the detection
plugins find something at or above its level, listing the findings.

    import pytest

    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"], fail_on="warning")
    def test_a_training_step_keeps_no_weight_copies():
        train_step()

The marker takes allocscope.check's arguments: plugins (a list or a comma
list; None: every plugin of the plugin directory), options
({"<plugin>.<key>": value}) and fail_on ("info", "warning", "error";
default "error"). The check covers the test function's body, not its
fixtures. A marked test also fails when the check cannot look (no
liballocscope.so in the process, a plugin that does not load); unmarked
tests are left alone. Failing on findings raises FindingsFailed, so that a
test meant to show a problem can say @pytest.mark.xfail(raises=
FindingsFailed, strict=True) and pass only when the check finds it.

Run pytest under allocscope:

    allocscope run -- python3 -m pytest -p allocscope.pytest tests/

An installed allocscope registers the plugin with pytest (entry point
pytest11), so -p allocscope.pytest is only needed from a source tree.
"""

import functools

import pytest

import allocscope

HOW_TO_RUN = "allocscope run -- python3 -m pytest -p allocscope.pytest ..."

_MARKER_ARGUMENTS = ("plugins", "options", "fail_on")


class FindingsFailed(pytest.fail.Exception):
    """How a marked test fails when its check ran to its end and found
    something at or above its level (a check that could not look fails it
    with pytest.fail's own exception). A test that must fail on findings
    says so with @pytest.mark.xfail(raises=FindingsFailed, strict=True)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "allocscope(plugins=None, options=None, fail_on='error'): run the test inside an "
        "allocscope check and fail it on findings at or above fail_on (allocscope.pytest)",
    )


def _checked(function, marker):
    """`function` run inside allocscope.check with the marker's arguments; a
    check that fails fails the test with its report alone (no traceback
    into this module)."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        __tracebackhide__ = True
        unknown = sorted(set(marker.kwargs) - set(_MARKER_ARGUMENTS))
        if marker.args or unknown:
            pytest.fail(
                "@pytest.mark.allocscope takes the keyword arguments %s only, not %s"
                % (", ".join(_MARKER_ARGUMENTS), ", ".join(unknown) or "positional ones"),
                pytrace=False,
            )
        try:
            with allocscope.check(how_to_run=HOW_TO_RUN, **marker.kwargs):
                return function(*args, **kwargs)
        except allocscope.CheckFailed as failed:
            verdict = failed
        # Raised outside the except: no chained traceback.
        if verdict.findings and not verdict.unchecked:
            raise FindingsFailed(str(verdict), pytrace=False)
        pytest.fail(str(verdict), pytrace=False)

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Runs a marked test function (item.obj, which pytest_pyfunc_call
    calls) inside the check, for this call only."""
    marker = item.get_closest_marker("allocscope")
    if marker is None or not hasattr(item, "obj"):
        yield
        return
    original = item.obj
    item.obj = _checked(original, marker)
    try:
        yield
    finally:
        item.obj = original
