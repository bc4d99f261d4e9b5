#!/usr/bin/env python3
"""include/allocscope/plugin_v1.h is version 1 as it was released.

Usage: plugin_v1_is_frozen.py INSTALLED_HEADER RELEASED_HEADER

RELEASED_HEADER (tests/plugins/v1_frozen/allocscope/plugin_v1.h) is the
header of the commit that first froze version 1, byte for byte. The
installed header may differ only in its opening comment (which says it is
frozen and points to plugin_v2.h) and in layout (whitespace): every
declaration, and every comment after the first, is the released one.
Changes belong in a new version's header (plugin_v2.h, NCCL's practice).
"""
import re
import sys


def body(path):
    text = open(path, encoding="utf-8").read()
    if not text.startswith("/*"):
        raise SystemExit("FAIL: %s does not open with a comment" % path)
    rest = text[text.index("*/") + 2:]
    return re.sub(r"\s+", " ", rest).strip()


def main():
    installed, released = sys.argv[1:3]
    a, b = body(installed), body(released)
    if a != b:
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        print("FAIL: %s differs from version 1 as released (%s) after its opening comment:"
              % (installed, released))
        print("  installed: ..." + a[max(0, i - 60):i + 80])
        print("  released:  ..." + b[max(0, i - 60):i + 80])
        return 1
    print("ok: %s declares version 1 as released" % installed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
