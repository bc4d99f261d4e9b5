// allocscope report: a text summary of one or more traces.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cli.h"
#include "replay.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kReportHelp = R"(usage: allocscope report PATH... [--rank R] [--top N]

Summarizes traces. PATH is a trace file or an output directory (all *.trace
files in it). For each trace: events by kind and level, peak live bytes and
when it was reached, who held memory at the peak and at exit grouped by
(layer, phase), and the top allocation sites by stack. A trace cut short (a killed process) is reported
up to where it ends, with a warning.

options:
  --rank R     only traces of rank R
  --top N      allocation sites to list (default 10)

example:
  allocscope report allocscope-out
)";

std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
    std::vector<std::string> files;
    for (const std::string& p : paths) {
        std::error_code ec;
        if (fs::is_directory(p, ec)) {
            const std::vector<std::string> found = trace_files_in(p);
            if (found.empty()) throw std::runtime_error(p + ": no .trace files in this directory");
            files.insert(files.end(), found.begin(), found.end());
        } else if (fs::exists(p, ec)) {
            files.push_back(p);
        } else {
            throw std::runtime_error(p + ": no such file or directory");
        }
    }
    return files;
}

std::string seconds(uint64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(ns) / 1e9);
    return buf;
}

std::string tag_name(const Trace& t, uint32_t layer, uint32_t phase) {
    std::string l = layer ? t.str(layer) : "(untagged)";
    return phase ? l + "/" + t.str(phase) : l;
}

std::string frame_name(const Trace& t, uint64_t pc) {
    const ModuleRecord* best = nullptr;
    for (const ModuleRecord& m : t.modules) {
        if (pc >= m.base && pc < m.base + m.size) best = &m;
    }
    char buf[64];
    if (!best) {
        std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(pc));
        return buf;
    }
    std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(pc - best->base));
    return fs::path(best->path).filename().string() + buf;
}

struct TagBytes {
    uint64_t bytes = 0;
    uint64_t count = 0;
};
using TagKey = std::tuple<std::string, std::string, int>;  // layer, phase, pool

void add_by_tag(const Trace& t, const LiveRecord& r, int pool, std::map<TagKey, TagBytes>& out) {
    TagBytes& v = out[{r.layer ? t.str(r.layer) : "(untagged)", t.str(r.phase), pool}];
    v.bytes += r.size;
    ++v.count;
}

// Largest first; at most `limit` rows, then a count of the rest.
void print_by_tag(const std::map<TagKey, TagBytes>& by_tag, size_t limit) {
    if (by_tag.empty()) return;
    std::printf("  by (layer, phase):\n    %-28s %-24s %-12s %10s %8s\n", "layer", "phase", "pool",
                "bytes", "count");
    std::vector<std::pair<TagKey, TagBytes>> rows(by_tag.begin(), by_tag.end());
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
        const auto& [key, v] = rows[i];
        std::printf("    %-28s %-24s %-12s %10s %8llu\n", std::get<0>(key).c_str(),
                    std::get<1>(key).empty() ? "-" : std::get<1>(key).c_str(),
                    to_string(Pool(std::get<2>(key))), format_bytes(v.bytes).c_str(),
                    static_cast<unsigned long long>(v.count));
    }
    if (rows.size() > limit) std::printf("    ... %zu more\n", rows.size() - limit);
}

// What was live in `pool` right after event `seq` (the one that reached the
// peak): a second replay that stops there.
std::map<TagKey, TagBytes> live_by_tag_at(const Trace& t, Pool pool, uint64_t seq) {
    Replay replay;
    for (const Event& e : t.events) {
        replay.apply(e);
        if (e.seq == seq) break;
    }
    std::map<TagKey, TagBytes> by_tag;
    for (const LiveRecord& r : replay.table(pool).snapshot())
        add_by_tag(t, r, int(pool), by_tag);
    return by_tag;
}

struct Site {
    uint64_t live_bytes = 0;
    uint64_t live_count = 0;
    uint64_t allocated_bytes = 0;
    uint64_t allocations = 0;
};

void report_one(const Trace& t, size_t top) {
    const TraceHeader& h = t.header;
    std::printf("== %s  (rank %s, pid %u, allocscope %s, stack depth %u) ==\n", t.path.c_str(),
                h.rank >= 0 ? std::to_string(h.rank).c_str() : "-", h.pid, h.tool_version.c_str(),
                h.stack_depth);
    if (t.truncated) {
        std::printf("warning: %s; reporting the %zu events before it\n",
                    t.truncation_message.c_str(), t.events.size());
    }
    const uint64_t span_ns = t.events.empty() ? 0 : t.events.back().t_ns;
    std::printf("events: %zu over %s\n", t.events.size(), seconds(span_ns).c_str());

    std::map<std::pair<EventKind, Level>, uint64_t> by_kind;
    std::map<Api, uint64_t> by_api;
    std::map<uint32_t, Site> sites;
    Replay replay;
    for (const Event& e : t.events) {
        ++by_kind[{e.kind, e.level}];
        if (e.kind == EventKind::alloc || e.kind == EventKind::oom) ++by_api[e.api];
        replay.apply(e);
        if (e.kind == EventKind::alloc) {
            Site& s = sites[e.stack];
            s.allocated_bytes += e.size;
            ++s.allocations;
        }
    }
    std::printf("\nevents by kind and level:\n");
    for (const auto& [key, n] : by_kind) {
        std::printf("  %-10s %-8s %10llu\n", std::string(to_string(key.first)).c_str(),
                    key.second == Level::none ? "" : std::string(to_string(key.second)).c_str(),
                    static_cast<unsigned long long>(n));
    }
    if (!by_api.empty()) {
        std::printf("allocation calls by api:\n");
        for (const auto& [api, n] : by_api) {
            std::printf("  %-30s %10llu\n", std::string(to_string(api)).c_str(),
                        static_cast<unsigned long long>(n));
        }
    }
    uint64_t unknown = 0, doubles = 0;
    for (const Event& e : t.events) {
        if (e.kind != EventKind::free) continue;
        unknown += (e.flags & kFlagUnknownAddress) != 0;
        doubles += (e.flags & kFlagDoubleFree) != 0;
    }
    std::printf("frees of unknown addresses: %llu, double frees: %llu, failed frees: %llu\n",
                static_cast<unsigned long long>(unknown), static_cast<unsigned long long>(doubles),
                static_cast<unsigned long long>(replay.failed_frees()));
    if (replay.oom_events() > 0) {
        std::printf("failed allocations (oom): %llu, largest request %s\n",
                    static_cast<unsigned long long>(replay.oom_events()),
                    format_bytes(replay.largest_failed_request()).c_str());
    }

    std::printf("\npeak live bytes:\n");
    for (int p = 0; p < kPoolCount; ++p) {
        const PoolTotals& pt = replay.totals(static_cast<Pool>(p));
        if (pt.allocations == 0) continue;
        const Event& e = pt.peak_event;
        std::printf("  %-12s %10s at seq %llu (t=%s, step %llu, %s)\n", to_string(Pool(p)),
                    format_bytes(pt.peak_bytes).c_str(), static_cast<unsigned long long>(e.seq),
                    seconds(e.t_ns).c_str(), static_cast<unsigned long long>(e.step),
                    tag_name(t, e.layer, e.phase).c_str());
    }

    // Caching allocators report blocks: their peak says who holds tensors.
    // Without blocks, the segments are all there is.
    const Pool owner_pool = replay.totals(Pool::device_block).allocations > 0
                                ? Pool::device_block
                                : Pool::device_segment;
    const PoolTotals& owner_totals = replay.totals(owner_pool);
    if (owner_totals.allocations > 0) {
        std::printf("\nlive at the %s peak (%s):\n", to_string(owner_pool),
                    format_bytes(owner_totals.peak_bytes).c_str());
        print_by_tag(live_by_tag_at(t, owner_pool, owner_totals.peak_event.seq), 12);
    }

    std::printf("\nlive at exit:\n");
    std::map<TagKey, TagBytes> by_tag;
    for (int p = 0; p < kPoolCount; ++p) {
        const PoolTotals& pt = replay.totals(static_cast<Pool>(p));
        if (pt.allocations == 0) continue;
        std::printf("  %-12s %10s in %llu allocation(s)\n", to_string(Pool(p)),
                    format_bytes(pt.live_bytes).c_str(),
                    static_cast<unsigned long long>(pt.live_count));
        for (const LiveRecord& r : replay.table(static_cast<Pool>(p)).snapshot()) {
            add_by_tag(t, r, p, by_tag);
            Site& s = sites[r.stack];
            s.live_bytes += r.size;
            ++s.live_count;
        }
    }
    print_by_tag(by_tag, 24);

    std::vector<std::pair<uint32_t, Site>> ranked(sites.begin(), sites.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second.live_bytes, a.second.allocated_bytes) >
               std::tie(b.second.live_bytes, b.second.allocated_bytes);
    });
    std::printf("\ntop allocation sites (by live bytes at exit, then bytes allocated):\n");
    for (size_t k = 0; k < ranked.size() && k < top; ++k) {
        const auto& [id, s] = ranked[k];
        std::printf("  #%zu stack %u: %s live in %llu, %s allocated in %llu\n", k + 1, id,
                    format_bytes(s.live_bytes).c_str(),
                    static_cast<unsigned long long>(s.live_count),
                    format_bytes(s.allocated_bytes).c_str(),
                    static_cast<unsigned long long>(s.allocations));
        if (id == 0) {
            std::printf("      (no stack captured)\n");
            continue;
        }
        const auto& frames = t.stacks.at(id);
        for (size_t f = 0; f < frames.size() && f < 8; ++f) {
            std::printf("      %s\n", frame_name(t, frames[f]).c_str());
        }
        if (frames.size() > 8) std::printf("      ... %zu more frames\n", frames.size() - 8);
    }
    std::printf("\n");
}

}  // namespace

int report_command(const std::vector<std::string>& args) {
    std::vector<std::string> paths;
    long rank = -1;
    size_t top = 10;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            std::fputs(kReportHelp, stdout);
            return 0;
        }
        if (a == "--rank" || a == "--top") {
            if (i + 1 >= args.size()) return fail(a + " needs a value");
            const std::string& v = args[++i];
            char* end = nullptr;
            long n = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || n < 0) {
                return fail(a + " expects a non-negative integer, got '" + v + "'");
            }
            if (a == "--rank") {
                rank = n;
            } else {
                top = static_cast<size_t>(n);
            }
        } else if (a.rfind("--", 0) == 0) {
            return fail("unknown option '" + a + "' for report (see allocscope report --help)");
        } else {
            paths.push_back(a);
        }
    }
    if (paths.empty()) return fail("report needs a trace file or directory (see --help)");
    std::vector<Trace> traces;
    for (const std::string& file : expand_paths(paths)) {
        Trace t = load_trace(file);  // TraceError names file and offset
        if (rank >= 0 && t.header.rank != rank) continue;
        traces.push_back(std::move(t));
    }
    if (traces.empty()) return fail("no trace of rank " + std::to_string(rank) + " found");
    for (const Trace& t : traces)
        report_one(t, top);
    return 0;
}

}  // namespace allocscope::cli
