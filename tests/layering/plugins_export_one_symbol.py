#!/usr/bin/env python3
"""A plugin module exports exactly one dynamic symbol: its descriptor.

Usage: plugins_export_one_symbol.py NM SYMBOLS=MODULE...

SYMBOLS is the comma-separated list of the names MODULE must export, and
nothing else (`nm -D --defined-only`): allocscope_plugin_v2 for a version 2
plugin, allocscope_plugin_v1 or allocscope_plugin for a version 1 plugin
(include/allocscope/plugin_v2.h, plugins/README.md). Symbols of no section
(version nodes, nm's type A) and AddressSanitizer's instrumentation (in a
sanitized build) are not the module's own and are not counted.
"""
import subprocess
import sys


def exported(nm, path):
    out = subprocess.run([nm, "-D", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":
            continue
        name = parts[2].split("@")[0]
        if name.startswith("__asan") or name.startswith("__odr_asan"):
            continue
        names.append(name)
    return sorted(names)


def main():
    nm = sys.argv[1]
    failed = 0
    for arg in sys.argv[2:]:
        want, path = arg.split("=", 1)
        expected = sorted(want.split(","))
        got = exported(nm, path)
        if got != expected:
            failed += 1
            print("FAIL: %s exports %d symbol(s), expected only %s: %s"
                  % (path, len(got), ", ".join(expected), " ".join(got[:10])))
        else:
            print("ok: %s exports only %s" % (path, ", ".join(got)))
    if len(sys.argv) < 3:
        print("FAIL: no module given")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
