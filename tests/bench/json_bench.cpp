// Boost.JSON against allocscope's own JSON code (analyze/json.h, the findings
// writer in core/findings.cpp and reader in analyze/findings_reader.cpp), on
// a findings document of N findings with M pieces of evidence each, shaped
// like the weight detectors' (long derivation notes, layer names):
//   * parse: the text into a tree (json::parse / boost::json::parse), and
//     the whole reader (tree + schema: parse_findings);
//   * write: a FindingsFile to text (to_json / the same members through
//     boost::json::value and serialize).
// Built only where Boost.JSON's headers are found (Boost >= 1.75; Debian
// 12's default Boost is 1.74). Usage: bench_json [N] [M] [ROUNDS]
#include <boost/json.hpp>
#include <boost/json/src.hpp>  // header-only Boost.JSON

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "findings.h"
#include "findings_reader.h"
#include "json.h"

using namespace allocscope;
namespace bj = boost::json;

namespace {

FindingsFile sample(size_t n, size_t m) {
    FindingsFile file;
    for (size_t i = 0; i < n; ++i) {
        Finding f;
        f.plugin = i % 2 ? "weight-copy-accumulation" : "transpose-cache-retention";
        f.severity = i % 3 == 0 ? Severity::error : Severity::info;
        f.rank = static_cast<int32_t>(i % 2);
        f.layer = "model.layers." + std::to_string(i % 32) + ".mlp.fc1";
        f.phase = "forward";
        f.bytes = 786432 * (i + 1);
        f.count = m;
        f.summary =
            "3 FP8 weight copies of layers.3 alive after its forward (2.25 MiB): the "
            "quantized weights are kept for backward";
        f.basis = "proven";
        for (size_t k = 0; k < m; ++k) {
            Evidence e;
            e.size = 786432;
            e.layer = f.layer;
            e.phase = "forward";
            e.step = 3;
            e.alloc_seq = 1000 * i + k;
            e.free_seq = k % 2 ? 0 : 1000 * i + k + 500;
            e.stack_id = static_cast<uint32_t>(k + 1);
            e.note = "derived from " + f.layer +
                     ".weight: abs -> amax -> div -> mul -> clamp -> _to_copy(float8_e4m3fn); "
                     "alive after " +
                     f.layer + "'s forward";
            f.evidence.push_back(e);
        }
        file.findings.push_back(f);
    }
    for (int32_t r = 0; r < 2; ++r) {
        RankRun run;
        run.rank = r;
        run.trace = "rank" + std::to_string(r) + ".trace";
        run.plugins = {"weight-copy-accumulation", "transpose-cache-retention", "peak-owner"};
        file.ranks.push_back(run);
    }
    return file;
}

// The same members to_json writes, through Boost.JSON.
bj::value to_boost(const FindingsFile& file) {
    bj::array findings;
    for (const Finding& f : file.findings) {
        bj::array evidence;
        for (const Evidence& e : f.evidence) {
            bj::object o;
            o["size"] = e.size;
            o["layer"] = e.layer;
            o["phase"] = e.phase;
            o["step"] = e.step;
            o["alloc_seq"] = e.alloc_seq;
            o["free_seq"] = e.free_seq;
            o["stack_id"] = e.stack_id;
            if (!e.note.empty()) o["note"] = e.note;
            evidence.push_back(std::move(o));
        }
        bj::object o;
        o["plugin"] = f.plugin;
        o["severity"] = std::string(to_string(f.severity));
        o["rank"] = f.rank;
        o["layer"] = f.layer;
        o["phase"] = f.phase;
        o["bytes"] = f.bytes;
        o["count"] = f.count;
        o["summary"] = f.summary;
        if (!f.basis.empty()) o["basis"] = f.basis;
        o["evidence"] = std::move(evidence);
        findings.push_back(std::move(o));
    }
    bj::array ranks;
    for (const RankRun& r : file.ranks) {
        bj::object o;
        o["rank"] = r.rank;
        o["trace"] = r.trace;
        bj::array plugins;
        for (const std::string& p : r.plugins)
            plugins.push_back(bj::string(p));
        o["plugins"] = std::move(plugins);
        o["disabled"] = bj::array();
        ranks.push_back(std::move(o));
    }
    bj::object root;
    root["version"] = kFindingsFormatVersion;
    root["findings"] = std::move(findings);
    root["ranks"] = std::move(ranks);
    return root;
}

template <class F>
double best_ms(int rounds, F&& f) {
    double best = 1e300;
    for (int i = 0; i < rounds; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return best;
}

volatile size_t g_sink;

}  // namespace

int main(int argc, char** argv) {
    const size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 2000;
    const size_t m = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 8;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 15;
    const FindingsFile file = sample(n, m);
    const std::string text = to_json(file);
    const std::string boost_text = bj::serialize(to_boost(file));
    std::printf("document: %zu findings x %zu evidence, %.2f MiB (Boost's compact form %.2f MiB)\n",
                n, m, text.size() / 1048576.0, boost_text.size() / 1048576.0);
    const double own_tree = best_ms(rounds, [&] { g_sink = json::parse(text).members.size(); });
    const double boost_tree = best_ms(rounds, [&] { g_sink = bj::parse(text).as_object().size(); });
    const double own_reader =
        best_ms(rounds, [&] { g_sink = parse_findings(text, "bench").findings.size(); });
    const double own_write = best_ms(rounds, [&] { g_sink = to_json(file).size(); });
    const double boost_write =
        best_ms(rounds, [&] { g_sink = bj::serialize(to_boost(file)).size(); });
    std::printf("| step | allocscope (ms) | Boost.JSON (ms) |\n| --- | ---: | ---: |\n");
    std::printf("| parse to a tree | %.1f | %.1f |\n", own_tree, boost_tree);
    std::printf("| read findings (tree + schema) | %.1f | |\n", own_reader);
    std::printf("| write findings | %.1f | %.1f |\n", own_write, boost_write);
    return 0;
}
