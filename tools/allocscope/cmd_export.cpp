// allocscope export: traces in other tools' formats (analyze/export.h):
// Perfetto / Chrome trace JSON, collapsed stacks for flame graphs, PyTorch
// memory snapshots, Parquet. Every trace is streamed (TraceStream): its
// events are read pass after pass, never held.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analysis.h"
#include "args.h"
#include "cli.h"
#include "export.h"
#include "output_file.h"
#include "progress.h"
#include "symbolize.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kExportHelp =
    R"(usage: allocscope export PATH... --format perfetto|collapsed|memory-viz|parquet
                         [-o FILE|DIR] [--rank R] [--run NAME]

Exports traces for other tools. PATH is an output directory (every *.trace
in it, and its findings.json) or trace files (with findings.<name>.json
next to each when there is one).

formats:
  perfetto     Chrome / Perfetto trace-event JSON (ui.perfetto.dev,
               chrome://tracing): per rank a process with counter tracks of
               live bytes per pool (segment, block, host-pinned) and per
               layer, the layer/phase scopes of every thread as slices, step
               markers, and the findings as instant events
  collapsed    folded stacks of the memory live at the peak, rooted at the
               layer and phase: "layer;phase;frame;...;frame BYTES" for
               flamegraph.pl and speedscope (ranks are added up)
  memory-viz   a PyTorch memory snapshot pickle of one process: segments and
               blocks at the end of the trace and the allocation history, for
               pytorch.org/memory_viz and python -m torch.cuda._memory_viz
  parquet      tables for SQL over many runs and ranks (DuckDB, Spark,
               Polars, pyarrow): a new directory DIR
               with DIR/<table>/run=<run>/rank=<rank>/*.parquet for the tables
               events, stacks, peak_live, ranks and findings (docs/USAGE.md);
               written by DuckDB's library, libduckdb.so, found through
               ALLOCSCOPE_DUCKDB=PATH or the library search path

options:
  --format F   perfetto, collapsed, memory-viz or parquet
  -o FILE      write to FILE instead of standard output; parquet: the new
               directory DIR (required; it must not exist, or be empty)
  --rank R     only the traces of rank R (memory-viz needs one process)
  --run NAME   parquet: the run's name in the tables (default: the name of
               each PATH's directory); every PATH is then one run

exit status: 0 when the export is written (a trace cut short is exported up
to where it ends, with a note), 2 on bad input: no or unreadable trace, a
corrupt trace, no trace of rank R, more than one process for memory-viz, an
-o FILE that cannot be written (nothing is left half-written there), an -o
DIR that exists, or no DuckDB library for parquet.

examples:
  allocscope export allocscope-out --format perfetto -o trace.json
  allocscope export allocscope-out --format collapsed | flamegraph.pl > peak.svg
  allocscope export allocscope-out --rank 0 --format memory-viz -o rank0.pickle
  allocscope export runs/* --format parquet -o fleet.parquet
)";

// The output: standard output, or FILE written through a fresh 0600 file in
// its directory (O_EXCL | O_NOFOLLOW) renamed over FILE when complete, so a
// failed export leaves no half-written FILE behind and a symlink planted at
// FILE is replaced, never written through.
class Output {
  public:
    explicit Output(std::string path) : path_(std::move(path)) {
        if (path_.empty()) return;
        std::error_code ec;
        if (fs::is_directory(path_, ec))
            throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(EISDIR));
        file_.emplace(path_);
    }
    Output(const Output&) = delete;
    Output& operator=(const Output&) = delete;

    std::FILE* file() noexcept { return file_ ? file_->stream() : stdout; }
    const std::string& name() const noexcept { return path_.empty() ? stdout_name_ : path_; }

    // After the writer's flush().
    void commit() {
        if (file_) file_->commit();
    }

  private:
    std::string path_;
    std::string stdout_name_ = "standard output";
    std::optional<OutputFile> file_;
};

struct Selected {
    std::string path;
    TraceHeader header;
};

std::string rank_name(const TraceHeader& h) {
    return h.rank >= 0 ? "rank " + std::to_string(h.rank) : "pid " + std::to_string(h.pid);
}

// The directory of a PATH's run: the PATH itself, or a trace file's
// directory. Its name names the run ("" for the root).
fs::path run_dir_of(const std::string& path) {
    std::error_code ec;
    fs::path p = fs::absolute(path, ec).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    if (!fs::is_directory(p, ec)) p = p.parent_path();
    return p;
}

std::string run_problem(const std::string& name) {
    if (name.empty()) return "--run needs a name";
    for (char c : name) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '/' || u < 0x20 || u == 0x7F)
            return "--run " + printable(name) +
                   ": a run's name is one directory name, without '/' or control characters";
    }
    return {};
}

// One run of a parquet export: its traces and findings files.
struct RunInput {
    std::string name;
    fs::path dir;  // the directory its PATHs are in ("" with --run)
    std::vector<Selected> traces;
    std::vector<std::string> findings;
};

int export_parquet(const std::vector<std::string>& paths, long rank, const std::string& run,
                   const std::string& output) {
    if (output.empty() || output == "-")
        return fail("--format parquet writes a directory: give -o DIR (a new one)");
    // Each PATH is read as its own run, unless --run names one for all.
    std::vector<RunInput> runs;
    std::set<int32_t> ranks;
    std::set<fs::path> seen;
    size_t traces = 0;
    for (const std::string& path : paths) {
        const TraceInputs in = expand_trace_paths({path});
        std::error_code ec;
        // With --run every PATH is that one run, wherever it is.
        const fs::path dir = run.empty() ? run_dir_of(path) : fs::path();
        const std::string name = run.empty() ? dir.filename().string() : run;
        if (name.empty())
            return fail("cannot name the run of " + path + " after its directory: give --run NAME");
        auto it = std::find_if(runs.begin(), runs.end(),
                               [&name](const RunInput& r) { return r.name == name; });
        if (it != runs.end() && it->dir != dir) {
            return fail("two runs are named " + printable(name) + " (" + it->dir.string() +
                        " and " + dir.string() +
                        "): export them one at a time, each with --run NAME");
        }
        if (it == runs.end()) it = runs.insert(runs.end(), RunInput{name, dir, {}, {}});
        for (const std::string& trace : in.traces) {
            const fs::path key = fs::weakly_canonical(trace, ec);
            if (!seen.insert(ec ? fs::path(trace) : key).second) continue;
            const TraceHeader header = TraceReader(trace).header();  // TraceError names the file
            ranks.insert(header.rank);
            if (rank >= 0 && header.rank != rank) continue;
            it->traces.push_back({trace, header});
            ++traces;
        }
        for (const std::string& f : in.findings) {
            if (std::find(it->findings.begin(), it->findings.end(), f) == it->findings.end())
                it->findings.push_back(f);
        }
    }
    if (traces == 0) {
        std::string have;
        for (int32_t r : ranks)
            have += (have.empty() ? "" : ", ") + std::to_string(r);
        return fail("no trace of rank " + std::to_string(rank) + " (ranks: " + have + ")");
    }

    ParquetExport parquet(output);  // DuckDB and DIR are checked here
    std::vector<std::string> notes;
    const auto warn = [&notes](const std::string& w) { notes.push_back(w); };
    Progress progress;
    size_t done = 0;
    for (RunInput& r : runs) {
        std::stable_sort(
            r.traces.begin(), r.traces.end(),
            [](const Selected& a, const Selected& b) { return a.header.rank < b.header.rank; });
        for (const Selected& s : r.traces) {
            progress.show("reading " + s.path, done++, traces);
            TraceStream stream(s.path);
            const TraceAnalysis analysis = analyze(stream);  // its first pass reads the tables
            const TraceTables& t = stream.tables();
            if (t.truncated) notes.push_back(t.truncation_message + "; exported up to there");
            Symbolizer symbolizer(t.modules, warn);
            symbolizer.use_strings(t.strings);
            std::vector<uint32_t> ids;
            for (uint32_t id = 1; id < t.stacks.size(); ++id)
                ids.push_back(id);
            const StackFrames frames = symbolize_stacks(
                t, symbolizer, ids,
                [&progress](size_t d, size_t n) { progress.show("symbolizing", d, n); });
            const std::string what = "exporting " + rank_name(t.header);
            parquet.add(r.name, stream, analysis, frames,
                        [&progress, &what](size_t d, size_t n) { progress.show(what, d, n); });
        }
        if (r.findings.empty()) continue;
        try {
            FindingsFile findings = merge_findings_files(r.findings);
            if (rank >= 0) {
                std::erase_if(findings.findings,
                              [rank](const Finding& f) { return f.rank != rank; });
            }
            parquet.add_findings(r.name, findings.findings);
        } catch (const FindingsError& e) {
            notes.push_back("findings of run " + r.name + " not exported: " + e.what());
        }
    }
    parquet.commit();
    progress.done();
    const size_t run_count = size_t(std::count_if(
        runs.begin(), runs.end(), [](const RunInput& r) { return !r.traces.empty(); }));

    for (const std::string& note : notes)
        std::fprintf(stderr, "allocscope: note: %s\n", printable(note).c_str());
    const ParquetExport::Rows& rows = parquet.rows();
    std::fprintf(stderr,
                 "allocscope: wrote %s (parquet: %llu events, %llu stack frames, %llu findings "
                 "of %zu trace%s in %zu run%s)\n",
                 output.c_str(), static_cast<unsigned long long>(rows.events),
                 static_cast<unsigned long long>(rows.stack_frames),
                 static_cast<unsigned long long>(rows.findings), traces, traces == 1 ? "" : "s",
                 run_count, run_count == 1 ? "" : "s");
    return 0;
}

}  // namespace

int export_command(const std::vector<std::string>& args) {
    long rank = -1;
    std::string format, output, run;
    bool run_given = false;
    Args parser("export", kExportHelp);
    parser.value({"--rank"}, non_negative("--rank", rank, std::numeric_limits<int32_t>::max()))
        .value({"--format"},
               one_of("--format", {"perfetto", "collapsed", "memory-viz", "parquet"}, format))
        .value({"-o"},
               [&output](const std::string& v) {
                   output = v;
                   return v.empty() ? std::string("-o needs a file name") : std::string();
               })
        .value({"--run"}, [&run, &run_given](const std::string& v) {
            run = v;
            run_given = true;
            return run_problem(v);
        });
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& paths = parser.positionals();
    if (paths.empty())
        return fail("export needs a trace file or directory (" + parser.see_help() + ")");
    if (format.empty())
        return fail(
            "export needs --format perfetto, collapsed, memory-viz or parquet (see --help)");
    if (run_given && format != "parquet")
        return fail("--run names the run in the parquet tables; --format " + format +
                    " has no runs");
    if (format == "parquet") return export_parquet(paths, rank, run, output);
    if (const std::string problem = overwrite_problem(output, paths); !problem.empty())
        return fail(problem);

    const TraceInputs in = expand_trace_paths(paths);
    std::vector<Selected> selected;
    std::set<int32_t> ranks;
    for (const std::string& path : in.traces) {
        const TraceHeader header = TraceReader(path).header();  // TraceError names the file
        ranks.insert(header.rank);
        if (rank >= 0 && header.rank != rank) continue;
        selected.push_back({path, header});
    }
    if (selected.empty()) {
        std::string have;
        for (int32_t r : ranks)
            have += (have.empty() ? "" : ", ") + std::to_string(r);
        return fail("no trace of rank " + std::to_string(rank) + " (ranks: " + have + ")");
    }
    if (format == "memory-viz" && selected.size() > 1) {
        std::string have;
        for (const Selected& s : selected)
            have += (have.empty() ? "" : ", ") + rank_name(s.header);
        return fail("memory-viz exports one process, these are " + std::to_string(selected.size()) +
                    " (" + have + "): pick one with --rank R or name one trace file");
    }
    if (format == "memory-viz" && output.empty() && isatty(STDOUT_FILENO))
        return fail("memory-viz writes a binary pickle: give -o FILE");
    std::stable_sort(selected.begin(), selected.end(), [](const Selected& a, const Selected& b) {
        return a.header.rank < b.header.rank;
    });

    std::vector<std::string> notes;
    FindingsFile findings;
    if (format == "perfetto" && !in.findings.empty()) {
        try {
            findings = merge_findings_files(in.findings);
        } catch (const std::exception& e) {
            notes.push_back(std::string("findings not exported: ") + e.what());
        }
    }

    Output out(output);
    ExportWriter writer(out.file(), out.name());
    Progress progress;
    uint64_t events = 0;
    const auto warn = [&notes](const std::string& w) { notes.push_back(w); };
    auto open = [&](const Selected& s, size_t i) {
        progress.show("reading " + s.path, i, selected.size());
        return std::make_unique<TraceStream>(s.path);
    };
    // Once a pass has ended: how the trace ended, and its events.
    auto read = [&](const TraceStream& t) {
        if (t.tables().truncated)
            notes.push_back(t.tables().truncation_message + "; exported up to there");
        events += t.size();
    };
    auto show = [&progress](const std::string& what) {
        return [&progress, what](size_t done, size_t total) { progress.show(what, done, total); };
    };

    if (format == "perfetto") {
        uint64_t base = std::numeric_limits<uint64_t>::max();
        for (const Selected& s : selected)
            base = std::min(base, s.header.start_wall_ns);
        PerfettoExport perfetto(writer, base);
        const bool only = in.traces.size() == 1;
        for (size_t i = 0; i < selected.size(); ++i) {
            const auto t = open(selected[i], i);
            std::vector<const Finding*> mine;
            for (const Finding& f : findings.findings) {
                if (only || f.rank == t->header().rank) mine.push_back(&f);
            }
            perfetto.add(*t, mine, show("exporting " + rank_name(t->header())));
            read(*t);
        }
        perfetto.finish();
    } else if (format == "collapsed") {
        CollapsedExport collapsed;
        for (size_t i = 0; i < selected.size(); ++i) {
            const auto stream = open(selected[i], i);
            const PeakSnapshot peak = live_at_peak(*stream);
            read(*stream);
            const TraceTables& t = stream->tables();
            Symbolizer symbolizer(t.modules, warn);
            symbolizer.use_strings(t.strings);
            const StackFrames frames =
                symbolize_stacks(t, symbolizer, stack_ids(peak.live), show("symbolizing"));
            collapsed.add(t, peak, frames);
        }
        collapsed.write(writer);
    } else {
        const auto stream = open(selected.front(), 0);
        const std::vector<uint32_t> ids = memory_viz_stacks(*stream);
        read(*stream);
        const TraceTables& t = stream->tables();
        Symbolizer symbolizer(t.modules, warn);
        symbolizer.use_strings(t.strings);
        const StackFrames frames = symbolize_stacks(t, symbolizer, ids, show("symbolizing"));
        export_memory_viz(*stream, frames, writer, show("exporting " + rank_name(t.header)));
    }
    writer.flush();
    out.commit();
    progress.done();

    for (const std::string& note : notes)
        std::fprintf(stderr, "allocscope: note: %s\n", printable(note).c_str());
    if (!output.empty()) {
        std::fprintf(stderr, "allocscope: wrote %s (%s, %llu events of %zu trace%s)\n",
                     output.c_str(), format.c_str(), static_cast<unsigned long long>(events),
                     selected.size(), selected.size() == 1 ? "" : "s");
    }
    return 0;
}

}  // namespace allocscope::cli
