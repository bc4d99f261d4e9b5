// allocscope diff: the reference test's comparison of two runs (analyze/diff.h).
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "diff.h"
#include "findings.h"
#include "parallel.h"
#include "progress.h"
#include "report.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kDiffHelp =
    R"(usage: allocscope diff BASE CAND [--forward-threshold B] [--backward-threshold B]
                       [--rank R] [--format text|json] [-o FILE]

Compares two runs the way TransformerEngine's FSDP2 memory test does, for
any pair of runs (BASE: the reference, e.g. a bf16 run; CAND: the run
under test). BASE and CAND are output directories (traces paired by rank)
or one trace file each. Per rank:
  * forward: live bytes after each numbered layer's forward ("layers.N");
    the mean per-layer increment of CAND minus BASE's, against the forward
    threshold (default 50 KiB);
  * backward: live bytes after backward minus after forward, CAND minus
    BASE, against the backward threshold (default 256 KiB);
  * the bytes each (layer, phase) kept alive at the end of its scopes,
    CAND minus BASE.
Live bytes are caching-allocator blocks (memory_allocated), or device
segments when a trace has no block events. The first step is dropped as
warm-up when there are two or more.

What makes the numbers not compare is said first, in "note:" lines (and on
standard error): ranks only one run has, layers only one run's forward has,
different numbers of steps. Runs whose forwards share no layer (different
models) are refused. A directory of several processes without a rank
(pid<PID>.trace) does not pair: name one trace file of each run.

options:
  --forward-threshold B    bytes, e.g. 51200, 50KiB, 1MiB
  --backward-threshold B
  --rank R                 compare rank R of each run only
  --format F               text (default) or json
  -o FILE                  write to FILE instead of standard output

exit status: 0 within the thresholds, 3 when one is exceeded on any rank,
2 on bad input.

example:
  allocscope diff bf16-out fp8-out
)";

// "51200", "50KiB", "1MiB", "2G".
bool parse_bytes(const std::string& text, uint64_t& out) {
    size_t i = 0;
    uint64_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        if (v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + uint64_t(text[i++] - '0');
    }
    if (i == 0) return false;
    const std::string unit = text.substr(i);
    uint64_t scale = 1;
    if (unit == "K" || unit == "KiB")
        scale = 1ull << 10;
    else if (unit == "M" || unit == "MiB")
        scale = 1ull << 20;
    else if (unit == "G" || unit == "GiB")
        scale = 1ull << 30;
    else if (!unit.empty() && unit != "B")
        return false;
    out = v * scale;
    return true;
}

std::vector<std::string> traces_of(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        std::vector<std::string> found = trace_files_in(path);
        if (found.empty()) throw std::runtime_error(path + ": no .trace files in this directory");
        return found;
    }
    if (!fs::exists(path, ec)) throw std::runtime_error(path + ": no such file or directory");
    return {path};
}

}  // namespace

int diff_command(const std::vector<std::string>& args) {
    DiffThresholds thresholds;
    long rank = -1;
    std::string format = "text", output;
    auto bytes = [](const std::string& name, uint64_t& out) {
        return [name, &out](const std::string& v) {
            return parse_bytes(v, out)
                       ? std::string()
                       : name + " expects bytes such as 51200, 50KiB or 1MiB, got '" + v + "'";
        };
    };
    Args parser("diff", kDiffHelp);
    parser.value({"--forward-threshold"}, bytes("--forward-threshold", thresholds.forward))
        .value({"--backward-threshold"}, bytes("--backward-threshold", thresholds.backward))
        .value({"--rank"}, non_negative("--rank", rank, std::numeric_limits<int32_t>::max()))
        .value({"--format"}, one_of("--format", {"text", "json"}, format))
        .value({"-o"}, output);
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& paths = parser.positionals();
    if (paths.size() != 2) return fail("diff needs BASE and CAND (" + parser.see_help() + ")");
    if (const std::string problem = overwrite_problem(output, paths); !problem.empty())
        return fail(problem);
    std::vector<std::string> base_files = traces_of(paths[0]);
    std::vector<std::string> cand_files = traces_of(paths[1]);
    // Ranks from the headers (cheap): --rank's choice, and processes
    // without a rank, which do not pair by rank.
    for (auto* side : {&base_files, &cand_files}) {
        const char* name = side == &base_files ? "BASE" : "CAND";
        std::vector<std::string> kept, rankless;
        std::set<int32_t> ranks;
        for (const std::string& f : *side) {
            const int32_t r = TraceReader(f).header().rank;  // TraceError names the file
            ranks.insert(r);
            if (r < 0) rankless.push_back(fs::path(f).filename().string());
            if (rank < 0 || r == rank) kept.push_back(f);
        }
        // One process without a rank stands for the rank asked for.
        if (rank >= 0 && kept.empty() && side->size() == 1 && rankless.size() == 1) kept = *side;
        if (rank >= 0 && kept.empty()) {
            std::string have;
            for (int32_t r : ranks)
                have +=
                    (have.empty() ? "" : ", ") + (r < 0 ? std::string("none") : std::to_string(r));
            return fail(std::string(name) + " has no trace of rank " + std::to_string(rank) +
                        " (its ranks: " + have + ")");
        }
        if (rank < 0 && rankless.size() > 1) {
            return fail(std::string(name) + " holds " + std::to_string(rankless.size()) +
                        " traces of processes without a rank (" + rankless[0] + ", " + rankless[1] +
                        (rankless.size() > 2 ? ", ..." : "") +
                        "), which do not pair: name one trace file of each run");
        }
        *side = std::move(kept);
    }

    // The traces streamed, side by side, one per core.
    Progress progress;
    std::mutex progress_mutex;
    size_t done = 0;
    const size_t total = base_files.size() + cand_files.size();
    auto measure_all = [&](const std::vector<std::string>& files) {
        std::vector<RunMeasure> measures = parallel_map(files.size(), [&](size_t i) {
            TraceStream t(files[i]);  // TraceError names the file and offset
            RunMeasure m = measure_run(t);
            const std::lock_guard lock(progress_mutex);
            progress.show("measured " + files[i], ++done, total);
            return m;
        });
        std::map<int32_t, RunMeasure> by_rank;
        for (RunMeasure& m : measures)
            by_rank[m.rank] = std::move(m);
        return by_rank;
    };
    std::map<int32_t, RunMeasure> base = measure_all(base_files);
    std::map<int32_t, RunMeasure> cand = measure_all(cand_files);
    progress.done();

    std::vector<RankDiff> diffs;
    std::vector<std::string> notes;
    if (base.size() == 1 && cand.size() == 1) {
        diffs.push_back(diff_runs(base.begin()->second, cand.begin()->second, thresholds));
    } else {
        std::vector<int32_t> only_cand, only_base;
        for (auto& [r, c] : cand) {
            auto b = base.find(r);
            if (b == base.end()) {
                only_cand.push_back(r);
                continue;
            }
            diffs.push_back(diff_runs(b->second, c, thresholds));
        }
        for (const auto& [r, b] : base) {
            if (!cand.count(r)) only_base.push_back(r);
        }
        if (!only_cand.empty())
            notes.push_back(ranks_text(only_cand) + " of CAND " +
                            (only_cand.size() == 1 ? "has" : "have") +
                            " no trace in BASE: not compared");
        if (!only_base.empty())
            notes.push_back(ranks_text(only_base) + " of BASE " +
                            (only_base.size() == 1 ? "has" : "have") +
                            " no trace in CAND: not compared");
    }
    if (diffs.empty()) {
        for (const auto* side : {&base, &cand}) {
            if (side->size() == 1 && side->begin()->first < 0)
                return fail(std::string(side == &base ? "BASE" : "CAND") +
                            " is one process without a rank: name the rank of " +
                            (side == &base ? "CAND" : "BASE") + " to compare it with (--rank R)");
        }
        return fail("BASE and CAND have no rank in common");
    }
    for (const RankDiff& d : diffs) {
        if (d.unrelated) return fail(d.notes.front());
    }
    for (const std::string& n : notes)
        std::fprintf(stderr, "allocscope: note: %s\n", n.c_str());
    {
        std::set<std::string> said;  // alike ranks: one line
        for (const RankDiff& d : diffs) {
            for (const std::string& n : d.notes) {
                if (said.insert(n).second)
                    std::fprintf(stderr, "allocscope: note: %s\n", printable(n).c_str());
            }
        }
    }
    const std::string text = format == "json" ? diff_json(diffs, thresholds, notes)
                                              : diff_text(diffs, thresholds, notes);
    if (output.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
        write_text_file(output, text);
    }
    for (const RankDiff& d : diffs) {
        if (d.forward_exceeded || d.backward_exceeded) return kExitFindings;
    }
    return 0;
}

}  // namespace allocscope::cli
