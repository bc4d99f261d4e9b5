// A PyTorch memory snapshot pickle (export.h). The dictionary follows
// torch.cuda.memory._snapshot() as torch/csrc/cuda/memory_snapshot.cpp
// builds it; the pickle uses only opcodes that both Python's unpickler and
// the JavaScript one of torch/utils/viz/MemoryViz.js (pytorch.org/memory_viz)
// read: PROTO 4, EMPTY_DICT/EMPTY_LIST, MARK, SETITEMS/APPENDS (at most 1000
// items per batch, as Python's pickler does), BININT1/BININT2/BININT/LONG1,
// SHORT_BINUNICODE/BINUNICODE, NEWTRUE/NEWFALSE, TUPLE2, MEMOIZE,
// BINGET/LONG_BINGET and STOP.
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include <allocscope/sdk/flat_map.h>

#include "analysis.h"
#include "export.h"
#include "export_live.h"
#include "json.h"

namespace allocscope {

namespace {

using export_detail::LiveTracker;

class Pickler {
  public:
    explicit Pickler(ExportWriter& out) : out_(out) {}

    void proto() {
        op(0x80);
        op(4);
    }
    void stop() { op('.'); }
    void mark() { op('('); }
    void empty_dict() { op('}'); }
    void empty_list() { op(']'); }
    void setitems() { op('u'); }
    void appends() { op('e'); }
    void boolean(bool b) { op(b ? 0x88 : 0x89); }
    void tuple2() { op(0x86); }

    void integer(int64_t v) {
        if (v >= 0 && v < 0x100) {
            op('K');
            op(uint8_t(v));
        } else if (v >= 0 && v < 0x10000) {
            op('M');
            op(uint8_t(v));
            op(uint8_t(v >> 8));
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
            op('J');
            le(uint64_t(v), 4);
        } else {
            long1(uint64_t(v), v < 0);
        }
    }
    void uinteger(uint64_t v) {
        if (v <= uint64_t(INT64_MAX)) return integer(int64_t(v));
        long1(v, false);
    }

    // A str; bytes that are not UTF-8 become U+FFFD.
    void string(std::string_view s) {
        const std::string* text = nullptr;
        std::string clean;
        const auto* p = reinterpret_cast<const unsigned char*>(s.data());
        for (size_t i = 0; i < s.size();) {
            const size_t n = json::utf8_sequence(p + i, s.size() - i);
            if (n == 0) {
                if (!text) clean.assign(s.data(), i), text = &clean;
                clean += "\xEF\xBF\xBD";
                ++i;
                continue;
            }
            if (text) clean.append(s.data() + i, n);
            i += n;
        }
        const std::string_view out = text ? std::string_view(*text) : s;
        if (out.size() < 0x100) {
            op(0x8c);
            op(uint8_t(out.size()));
        } else {
            op('X');
            le(out.size(), 4);
        }
        out_.put(out);
    }

    // A str stored once and referred to after.
    void memo_string(std::string_view s) {
        auto it = strings_.find(s);
        if (it != strings_.end()) return get(it->second);
        string(s);
        strings_.emplace(std::string(s), memoize());
    }

    uint32_t memoize() {
        op(0x94);
        return next_memo_++;
    }
    void get(uint32_t index) {
        if (index < 0x100) {
            op('h');
            op(uint8_t(index));
        } else {
            op('j');
            le(index, 4);
        }
    }

  private:
    void op(uint8_t c) { out_.put(char(c)); }
    void le(uint64_t v, int n) {
        for (int i = 0; i < n; ++i)
            op(uint8_t(v >> (8 * i)));
    }
    // Little-endian two's complement, as short as it goes.
    void long1(uint64_t v, bool negative) {
        uint8_t bytes[9];
        int n = 0;
        for (; n < 8; ++n)
            bytes[n] = uint8_t(v >> (8 * n));
        while (n > 1 && ((!negative && bytes[n - 1] == 0 && !(bytes[n - 2] & 0x80)) ||
                         (negative && bytes[n - 1] == 0xFF && (bytes[n - 2] & 0x80)))) {
            --n;
        }
        if (!negative && (bytes[n - 1] & 0x80)) bytes[n++] = 0;
        op(0x8a);
        op(uint8_t(n));
        for (int i = 0; i < n; ++i)
            op(bytes[i]);
    }

    ExportWriter& out_;
    uint32_t next_memo_ = 0;
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const noexcept {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> strings_;
};

// The items of one list (or members of one dict) in batches of 1000.
class Batch {
  public:
    Batch(Pickler& p, bool dict) : p_(p), dict_(dict) {}
    void item() {
        if (n_ == 0) p_.mark();
    }
    void done() {
        if (++n_ == 1000) flush();
    }
    void end() { flush(); }
    void reset() { n_ = 0; }

  private:
    void flush() {
        if (n_ == 0) return;
        dict_ ? p_.setitems() : p_.appends();
        n_ = 0;
    }
    Pickler& p_;
    bool dict_;
    int n_ = 0;
};

struct Seg {
    uint64_t size = 0;
    bool synthetic = false;  // made for a block outside every recorded segment
    LiveRecord record;
};

int device_of(int32_t device) {
    return device < 0 ? 0 : device;
}

// One pass for the shape and the devices, then one per device, which
// writes that device's history; the segments are the last pass's live set.
class MemoryViz {
  public:
    MemoryViz(TraceStream& t, const StackFrames& frames, ExportWriter& out)
        : t_(t), frames_(frames), p_(out) {}

    void run(const ExportProgress& progress) {
        int devices = 1;
        ShapeCounter shape;
        t_.for_each([&](const Event& e) {
            shape.add(e, t_.tables());
            if ((e.kind == EventKind::alloc || e.kind == EventKind::oom) &&
                is_device_pool(pool_of(e)))
                devices = std::max(devices, device_of(e.device) + 1);
        });
        blocks_ = shape.shape().owner == Pool::device_block;
        frames_memo_.assign(t_.tables().stacks.size() + 1, kUnset);
        p_.proto();
        p_.empty_dict();
        p_.mark();
        p_.memo_string("device_traces");
        p_.empty_list();
        Batch traces(p_, false);
        const size_t n = t_.size();
        for (int d = 0; d < devices; ++d) {
            traces.item();
            p_.empty_list();
            entries_.reset();
            simulate(d, [&](size_t i) {
                if (progress) export_detail::report_progress(progress, d * n + i, devices * n);
            });
            entries_.end();
            traces.done();
        }
        traces.end();
        if (progress) progress(devices * n, devices * n);
        p_.memo_string("segments");
        segments();
        p_.setitems();
        p_.stop();
    }

  private:
    static constexpr uint32_t kUnset = UINT32_MAX;

    // Replays the trace, writing the entries of `device`; leaves the end
    // state in segs_ and tracker_.
    template <class Progress>
    void simulate(int device, const Progress& progress) {
        tracker_.emplace();
        segs_.clear();
        synthetic_.clear();
        device_ = device;
        const size_t n = t_.size();
        const uint64_t start_wall_ns = t_.header().start_wall_ns;
        size_t i = 0;
        t_.for_each([&](const Event& e) {
            progress(i++);
            // As PyTorch's snapshots: the allocator's verdict, not the
            // failed cudaMalloc calls it retried (where there is one).
            if (e.kind == EventKind::oom && is_device_pool(pool_of(e)) &&
                (!blocks_ || e.level == Level::block))
                oom(e);
            tracker_->apply(e, [&](const LiveChange& c) {
                if (!is_device_pool(c.pool)) return;
                const uint64_t time_us = (start_wall_ns + e.t_ns) / 1000;
                const LiveRecord& r = c.record;
                if (c.kind == LiveChange::Kind::alloc) {
                    if (c.replaced) released(c.pool, c.old, time_us);
                    if (c.pool == Pool::device_segment) {
                        segs_[r.address] = Seg{r.size, false, r};
                        entry("segment_alloc", r, time_us);
                        if (!blocks_) entry("alloc", r, time_us);
                    } else {
                        if (!inside_segment(r.address, r.size)) {
                            segs_[r.address] = Seg{r.size, true, r};
                            synthetic_[r.address] = true;
                            entry("segment_alloc", r, time_us);
                        }
                        entry("alloc", r, time_us);
                    }
                } else {
                    released(c.pool, r, time_us);
                }
            });
        });
        progress(n);
    }

    // `r` is no longer live (freed, or replaced by an allocation at its address).
    void released(Pool pool, const LiveRecord& r, uint64_t time_us) {
        if (pool == Pool::device_segment) {
            if (!blocks_) {
                entry("free_requested", r, time_us);
                entry("free_completed", r, time_us);
            }
            entry("segment_free", r, time_us);
            auto it = segs_.find(r.address);
            if (it != segs_.end() && !it->second.synthetic) segs_.erase(it);
            return;
        }
        entry("free_requested", r, time_us);
        entry("free_completed", r, time_us);
        if (synthetic_.erase(r.address)) {
            entry("segment_free", r, time_us);
            auto it = segs_.find(r.address);
            if (it != segs_.end() && it->second.synthetic) segs_.erase(it);
        }
    }

    const Seg* segment_at(uint64_t address, uint64_t* base) const {
        auto it = segs_.upper_bound(address);
        if (it == segs_.begin()) return nullptr;
        --it;
        if (address - it->first >= it->second.size) return nullptr;
        *base = it->first;
        return &it->second;
    }

    bool inside_segment(uint64_t address, uint64_t size) const {
        uint64_t base = 0;
        const Seg* s = segment_at(address, &base);
        return s && address + size <= base + s->size;
    }

    void frames(uint32_t stack) {
        const uint32_t id =
            stack < frames_.size() && stack < frames_memo_.size() && !frames_[stack].empty() ? stack
                                                                                             : 0;
        uint32_t& memo = frames_memo_[id];
        if (memo != kUnset) return p_.get(memo);
        p_.empty_list();
        memo = p_.memoize();
        if (id == 0) return;
        Batch items(p_, false);
        for (const ExportFrame& f : frames_[id]) {
            items.item();
            frame(f);
            items.done();
        }
        items.end();
    }

    void frame(const ExportFrame& f) {
        std::string key = f.name;
        key += '\0';
        key += f.file;
        key += '\0';
        key += std::to_string(f.line);
        auto it = frame_memo_.find(key);
        if (it != frame_memo_.end()) return p_.get(it->second);
        p_.empty_dict();
        frame_memo_.emplace(std::move(key), p_.memoize());
        p_.mark();
        p_.memo_string("filename");
        p_.memo_string(f.file.empty() ? "??" : f.file);
        p_.memo_string("line");
        p_.integer(f.line);
        p_.memo_string("name");
        p_.memo_string(f.name);
        p_.setitems();
    }

    // "layer L, phase P, step S" of a tagged record, "" otherwise.
    std::string metadata(const LiveRecord& r) const {
        const std::vector<std::string>& strings = t_.tables().strings;
        const std::string& layer = r.layer < strings.size() ? strings[r.layer] : "";
        const std::string& phase = r.phase < strings.size() ? strings[r.phase] : "";
        if (layer.empty() && phase.empty()) return {};
        return "layer " + (layer.empty() ? std::string("(untagged)") : layer) + ", phase " +
               (phase.empty() ? std::string("(none)") : phase) + ", step " + std::to_string(r.step);
    }

    void entry(const char* action, const LiveRecord& r, uint64_t time_us) {
        if (device_of(r.device) != device_) return;
        entries_.item();
        p_.empty_dict();
        p_.mark();
        p_.memo_string("action");
        p_.memo_string(action);
        p_.memo_string("addr");
        p_.uinteger(r.address);
        p_.memo_string("size");
        p_.uinteger(r.size);
        p_.memo_string("stream");
        p_.uinteger(r.stream);
        p_.memo_string("time_us");
        p_.uinteger(time_us);
        p_.memo_string("frames");
        frames(r.stack);
        const std::string meta = metadata(r);
        if (!meta.empty()) {
            p_.memo_string("user_metadata");
            p_.memo_string(meta);
        }
        p_.setitems();
        entries_.done();
    }

    void oom(const Event& e) {
        if (device_of(e.device) != device_) return;
        entries_.item();
        p_.empty_dict();
        p_.mark();
        p_.memo_string("action");
        p_.memo_string("oom");
        p_.memo_string("device_free");  // 0 when not measured
        p_.uinteger(e.address);
        p_.memo_string("size");
        p_.uinteger(e.size);
        p_.memo_string("stream");
        p_.uinteger(e.stream);
        p_.memo_string("time_us");
        p_.uinteger((t_.header().start_wall_ns + e.t_ns) / 1000);
        p_.memo_string("frames");
        frames(e.stack);
        p_.setitems();
        entries_.done();
    }

    struct OutBlock {
        uint64_t address = 0, size = 0;
        const LiveRecord* record = nullptr;  // nullptr: inactive
    };

    void segments() {
        // The live blocks in the segment holding them; a block outside every
        // segment, or overlapping the one before it, gets a segment of its own.
        std::map<uint64_t, std::vector<const LiveRecord*>> inside;
        std::vector<const LiveRecord*> live_blocks, orphans;
        if (blocks_) {
            tracker_->live(Pool::device_block).any_of([&](const LiveRecord& r) {
                live_blocks.push_back(&r);
                return false;
            });
            std::sort(
                live_blocks.begin(), live_blocks.end(),
                [](const LiveRecord* a, const LiveRecord* b) { return a->address < b->address; });
            for (const LiveRecord* r : live_blocks) {
                uint64_t base = 0;
                const Seg* s = segment_at(r->address, &base);
                std::vector<const LiveRecord*>* list = s ? &inside[base] : nullptr;
                const bool fits =
                    s && r->address + r->size <= base + s->size &&
                    (list->empty() || list->back()->address + list->back()->size <= r->address);
                if (fits) {
                    list->push_back(r);
                } else {
                    orphans.push_back(r);
                }
            }
        }
        struct OutSeg {
            uint64_t address = 0;
            const Seg* seg = nullptr;
            const LiveRecord* orphan = nullptr;
        };
        std::vector<OutSeg> out;
        for (const auto& [address, s] : segs_)
            out.push_back({address, &s, nullptr});
        for (const LiveRecord* r : orphans)
            out.push_back({r->address, nullptr, r});
        auto device = [](const OutSeg& s) {
            return device_of(s.seg ? s.seg->record.device : s.orphan->device);
        };
        std::stable_sort(out.begin(), out.end(), [&](const OutSeg& a, const OutSeg& b) {
            return device(a) != device(b) ? device(a) < device(b) : a.address < b.address;
        });

        p_.empty_list();
        Batch list(p_, false);
        std::vector<OutBlock> blocks;
        for (const OutSeg& s : out) {
            const LiveRecord& rec = s.seg ? s.seg->record : *s.orphan;
            const uint64_t total = s.seg ? s.seg->size : s.orphan->size;
            blocks.clear();
            if (!blocks_ || !s.seg) {
                blocks.push_back({s.address, total, &rec});
            } else {
                uint64_t cursor = s.address;
                auto it = inside.find(s.address);
                if (it != inside.end()) {
                    for (const LiveRecord* r : it->second) {
                        if (r->address > cursor)
                            blocks.push_back({cursor, r->address - cursor, nullptr});
                        blocks.push_back({r->address, r->size, r});
                        cursor = r->address + r->size;
                    }
                }
                if (cursor < s.address + total)
                    blocks.push_back({cursor, s.address + total - cursor, nullptr});
            }
            uint64_t allocated = 0;
            for (const OutBlock& b : blocks)
                allocated += b.record ? b.size : 0;
            list.item();
            p_.empty_dict();
            p_.mark();
            p_.memo_string("device");
            p_.integer(device(s));
            p_.memo_string("address");
            p_.uinteger(s.address);
            p_.memo_string("total_size");
            p_.uinteger(total);
            p_.memo_string("allocated_size");
            p_.uinteger(allocated);
            p_.memo_string("active_size");
            p_.uinteger(allocated);
            p_.memo_string("requested_size");
            p_.uinteger(allocated);
            p_.memo_string("stream");
            p_.uinteger(rec.stream);
            p_.memo_string("segment_type");
            p_.memo_string(total <= (uint64_t{2} << 20) ? "small" : "large");
            p_.memo_string("segment_pool_id");
            p_.integer(0);
            p_.integer(0);
            p_.tuple2();
            p_.memo_string("is_expandable");
            p_.boolean(false);
            p_.memo_string("frames");
            frames(rec.stack);
            p_.memo_string("blocks");
            p_.empty_list();
            Batch items(p_, false);
            for (const OutBlock& b : blocks) {
                items.item();
                p_.empty_dict();
                p_.mark();
                p_.memo_string("address");
                p_.uinteger(b.address);
                p_.memo_string("size");
                p_.uinteger(b.size);
                p_.memo_string("requested_size");
                p_.uinteger(b.record ? b.size : 0);
                p_.memo_string("state");
                p_.memo_string(b.record ? "active_allocated" : "inactive");
                p_.memo_string("frames");
                frames(b.record ? b.record->stack : 0);
                p_.setitems();
                items.done();
            }
            items.end();
            p_.setitems();
            list.done();
        }
        list.end();
    }

    TraceStream& t_;
    const StackFrames& frames_;
    Pickler p_;
    bool blocks_ = false;
    int device_ = 0;
    Batch entries_{p_, false};
    std::optional<LiveTracker> tracker_;
    std::map<uint64_t, Seg> segs_;
    FlatMap<uint64_t, bool> synthetic_;
    std::vector<uint32_t> frames_memo_;
    std::unordered_map<std::string, uint32_t> frame_memo_;
};

}  // namespace

std::vector<uint32_t> memory_viz_stacks(TraceStream& t) {
    std::vector<uint32_t> ids;
    std::vector<bool> seen;  // by stack id, as far as the stacks defined so far
    t.for_each([&](const Event& e) {
        if ((e.kind != EventKind::alloc && e.kind != EventKind::oom) ||
            !is_device_pool(pool_of(e)) || !e.stack)
            return;
        if (e.stack >= seen.size()) seen.resize(t.tables().stacks.size(), false);
        if (e.stack < seen.size() && !seen[e.stack]) {
            seen[e.stack] = true;
            ids.push_back(e.stack);
        }
    });
    std::sort(ids.begin(), ids.end());
    return ids;
}

std::vector<uint32_t> memory_viz_stacks(const Trace& t) {
    TraceStream stream(t);
    return memory_viz_stacks(stream);
}

void export_memory_viz(TraceStream& trace, const StackFrames& frames, ExportWriter& out,
                       const ExportProgress& progress) {
    MemoryViz(trace, frames, out).run(progress);
}

void export_memory_viz(const Trace& trace, const StackFrames& frames, ExportWriter& out,
                       const ExportProgress& progress) {
    TraceStream stream(trace);
    export_memory_viz(stream, frames, out, progress);
}

}  // namespace allocscope
