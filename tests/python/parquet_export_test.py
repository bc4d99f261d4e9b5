#!/usr/bin/env python3
"""`allocscope export --format parquet` read by a real engine (meson test
parquet_export, pytest through tests/python/run_pytest.py).

A 4-rank run of the simulated training harness under `allocscope run` is
exported to Parquet, then DuckDB, through Node (@duckdb/node-api and
tests/python/parquet_query.mjs), answers cross-rank questions from the
files alone: events per rank, the top layers by live bytes at each rank's
peak and over all ranks (from the peak_live table, and again from the
events table's alloc/free pairs), each rank's peak, the findings and the
stacks. Every answer must equal what `allocscope report --format json`
says. Then the errors: no DuckDB library, a library that is not DuckDB, an
output directory that exists or cannot be written, two runs of one name.

Environment (tests/meson.build): E2E_CLI, HARNESS, DUCKDB_DEPS (the
directory `tools/setup-deps --tests` runs `npm install --prefix` in, with
node_modules/@duckdb/node-api and node_modules/@duckdb/
node-bindings-linux-<arch>/libduckdb.so), NODE (node, when meson found it);
ALLOCSCOPE_DUCKDB, when set, names the libduckdb.so that allocscope uses.
Skips where node, the npm packages or libduckdb.so are missing.
"""

import collections
import ctypes.util
import glob
import json
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

CLI = os.environ["E2E_CLI"]
HARNESS = os.environ["HARNESS"]
DEPS = os.environ.get("DUCKDB_DEPS", "")
QUERY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parquet_query.mjs")
SHAPE = ["--backend", "sim", "--ranks", "4", "--layers", "2", "--steps", "3", "--warmup", "1",
         "--recipe", "delayed", "--te", "seed"]
TABLES = ("events", "stacks", "peak_live", "ranks", "findings")


def node_program():
    for candidate in (os.environ.get("NODE"), shutil.which("node"), shutil.which("nodejs")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def duckdb_library():
    named = os.environ.get("ALLOCSCOPE_DUCKDB")
    if named:
        return named
    # An npm that ignores the packages' "libc" field installs the musl build
    # too; allocscope runs on glibc.
    found = sorted(f for f in glob.glob(os.path.join(DEPS, "node_modules", "@duckdb",
                                                     "node-bindings-linux-*", "libduckdb.so"))
                   if "-musl" not in f)
    return found[0] if found else None


def require_engine():
    """(node, libduckdb.so), or skips the test saying what is missing."""
    node = node_program()
    if not node:
        pytest.skip("no node (tools/setup-deps --tests installs nodejs and npm)")
    api = os.path.join(DEPS, "node_modules", "@duckdb", "node-api", "package.json")
    if not DEPS or not os.path.exists(api):
        pytest.skip("no @duckdb/node-api under %r (tools/setup-deps --tests installs it with npm)"
                    % DEPS)
    lib = duckdb_library()
    if not lib or not os.path.exists(lib):
        pytest.skip("no libduckdb.so (ALLOCSCOPE_DUCKDB, or node_modules/@duckdb/"
                    "node-bindings-linux-*/ under %r)" % DEPS)
    return node, lib


def env_with(**extra):
    env = dict(os.environ)
    for var in ("LD_PRELOAD", "ALLOCSCOPE_OUT", "ALLOCSCOPE_PLUGINS", "ALLOCSCOPE_DUCKDB"):
        env.pop(var, None)
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def run(cmd, env=None, stdin=None, timeout=300):
    return subprocess.run(cmd, env=env if env is not None else env_with(), input=stdin,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


def export(paths, out, lib, *extra):
    return run([CLI, "export"] + list(paths) + ["--format", "parquet", "-o", out] + list(extra),
               env_with(ALLOCSCOPE_DUCKDB=lib))


def sql_path(path):
    return "'" + path.replace("'", "''") + "'"


def views(out):
    """CREATE VIEW <table> over the export's Parquet files, Hive-partitioned."""
    return ["CREATE VIEW %s AS SELECT * FROM read_parquet(%s, hive_partitioning = true, "
            "hive_types = {'run': VARCHAR, 'rank': INTEGER})"
            % (t, sql_path(os.path.join(out, t, "*", "*", "*.parquet"))) for t in TABLES]


def query(node, out, queries):
    p = run([node, QUERY_SCRIPT, DEPS],
            stdin=json.dumps({"setup": views(out), "queries": queries}))
    assert p.returncode == 0, "DuckDB (node) failed: %s" % p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def recorded():
    """A 4-rank sim harness run, its JSON report and its findings file."""
    root = tempfile.mkdtemp(prefix="allocscope-parquet-")
    rundir = os.path.join(root, "fleet-run")
    p = run([CLI, "run", "--out", rundir, "--", HARNESS] + SHAPE)
    assert p.returncode == 0, "allocscope run failed: %s" % p.stderr
    r = run([CLI, "report", rundir, "--format", "json"])
    assert r.returncode == 0, "report failed: %s" % r.stderr
    with open(os.path.join(rundir, "findings.json")) as f:
        findings = json.load(f)
    yield {"root": root, "run": rundir, "report": json.loads(r.stdout), "findings": findings}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def exported(recorded):
    """The run exported to Parquet (allocscope's own DuckDB calls)."""
    node, lib = require_engine()
    out = os.path.join(recorded["root"], "export")
    p = export([recorded["run"]], out, lib)
    assert p.returncode == 0, p.stderr
    assert "wrote %s (parquet: " % out in p.stderr, p.stderr
    return dict(recorded, node=node, lib=lib, out=out, stderr=p.stderr)


def by_rank(report):
    return {r["rank"]: r for r in report["ranks"]}


def owner_pool(rank_report):
    return next(p for p in rank_report["pools"] if p["pool"] == rank_report["owner_pool"])


def test_layout_is_hive_partitioned_by_run_and_rank(exported):
    out = exported["out"]
    assert sorted(os.listdir(out)) == sorted(TABLES)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    for table in TABLES:
        runs = os.listdir(os.path.join(out, table))
        assert runs == ["run=fleet-run"], (table, runs)
    ranks = sorted(os.listdir(os.path.join(out, "events", "run=fleet-run")))
    assert ranks == ["rank=0", "rank=1", "rank=2", "rank=3"]
    files = os.listdir(os.path.join(out, "events", "run=fleet-run", "rank=2"))
    assert files and all(f.endswith(".parquet") for f in files), files
    # Nothing else is left beside it (the staging directory is renamed).
    assert sorted(os.listdir(exported["root"])) == ["export", "fleet-run"]


def test_events_per_rank_match_the_report(exported):
    got = query(exported["node"], exported["out"], {
        "per_rank": "SELECT run, rank, count(*) AS n, count(DISTINCT seq) AS seqs, "
                    "count(*) FILTER (WHERE kind = 'alloc') AS allocs "
                    "FROM events GROUP BY run, rank ORDER BY rank",
        "ranks": "SELECT rank, events FROM ranks ORDER BY rank",
    })
    report = by_rank(exported["report"])
    assert [int(r["rank"]) for r in got["per_rank"]] == sorted(report)
    for row in got["per_rank"]:
        rank = int(row["rank"])
        assert row["run"] == "fleet-run"
        assert int(row["n"]) == report[rank]["events"], row
        assert int(row["seqs"]) == report[rank]["events"], row
        kinds = report[rank]["events_by_kind"]
        allocs = sum(n for what, n in kinds.items() if what.startswith("alloc"))
        assert int(row["allocs"]) == allocs, (row, kinds)
    assert {int(r["rank"]): int(r["events"]) for r in got["ranks"]} == {
        k: v["events"] for k, v in report.items()}


def expected_top_layers(report, n):
    """Per rank: the n layers with the most live bytes at the rank's peak,
    from the report's (layer, phase) rows."""
    top = {}
    for r in report["ranks"]:
        layers = collections.Counter()
        for t in r["tags"]:
            if t["count_at_peak"]:
                layers[t["layer"]] += t["at_peak"]
        ordered = sorted(layers.items(), key=lambda kv: (-kv[1], kv[0]))
        top[r["rank"]] = ordered[:n]
    return top


def test_top_layers_at_each_ranks_peak_match_the_report(exported):
    report = exported["report"]
    got = query(exported["node"], exported["out"], {
        # From the peak_live table allocscope computes.
        "top": "SELECT rank, layer, sum(bytes) AS bytes FROM peak_live "
               "GROUP BY rank, layer "
               "QUALIFY row_number() OVER (PARTITION BY rank ORDER BY sum(bytes) DESC, layer) <= 3 "
               "ORDER BY rank, bytes DESC, layer",
        # Over all ranks.
        "fleet": "SELECT layer, sum(bytes) AS bytes FROM peak_live GROUP BY layer "
                 "ORDER BY bytes DESC, layer",
        # The same from the events alone: the owner pool's allocations made
        # up to the peak and not freed by then.
        "from_events": "SELECT e.rank, e.layer, e.phase, sum(e.size) AS bytes, count(*) AS count "
                       "FROM events e JOIN ranks r USING (run, rank, pid) "
                       "WHERE e.kind = 'alloc' AND e.pool = r.owner_pool "
                       "AND e.seq <= r.peak_seq AND coalesce(e.free_seq > r.peak_seq, true) "
                       "GROUP BY e.rank, e.layer, e.phase ORDER BY e.rank, e.layer, e.phase",
        "peak_live": "SELECT rank, layer, phase, bytes, count FROM peak_live "
                     "ORDER BY rank, layer, phase",
        "peaks": "SELECT rank, owner_pool, peak_bytes, peak_seq, peak_step, "
                 "(SELECT sum(bytes) FROM peak_live p WHERE p.run = r.run AND p.rank = r.rank) "
                 "AS live FROM ranks r ORDER BY rank",
    })
    top = collections.defaultdict(list)
    for row in got["top"]:
        top[int(row["rank"])].append((row["layer"], int(row["bytes"])))
    assert dict(top) == expected_top_layers(report, 3)
    assert all(len(v) == 3 for v in top.values()), top

    fleet = collections.Counter()
    for t in report["merged_tags"]:
        fleet[t["layer"]] += t["at_peak"]
    assert [(r["layer"], int(r["bytes"])) for r in got["fleet"]] == sorted(
        ((k, v) for k, v in fleet.items() if v or any(
            t["layer"] == k and t["count_at_peak"] for t in report["merged_tags"])),
        key=lambda kv: (-kv[1], kv[0]))

    rows = {(r["rank"], t["layer"], t["phase"]): (t["at_peak"], t["count_at_peak"])
            for r in report["ranks"] for t in r["tags"] if t["count_at_peak"]}
    for name in ("peak_live", "from_events"):
        got_rows = {(int(r["rank"]), r["layer"], r["phase"]): (int(r["bytes"]), int(r["count"]))
                    for r in got[name]}
        assert got_rows == rows, name

    for row in got["peaks"]:
        rank = by_rank(report)[int(row["rank"])]
        pool = owner_pool(rank)
        assert row["owner_pool"] == rank["owner_pool"]
        assert int(row["peak_bytes"]) == pool["peak_bytes"] == int(row["live"]), row
        assert int(row["peak_seq"]) == pool["peak_seq"]
        assert int(row["peak_step"]) == pool["peak_step"]


def test_findings_match_the_findings_file(exported):
    got = query(exported["node"], exported["out"], {
        "findings": "SELECT rank, plugin, severity, layer, phase, bytes, count, summary "
                    "FROM findings ORDER BY ALL",
    })
    expected = sorted(
        (f["rank"], f["plugin"], f["severity"], f["layer"], f.get("phase", ""), f["bytes"],
         f["count"], f["summary"]) for f in exported["findings"]["findings"])
    assert expected, "the harness run should have findings"
    assert sorted((int(r["rank"]), r["plugin"], r["severity"], r["layer"], r["phase"],
                   int(r["bytes"]), int(r["count"]), r["summary"])
                  for r in got["findings"]) == expected


def test_stacks_are_the_reports_frames(exported):
    report = exported["report"]
    got = query(exported["node"], exported["out"], {
        "dangling": "SELECT count(*) AS n FROM events e WHERE e.stack_id IS NOT NULL AND NOT EXISTS "
                    "(SELECT 1 FROM stacks s WHERE s.run = e.run AND s.rank = e.rank "
                    "AND s.pid = e.pid AND s.stack_id = e.stack_id)",
        "frames": "SELECT rank, stack_id, list(frame ORDER BY depth) AS frames FROM stacks "
                  "GROUP BY rank, stack_id",
    })
    assert int(got["dangling"][0]["n"]) == 0
    frames = {(int(r["rank"]), int(r["stack_id"])): r["frames"] for r in got["frames"]}
    compared = 0
    for r in report["ranks"]:
        for stack_id, lines in r["stacks"].items():
            assert frames[(r["rank"], int(stack_id))] == lines, (r["rank"], stack_id)
            compared += 1
    assert compared > 0


def test_several_runs_are_partitions_of_one_dataset(exported, tmp_path):
    other = str(tmp_path / "second-run")
    shutil.copytree(exported["run"], other)
    out = str(tmp_path / "fleet")
    p = export([exported["run"], other], out, exported["lib"], "--rank", "1")
    assert p.returncode == 0, p.stderr
    got = query(exported["node"], out, {
        "runs": "SELECT run, rank, count(*) AS n FROM events GROUP BY ALL ORDER BY ALL",
        "findings": "SELECT DISTINCT rank FROM findings",
    })
    n = by_rank(exported["report"])[1]["events"]
    assert [(r["run"], int(r["rank"]), int(r["n"])) for r in got["runs"]] == [
        ("fleet-run", 1, n), ("second-run", 1, n)]
    assert {int(r["rank"]) for r in got["findings"]} <= {1}

    # --run names one run; two directories of one name need it.
    named = str(tmp_path / "named")
    p = export([os.path.join(exported["run"], "rank0.trace")], named, exported["lib"],
               "--run", "job 42")
    assert p.returncode == 0, p.stderr
    got = query(exported["node"], named, {"runs": "SELECT DISTINCT run, rank FROM events"})
    assert [(r["run"], int(r["rank"])) for r in got["runs"]] == [("job 42", 0)]
    # A trace without findings: the findings table is there, without rows.
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(os.path.join(exported["run"], "rank0.trace"), str(lonely))
    p = export([str(lonely)], str(tmp_path / "lonely.parquet"), exported["lib"])
    assert p.returncode == 0, p.stderr
    got = query(exported["node"], str(tmp_path / "lonely.parquet"), {
        "findings": "SELECT count(*) AS n FROM findings",
        "events": "SELECT run, count(*) AS n FROM events GROUP BY run",
    })
    assert int(got["findings"][0]["n"]) == 0
    assert [(r["run"], int(r["n"])) for r in got["events"]] == [
        ("lonely", by_rank(exported["report"])[0]["events"])]

    twin = str(tmp_path / "elsewhere" / "fleet-run")
    shutil.copytree(exported["run"], twin)
    p = export([exported["run"], twin], str(tmp_path / "twins"), exported["lib"])
    assert p.returncode == 2
    assert "two runs are named fleet-run" in p.stderr and "--run NAME" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "twins")


def test_without_duckdb_one_message_says_how_to_get_it(recorded, tmp_path):
    out = str(tmp_path / "out")
    missing = str(tmp_path / "nowhere" / "libduckdb.so")
    p = export([recorded["run"]], out, missing)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("allocscope: --format parquet needs DuckDB's C library"), p.stderr
    assert "ALLOCSCOPE_DUCKDB=" + missing in lines[0]
    assert "npm pack @duckdb/node-bindings-linux-x64" in lines[0]
    assert not os.path.exists(out) and os.listdir(str(tmp_path)) == []

    # Not set: the library search path, which has none here.
    if not ctypes.util.find_library("duckdb"):
        p = run([CLI, "export", recorded["run"], "--format", "parquet", "-o", out],
                env_with(LD_LIBRARY_PATH=str(tmp_path)))
        assert p.returncode == 2
        assert "libduckdb.so is not on the library search path" in p.stderr, p.stderr
        assert not os.path.exists(out)

    # A library that is not DuckDB's.
    not_duckdb = ctypes.util.find_library("m") or "libm.so.6"
    p = export([recorded["run"]], out, not_duckdb)
    assert p.returncode == 2
    assert "is not DuckDB's C library (it has no duckdb_" in p.stderr, p.stderr
    assert not os.path.exists(out)


def test_output_that_exists_or_cannot_be_written_is_refused(exported, tmp_path):
    lib = exported["lib"]
    run_dir = exported["run"]
    before = sorted(os.listdir(run_dir))

    # The run directory itself, a previous export, a file: never written over.
    for target in (run_dir, exported["out"], os.path.join(run_dir, "rank0.trace")):
        p = export([run_dir], target, lib)
        assert p.returncode == 2, (target, p.stderr)
        assert "exists: the Parquet export writes a new directory" in p.stderr, p.stderr
    assert sorted(os.listdir(run_dir)) == before

    # Under a regular file: nothing can be created there.
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    p = export([run_dir], str(blocker / "out"), lib)
    assert p.returncode == 2
    assert p.stderr.startswith("allocscope: cannot write ") and len(
        p.stderr.strip().splitlines()) == 1, p.stderr

    # A directory without write permission (root writes anyway).
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        try:
            p = export([run_dir], str(locked / "out"), lib)
            assert p.returncode == 2
            assert "cannot write " in p.stderr and "Permission denied" in p.stderr, p.stderr
        finally:
            locked.chmod(0o700)

    # No -o: a directory is needed.
    p = run([CLI, "export", run_dir, "--format", "parquet"], env_with(ALLOCSCOPE_DUCKDB=lib))
    assert p.returncode == 2 and "give -o DIR" in p.stderr, p.stderr

    # An empty directory is replaced by the export, missing parents made.
    empty = tmp_path / "empty"
    empty.mkdir()
    p = export([run_dir], str(empty), lib, "--rank", "0")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(empty)) == sorted(TABLES)
    deep = tmp_path / "new" / "parents" / "out"
    p = export([run_dir], str(deep), lib, "--rank", "0")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["a-file", "empty", "new"] + (
        ["locked"] if os.geteuid() != 0 else [])
