#!/usr/bin/env python3
"""The interposer links nothing from the offline side.

Usage: interposer_has_no_offline_code.py NM LIBALLOCSCOPE_SO LIBANALYZE_A

Every function the offline library (analyze/: analysis, reports, exports,
diff, symbolization, the findings reader) defines must be absent from
liballocscope.so's symbol table. Inline and template code (weak symbols)
is shared by both sides by nature, and functions local to a file may share
a name with another file's: neither is counted.

Whatever library they live in, the offline side's readers never reach
liballocscope.so either: the trace reader, the JSON parser, the findings
reader and merging, and feeding a recorded trace to plugins (the traced
process writes traces and findings; it never reads or merges them).
"""
import subprocess
import sys


def strong_text_symbols(nm, path):
    out = subprocess.run([nm, "-C", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(" ", 2)
        # Functions local to a file (anonymous namespace) may share a name
        # with another file's without being the same code.
        if (len(parts) == 3 and parts[1] in ("T", "t") and "allocscope::" in parts[2]
                and "(anonymous namespace)" not in parts[2]):
            names.add(parts[2])
    return names


# Name prefixes (nm -C) of code that only reads what a run wrote.
READERS = (
    "allocscope::TraceReader::",
    "allocscope::TraceStream::",
    "allocscope::load_trace(",
    "allocscope::json::parse(",
    "allocscope::parse_findings(",
    "allocscope::read_findings_file(",
    "allocscope::merge_findings(",
    "allocscope::feed_trace(",
)


def main():
    nm, so, archive = sys.argv[1:4]
    offline = strong_text_symbols(nm, archive)
    if len(offline) < 50:
        print("FAIL: found only %d functions in %s; is it the offline library?" % (len(offline), archive))
        return 1
    linked = strong_text_symbols(nm, so)
    if not linked:
        print("FAIL: %s has no symbol table to check (stripped?)" % so)
        return 1
    leaked = sorted((offline & linked) | {n for n in linked if n.startswith(READERS)})
    if leaked:
        print("FAIL: %d offline function(s) linked into %s:" % (len(leaked), so))
        for name in leaked[:20]:
            print("  " + name)
        return 1
    print("ok: none of the %d offline functions is in %s (%d allocscope functions there)"
          % (len(offline), so, len(linked)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
