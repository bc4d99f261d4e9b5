// Collapsed stacks at the owner pool's peak (export.h).
#include <algorithm>

#include "analysis.h"
#include "export.h"
#include "export_live.h"

namespace allocscope {

namespace {

// A frame or root name on one folded line: ';' separates frames and the
// last space the count, so ';' becomes ',' and control characters ' '.
void append_name(std::string& line, std::string_view name) {
    for (char c : name) {
        const auto u = static_cast<unsigned char>(c);
        line += c == ';' ? ',' : (u < 0x20 || u == 0x7F) ? ' ' : c;
    }
}

}  // namespace

PeakSnapshot live_at_peak(const Trace& t) {
    TraceStream stream(t);
    return live_at_peak(stream);
}

PeakSnapshot live_at_peak(TraceStream& t) {
    // Pass 1: the owner pool and its peak (Replay keeps every pool's).
    PeakSnapshot s;
    ShapeCounter shape;
    Replay first;
    t.for_each([&](const Event& e) {
        shape.add(e, t.tables());
        first.apply(e);
    });
    s.owner = shape.shape().owner;
    const PoolTotals& totals = first.totals(s.owner);
    s.peak_bytes = totals.peak_bytes;
    s.peak_seq = totals.peak_event.seq;
    if (totals.allocations == 0 || totals.peak_bytes == 0) return s;
    // Pass 2, up to the peak's event: the live set there. The pass ends
    // there (a stream's next pass starts afresh from the file's start).
    struct PeakReached {};
    Replay again;
    try {
        t.for_each([&](const Event& e) {
            again.apply(e);
            if (e.seq == s.peak_seq) throw PeakReached{};
        });
    } catch (const PeakReached&) {
    }
    s.live = again.table(s.owner).snapshot();
    std::sort(s.live.begin(), s.live.end(),
              [](const LiveRecord& a, const LiveRecord& b) { return a.address < b.address; });
    return s;
}

std::vector<uint32_t> stack_ids(std::span<const LiveRecord> records) {
    std::vector<uint32_t> ids;
    for (const LiveRecord& r : records) {
        if (r.stack) ids.push_back(r.stack);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

void CollapsedExport::add(const TraceTables& t, const PeakSnapshot& snapshot,
                          const StackFrames& frames) {
    std::string line;
    for (const LiveRecord& r : snapshot.live) {
        if (r.size == 0) continue;
        line.clear();
        const std::string& layer = r.layer < t.strings.size() ? t.strings[r.layer] : "";
        const std::string& phase = r.phase < t.strings.size() ? t.strings[r.phase] : "";
        append_name(line, layer.empty() ? "(untagged)" : layer);
        line += ';';
        append_name(line, phase.empty() ? "(no phase)" : phase);
        if (r.stack < frames.size()) {
            const std::vector<ExportFrame>& stack = frames[r.stack];
            for (auto it = stack.rbegin(); it != stack.rend(); ++it) {  // outermost first
                line += ';';
                append_name(line, it->text);
            }
        }
        lines_[line] += r.size;
    }
}

void CollapsedExport::write(ExportWriter& out) const {
    for (const auto& [line, bytes] : lines_) {
        out.put(line);
        out.put(' ');
        out.put(std::to_string(bytes));
        out.put('\n');
    }
}

}  // namespace allocscope
