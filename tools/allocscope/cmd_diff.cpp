// allocscope diff: the reference test's comparison of two runs (analyze/diff.h).
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "diff.h"
#include "progress.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kDiffHelp =
    R"(usage: allocscope diff BASE CAND [--forward-threshold B] [--backward-threshold B]
                       [--format text|json] [-o FILE]

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

options:
  --forward-threshold B    bytes, e.g. 51200, 50KiB, 1MiB
  --backward-threshold B
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
        .value({"--format"}, one_of("--format", {"text", "json"}, format))
        .value({"-o"}, output);
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& paths = parser.positionals();
    if (paths.size() != 2) return fail("diff needs BASE and CAND (" + parser.see_help() + ")");
    const std::vector<std::string> base_files = traces_of(paths[0]);
    const std::vector<std::string> cand_files = traces_of(paths[1]);

    Progress progress;
    size_t done = 0;
    const size_t total = base_files.size() + cand_files.size();
    auto measure_all = [&](const std::vector<std::string>& files) {
        std::map<int32_t, RunMeasure> by_rank;
        for (const std::string& f : files) {
            progress.show("measuring " + f, done++, total);
            const Trace t = load_trace(f);  // TraceError names the file and offset
            by_rank[t.header.rank] = measure_run(t);
        }
        return by_rank;
    };
    std::map<int32_t, RunMeasure> base = measure_all(base_files);
    std::map<int32_t, RunMeasure> cand = measure_all(cand_files);
    progress.done();

    std::vector<RankDiff> diffs;
    if (base.size() == 1 && cand.size() == 1) {
        diffs.push_back(diff_runs(base.begin()->second, cand.begin()->second, thresholds));
    } else {
        for (auto& [rank, c] : cand) {
            auto b = base.find(rank);
            if (b == base.end()) {
                std::fprintf(stderr, "allocscope: rank %d of CAND has no trace in BASE; skipped\n",
                             rank);
                continue;
            }
            diffs.push_back(diff_runs(b->second, c, thresholds));
        }
    }
    if (diffs.empty()) return fail("BASE and CAND have no rank in common");
    const std::string text =
        format == "json" ? diff_json(diffs, thresholds) : diff_text(diffs, thresholds);
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
