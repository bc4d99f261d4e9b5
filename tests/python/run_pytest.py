#!/usr/bin/env python3
"""Runs one pytest file as a meson test (tests/meson.build):

    python3 tests/python/run_pytest.py tests/python/shim_test.py

Exit status in meson's terms: 0 when its tests pass, 77 (SKIP) when pytest
is not installed for this interpreter (tools/setup-deps --tests installs
Debian's python3-pytest) or when every test was skipped (pytest itself says
0 for tests that all skip, and 5 for a module that skips as a whole), and
pytest's own status otherwise (1: a test failed; 5 with nothing skipped: no
tests found). Writes nothing into the source tree (no .pytest_cache, no
bytecode).
"""

import os
import sys

SKIP = 77


class _Outcomes:
    """A pytest plugin counting what ran, passed, failed and was skipped."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1
        elif report.when == "call" and report.passed:
            self.passed += 1


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: run_pytest.py TEST_FILE [pytest options]\n")
        return 2
    try:
        import pytest
    except ImportError as e:
        print("SKIP: %s cannot import pytest (%s); tools/setup-deps --tests installs python3-pytest"
              % (sys.executable, e))
        return SKIP
    sys.dont_write_bytecode = True  # pytest's rewritten test modules included
    outcomes = _Outcomes()
    path = os.path.abspath(argv[1])
    status = int(pytest.main(["-v", "-rs", "-p", "no:cacheprovider", path] + argv[2:],
                             plugins=[outcomes]))
    everything_skipped = outcomes.skipped and not outcomes.passed and not outcomes.failed
    if status in (0, 5) and everything_skipped:
        print("SKIP: every test of %s was skipped" % os.path.basename(path))
        return SKIP
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
