// Chrome / Perfetto trace-event JSON (export.h).
#include <algorithm>
#include <charconv>
#include <limits>
#include <unordered_map>

#include <allocscope/sdk/flat_map.h>

#include "analysis.h"
#include "export.h"
#include "export_live.h"

namespace allocscope {

namespace {

using export_detail::LiveTracker;

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

void put_uint(std::string& s, uint64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    s.append(buf, end);
}

void put_int(std::string& s, int64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    s.append(buf, end);
}

// Microseconds with nanosecond digits: "1234.567", "1234" when whole.
void put_us(std::string& s, uint64_t ns) {
    put_uint(s, ns / 1000);
    const unsigned frac = unsigned(ns % 1000);
    if (frac == 0) return;
    char buf[4] = {'.', char('0' + frac / 100), char('0' + frac / 10 % 10), char('0' + frac % 10)};
    s.append(buf, 4);
}

std::string slice_name(const std::string& layer, const std::string& phase) {
    if (layer.empty()) return phase.empty() ? "(untagged)" : phase;
    return phase.empty() ? layer : layer + " (" + phase + ")";
}

// One trace's events, written as they go: two passes over them (the
// first for the shape, the pools and the layer groups; the second writes),
// holding the live set, never the events.
class TraceWriter {
  public:
    TraceWriter(ExportWriter& out, bool& first, TraceStream& t, uint64_t offset_ns)
        : out_(out), first_(first), t_(t), offset_ns_(offset_ns) {
        const TraceHeader& h = t.header();
        pid_ = h.rank >= 0 ? int64_t(h.rank) : int64_t(h.pid);
    }

    void run(std::span<const Finding* const> findings, const ExportProgress& progress) {
        // Pass 1: the owner pool and the main thread (trace_shape), which
        // pools have allocations, and per pool the layers of its
        // allocations in the order they first come, for names and initial
        // samples (the owner's is known only at the end of the pass).
        ShapeCounter shape_counter;
        std::array<bool, kPoolCount> used{};
        std::array<std::vector<uint32_t>, kPoolCount> layers;  // in first-use order
        std::array<std::vector<bool>, kPoolCount> layer_seen;
        t_.for_each([&](const Event& e) {
            shape_counter.add(e, t_.tables());
            if (e.kind != EventKind::alloc) return;
            const int p = int(pool_of(e));
            used[p] = true;
            std::vector<bool>& seen = layer_seen[p];
            if (e.layer >= seen.size()) seen.resize(size_t(e.layer) + 1, false);
            if (seen[e.layer]) return;
            seen[e.layer] = true;
            layers[p].push_back(e.layer);
        });
        const TraceShape shape = shape_counter.shape();
        const Pool owner = shape.owner;
        main_tid_ = shape.main_tid;
        group_of_layer_.assign(t_.tables().strings.size(), kNone);
        for (uint32_t layer : layers[int(owner)])
            group(layer);

        // The events the findings point at (their first evidence's
        // allocation): found in pass 2.
        struct At {
            bool found = false;
            uint64_t t_ns = 0;
            uint32_t tid = 0;
        };
        FlatMap<uint64_t, At> finding_at;
        for (const Finding* f : findings) {
            if (!f->evidence.empty() && f->evidence.front().alloc_seq)
                finding_at[f->evidence.front().alloc_seq] = At{};
        }

        process_metadata();
        for (int p = 0; p < kPoolCount; ++p) {
            if (used[p]) counter(pool_counter_name(Pool(p)), 0, 0);
        }
        group_live_.assign(groups_.size(), 0);
        for (uint32_t g = 0; g < groups_.size(); ++g)
            counter(group_counter_name(g), 0, 0);

        LiveTracker tracker;
        FlatMap<uint32_t, uint32_t> depth;  // open scopes per thread
        uint64_t last_step = std::numeric_limits<uint64_t>::max();
        const size_t n = t_.size();
        size_t i = 0;
        uint64_t end_ns = 0;  // the last event's
        t_.for_each([&](const Event& e) {
            export_detail::report_progress(progress, i++, n);
            end_ns = e.t_ns;
            if (finding_at.size() != 0) {
                // The first event of that seq, as a search of the events would find.
                At* at = finding_at.find(e.seq);
                if (at && !at->found) *at = At{true, e.t_ns, e.tid};
            }
            switch (e.kind) {
                case EventKind::tag_push: {
                    ++depth[e.tid];
                    thread(e.tid);
                    begin_event("B", e.tid, e.t_ns);
                    line_ += ",\"cat\":\"tag\",\"name\":";
                    line_ += json_quote(slice_name(str(e.layer), str(e.phase)));
                    line_ += ",\"args\":{\"layer\":";
                    line_ += json_quote(str(e.layer));
                    line_ += ",\"phase\":";
                    line_ += json_quote(str(e.phase));
                    line_ += ",\"step\":";
                    put_uint(line_, e.step);
                    line_ += "}}";
                    emit();
                    break;
                }
                case EventKind::tag_pop: {
                    uint32_t* d = depth.find(e.tid);
                    if (!d || *d == 0) break;  // a pop without a push is ignored
                    --*d;
                    begin_event("E", e.tid, e.t_ns);
                    line_ += '}';
                    emit();
                    break;
                }
                case EventKind::step:
                    if (e.step != last_step) {
                        last_step = e.step;
                        thread(e.tid);
                        begin_event("i", e.tid, e.t_ns);
                        line_ += ",\"s\":\"t\",\"cat\":\"step\",\"name\":\"step ";
                        put_uint(line_, e.step);
                        line_ += "\",\"args\":{\"step\":";
                        put_uint(line_, e.step);
                        line_ += "}}";
                        emit();
                    }
                    break;
                case EventKind::oom:
                    // Every failed request, the allocator's retried calls
                    // included; "out of memory" is the allocator's verdict.
                    thread(e.tid);
                    begin_event("i", e.tid, e.t_ns);
                    line_ += ",\"s\":\"t\",\"cat\":\"oom\",\"name\":";
                    line_ +=
                        e.level == Level::block ? "\"out of memory\"" : "\"failed allocation\"";
                    line_ += ",\"args\":{\"requested\":";
                    put_uint(line_, e.size);
                    line_ += ",\"device_free\":";
                    put_uint(line_, e.address);
                    line_ += ",\"api\":" + json_quote(to_string(e.api));
                    line_ += ",\"layer\":" + json_quote(str(e.layer));
                    line_ += ",\"phase\":" + json_quote(str(e.phase));
                    line_ += ",\"step\":";
                    put_uint(line_, e.step);
                    line_ += "}}";
                    emit();
                    break;
                default:
                    break;
            }
            tracker.apply(e, [&](const LiveChange& c) {
                counter(pool_counter_name(c.pool), e.t_ns,
                        tracker.replay().totals(c.pool).live_bytes);
                if (c.pool != owner) return;
                if (c.kind == LiveChange::Kind::alloc) {
                    const uint32_t g = group(c.record.layer);
                    if (c.replaced) {
                        const uint32_t og = group(c.old.layer);
                        group_live_[og] -= c.old.size;
                        if (og != g) counter(group_counter_name(og), e.t_ns, group_live_[og]);
                    }
                    group_live_[g] += c.record.size;
                    counter(group_counter_name(g), e.t_ns, group_live_[g]);
                } else {
                    const uint32_t g = group(c.record.layer);
                    group_live_[g] -= c.record.size;
                    counter(group_counter_name(g), e.t_ns, group_live_[g]);
                }
            });
        });
        export_detail::report_progress(progress, n, n);

        // Scopes still open at the end close there, innermost first.
        std::vector<std::pair<uint32_t, uint32_t>> open;
        depth.for_each([&](uint32_t tid, uint32_t d) {
            if (d) open.emplace_back(tid, d);
        });
        std::sort(open.begin(), open.end());
        for (const auto& [tid, d] : open) {
            for (uint32_t k = 0; k < d; ++k) {
                begin_event("E", tid, end_ns);
                line_ += '}';
                emit();
            }
        }

        for (const Finding* f : findings) {
            const uint64_t seq = f->evidence.empty() ? 0 : f->evidence.front().alloc_seq;
            const At* at = seq ? finding_at.find(seq) : nullptr;
            finding(*f, seq, at && at->found ? at->t_ns : end_ns,
                    at && at->found ? at->tid : main_tid_);
        }
    }

  private:
    const std::string& str(uint32_t id) const {
        static const std::string empty;
        const std::vector<std::string>& strings = t_.tables().strings;
        return id < strings.size() ? strings[id] : empty;
    }

    uint32_t group(uint32_t layer) {
        uint32_t* slot = layer < group_of_layer_.size() ? &group_of_layer_[layer] : nullptr;
        if (slot && *slot != kNone) return *slot;
        const std::string name = layer_group(str(layer));
        auto [it, added] = group_ids_.try_emplace(name, uint32_t(groups_.size()));
        if (added) {
            groups_.push_back(name);
            group_names_.push_back(json_quote("layer: " + name));
            group_live_.push_back(0);
        }
        if (slot) *slot = it->second;
        return it->second;
    }

    const std::string& group_counter_name(uint32_t g) const { return group_names_[g]; }

    const std::string& pool_counter_name(Pool p) {
        std::string& name = pool_names_[int(p)];
        if (name.empty()) name = json_quote(std::string("pool: ") + to_string(p));
        return name;
    }

    void begin_event(const char* ph, uint32_t tid, uint64_t t_ns) {
        line_.clear();
        line_ += "{\"ph\":\"";
        line_ += ph;
        line_ += "\",\"pid\":";
        put_int(line_, pid_);
        line_ += ",\"tid\":";
        put_uint(line_, tid);
        line_ += ",\"ts\":";
        put_us(line_, offset_ns_ + t_ns);
    }

    void emit() {
        out_.put(first_ ? "\n" : ",\n");
        first_ = false;
        out_.put(line_);
    }

    void counter(const std::string& quoted_name, uint64_t t_ns, uint64_t bytes) {
        line_.clear();
        line_ += "{\"ph\":\"C\",\"pid\":";
        put_int(line_, pid_);
        line_ += ",\"ts\":";
        put_us(line_, offset_ns_ + t_ns);
        line_ += ",\"name\":";
        line_ += quoted_name;
        line_ += ",\"args\":{\"bytes\":";
        put_uint(line_, bytes);
        line_ += "}}";
        emit();
    }

    void process_metadata() {
        const TraceHeader& h = t_.header();
        const std::string name =
            h.rank >= 0 ? "rank " + std::to_string(h.rank) : "pid " + std::to_string(h.pid);
        line_ = "{\"ph\":\"M\",\"pid\":";
        put_int(line_, pid_);
        line_ += ",\"name\":\"process_name\",\"args\":{\"name\":" + json_quote(name) + "}}";
        emit();
        line_ = "{\"ph\":\"M\",\"pid\":";
        put_int(line_, pid_);
        line_ += ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":";
        put_int(line_, pid_);
        line_ += "}}";
        emit();
    }

    void thread(uint32_t tid) {
        if (threads_named_.contains(tid)) return;
        threads_named_[tid] = true;
        line_ = "{\"ph\":\"M\",\"pid\":";
        put_int(line_, pid_);
        line_ += ",\"tid\":";
        put_uint(line_, tid);
        line_ += ",\"name\":\"thread_name\",\"args\":{\"name\":\"thread ";
        put_uint(line_, tid);
        if (tid == main_tid_) line_ += " (main)";
        line_ += "\"}}";
        emit();
    }

    // At its allocation's event (t_ns, tid), else at the trace end.
    void finding(const Finding& f, uint64_t seq, uint64_t t_ns, uint32_t tid) {
        thread(tid);
        begin_event("i", tid, t_ns);
        line_ += ",\"s\":\"t\",\"cat\":\"finding\",\"name\":";
        line_ += json_quote(std::string(to_string(f.severity)) + ": " + f.plugin);
        line_ += ",\"args\":{\"plugin\":" + json_quote(f.plugin);
        line_ += ",\"severity\":" + json_quote(to_string(f.severity));
        line_ += ",\"layer\":" + json_quote(f.layer);
        line_ += ",\"phase\":" + json_quote(f.phase);
        line_ += ",\"bytes\":";
        put_uint(line_, f.bytes);
        line_ += ",\"count\":";
        put_uint(line_, f.count);
        line_ += ",\"summary\":" + json_quote(f.summary);
        line_ += ",\"alloc_seq\":";
        put_uint(line_, seq);
        line_ += "}}";
        emit();
    }

    ExportWriter& out_;
    bool& first_;
    TraceStream& t_;
    uint64_t offset_ns_;
    int64_t pid_ = 0;
    uint32_t main_tid_ = 0;
    std::string line_;
    std::vector<uint32_t> group_of_layer_;
    std::unordered_map<std::string, uint32_t> group_ids_;
    std::vector<std::string> groups_;
    std::vector<std::string> group_names_;  // quoted counter names
    std::vector<uint64_t> group_live_;
    std::array<std::string, kPoolCount> pool_names_;
    FlatMap<uint32_t, bool> threads_named_;
};

}  // namespace

PerfettoExport::PerfettoExport(ExportWriter& out, uint64_t base_wall_ns)
    : out_(out), base_wall_ns_(base_wall_ns) {
    out_.put("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
}

void PerfettoExport::add(const Trace& trace, std::span<const Finding* const> findings,
                         const ExportProgress& progress) {
    TraceStream stream(trace);
    add(stream, findings, progress);
}

void PerfettoExport::add(TraceStream& trace, std::span<const Finding* const> findings,
                         const ExportProgress& progress) {
    if (finished_) throw std::logic_error("PerfettoExport::add after finish");
    const uint64_t start = trace.header().start_wall_ns;
    const uint64_t offset = start > base_wall_ns_ ? start - base_wall_ns_ : 0;
    TraceWriter(out_, first_, trace, offset).run(findings, progress);
}

void PerfettoExport::finish() {
    if (finished_) return;
    finished_ = true;
    out_.put("\n]}\n");
}

}  // namespace allocscope
