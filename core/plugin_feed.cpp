// The plugin host's event stream (core/plugin_host.h): events of the
// interposer's ring or of a recorded trace become allocscope_event_v2 (and,
// through the v1 adapter, allocscope_event_v1) with
// interned tags, the live table the plugins read is kept (or, viewing the
// interposer writer's Replay, read from the changes it reports), and step
// changes and events are delivered to every enabled plugin.
#include <allocscope/allocscope.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "plugin_host.h"
#include "plugin_host_state.h"
#include "replay.h"

namespace allocscope {

bool PluginHost::ProvenanceSteps::on_mark(std::string_view mark, uint64_t step) {
    if (mark == ALLOCSCOPE_PROVENANCE_PAUSED) {
        if (observing) {
            if (step > from) observed.emplace_back(from, step - 1);
            observing = false;
            windowed = true;
        }
        return true;
    }
    if (mark == ALLOCSCOPE_PROVENANCE_RESUMED) {
        if (!observing) {
            observing = true;
            from = step;
        }
        return true;
    }
    // On, or off: a new start.
    const uint64_t last = last_step;
    *this = ProvenanceSteps{};
    on_step = from = step;
    last_step = std::max(last, step);
    return false;
}

std::string PluginHost::ProvenanceSteps::text() const {
    std::vector<std::pair<uint64_t, uint64_t>> all = observed;
    if (observing && last_step >= from) all.emplace_back(from, last_step);
    std::string out = "in steps ";
    for (size_t i = 0; i < all.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(all[i].first);
        if (all[i].second != all[i].first) out += "–" + std::to_string(all[i].second);
    }
    if (all.empty()) out += "none";
    return out + " of " + std::to_string(on_step) + "–" + std::to_string(last_step);
}

namespace {

// The v1 adapter's event: version 1's fields. Kinds version 1 did not have
// (DERIVED) never get here: they are out of every version 1 plugin's mask
// (PluginHost::install).
allocscope_event_v1 to_v1(const allocscope_event_v2& ev) {
    allocscope_event_v1 v1{};
    v1.seq = ev.seq;
    v1.t_ns = ev.t_ns;
    v1.step = ev.step;
    // Version 1's OOM event had no address (0); version 2's carries the
    // device's free bytes there.
    v1.address = ev.kind == ALLOCSCOPE_EVENT_OOM ? 0 : ev.address;
    v1.size = ev.size;
    v1.kind = ev.kind;
    v1.level = ev.level;
    v1.source = ev.source;
    v1.device = ev.device;
    v1.tid = ev.tid;
    v1.stack_id = ev.stack_id;
    v1.layer = ev.layer;
    v1.phase = ev.phase;
    v1.alloc_seq = ev.alloc_seq;
    v1.alloc_step = ev.alloc_step;
    v1.alloc_layer = ev.alloc_layer;
    v1.alloc_phase = ev.alloc_phase;
    v1.alloc_stack_id = ev.alloc_stack_id;
    v1.param_index = ev.param_index;
    v1.text = ev.text;
    return v1;
}

}  // namespace

void PluginHost::start_stream(uint32_t source) {
    source_ = source;
    mapped_table_ = nullptr;
    mapped_.clear();
    param_index_.clear();
    step_ = 0;
    live_ = Replay{};
    // The viewed Replay holds the old stream's allocations: from here the
    // host keeps its own table.
    view_ = nullptr;
    view_strings_ = nullptr;
    failing_.clear();
}

void PluginHost::view_live(const Replay& live, const std::vector<std::string>& strings) {
    view_ = &live;
    view_strings_ = &strings;
    live_ = Replay{};
}

const char* PluginHost::record_text(uint32_t id) {
    if (!view_) return strings_.at(id).c_str();
    return strings_.at(host_string(*view_strings_, id)).c_str();
}

const char* PluginHost::live_text(uint32_t id) noexcept {
    try {
        return record_text(id);
    } catch (...) {
        return strings_.at(0).c_str();
    }
}

void PluginHost::feed(const Event& e, const EventText& text, uint32_t source) {
    if (finished_ || enabled_count() == 0) return;
    if (source != source_) start_stream(source);
    // Both ids first: the event's view points into the table's storage.
    const uint32_t layer = strings_.intern(text.layer).id;
    const uint32_t phase = strings_.intern(text.phase).id;
    deliver(e, layer, phase, text, source, {});
}

namespace {

// Detectors see the memory a program's tensors live in: runtime-API
// segments, driver mappings (an expandable allocator's segments) and
// blocks. Not physical handles and VA reservations (the mappings are the
// memory a tag owns), and not plain driver allocations: those are
// libraries' own (a cuBLAS handle made inside a layer's backward would look
// like that layer's retained memory), and not the blocks of CUDA graphs'
// private pools (kFlagGraphPool: a graph holds them while it can be
// replayed, by design; their frees read as of unknown addresses, as plain
// driver allocations' do). Reports account for all.
bool hidden_from_plugins(const Event& e) noexcept {
    if (e.kind != EventKind::alloc && e.kind != EventKind::free && e.kind != EventKind::oom)
        return false;
    const Pool pool = pool_of(e);
    return pool == Pool::physical || pool == Pool::address_range ||
           is_direct_driver_allocation(e.api) ||
           (e.kind == EventKind::alloc && (e.flags & kFlagGraphPool) != 0);
}

}  // namespace

void PluginHost::release_held(uint32_t tid, uint32_t source) {
    auto it = std::find_if(failing_.begin(), failing_.end(),
                           [&](const auto& f) { return f.first == tid; });
    if (it == failing_.end()) return;
    std::vector<HeldPop> held = std::move(it->second);
    failing_.erase(it);
    for (const HeldPop& h : held)
        deliver(h.event, h.layer, h.phase, EventText{}, source, {});
}

void PluginHost::before_live_change(const Event& e, uint32_t source) {
    // As feed() would: an owning host releases them in deliver(), before
    // its own apply; a new stream (start_stream) drops them.
    if (!view_ || finished_ || enabled_count() == 0 || source != source_) return;
    if (e.kind != EventKind::alloc || failing_.empty() || hidden_from_plugins(e)) return;
    release_held(e.tid, source);
}

void PluginHost::deliver(const Event& e, uint32_t layer, uint32_t phase, const EventText& text,
                         uint32_t source, std::span<const LiveChange> changes) {
    if (hidden_from_plugins(e)) return;
    // After a failed allocation, a thread's pops wait for it to allocate
    // again (plugin_host.h). Few threads ever fail: a short list. (A
    // viewing host released them in before_live_change().)
    if (!failing_.empty() || e.kind == EventKind::oom) {
        auto it = std::find_if(failing_.begin(), failing_.end(),
                               [&](const auto& f) { return f.first == e.tid; });
        if (e.kind == EventKind::oom) {
            if (it == failing_.end()) failing_.emplace_back(e.tid, std::vector<HeldPop>{});
        } else if (it != failing_.end() && e.kind == EventKind::tag_pop) {
            it->second.push_back({e, layer, phase});
            return;
        } else if (it != failing_.end() && e.kind == EventKind::alloc) {
            release_held(e.tid, source);
        }
    }
    // The run stream's latest step that did work (a tag pushed: not the
    // frees at exit after the last step's counter moved on).
    if (e.kind == EventKind::tag_push && source == ALLOCSCOPE_SOURCE_RUN)
        provenance_steps_.last_step = std::max(provenance_steps_.last_step, e.step);
    // A program's word on provenance (allocscope.h, ALLOCSCOPE_PROVENANCE_MARK),
    // for the findings file: the run stream's, the last one counts.
    if (e.kind == EventKind::mark && source == ALLOCSCOPE_SOURCE_RUN) {
        constexpr std::string_view kMark = ALLOCSCOPE_PROVENANCE_MARK;
        if (text.text.substr(0, kMark.size()) == kMark &&
            !provenance_steps_.on_mark(text.text, e.step))
            provenance_ = std::string(text.text.substr(kMark.size()));
    }
    allocscope_event_v2 ev{};
    ev.struct_size = sizeof ev;
    ev.seq = e.seq;
    ev.t_ns = e.t_ns;
    ev.step = e.step;
    ev.address = e.address;
    ev.size = e.size;
    ev.kind = static_cast<uint32_t>(e.kind);
    ev.level = static_cast<uint32_t>(e.level);
    ev.source = source;
    ev.device = e.device;
    ev.tid = e.tid;
    ev.stack_id = e.stack;
    // Interned tag strings: the same text always at the same address, which
    // plugin_v2.h promises plugins (they may key by pointer).
    ev.layer = strings_.at(layer).c_str();
    ev.phase = strings_.at(phase).c_str();
    ev.alloc_layer = ev.alloc_phase = strings_.at(0).c_str();  // "", interned too
    ev.text = "";
    std::vector<allocscope_event_v2> range_frees;

    switch (e.kind) {
        case EventKind::alloc: {
            // An address already live (its free was never seen) is replaced.
            // (Viewing: the caller's Replay has applied it.)
            if (view_) break;
            Event tagged = e;
            tagged.layer = layer;
            tagged.phase = phase;
            live_.apply(tagged, [](const LiveChange&) {});
            break;
        }
        case EventKind::free: {
            if (e.result != 0) return;  // the runtime refused: nothing was freed
            // One free a plugin sees per allocation released: a range unmap
            // (kFlagRange) is one per mapping it covers. Viewing, the
            // changes are the caller's Replay's for this event.
            const bool range = (e.flags & kFlagRange) != 0;
            auto freed = [&](const LiveChange& c) {
                if (c.kind != LiveChange::Kind::free) return;
                allocscope_event_v2& out = range ? range_frees.emplace_back(ev) : ev;
                out.address = c.address;
                if (range) out.size = 0;  // the range's length is no free's size
                // A plain driver allocation (only a view holds one) was never
                // delivered: its free reads as of an unknown address.
                if (c.outcome == FreeOutcome::freed && shown_to_plugins(c.pool, c.record)) {
                    out.size = c.record.size;
                    out.alloc_seq = c.record.seq;
                    out.alloc_step = c.record.step;
                    out.alloc_layer = record_text(c.record.layer);
                    out.alloc_phase = record_text(c.record.phase);
                    out.alloc_stack_id = c.record.stack;
                }
            };
            if (view_) {
                for (const LiveChange& c : changes)
                    freed(c);
            } else {
                live_.apply(e, freed);
            }
            break;
        }
        case EventKind::param: {
            if (text.param) {
                StoredParam& p = params_.emplace_back();
                p.layer = std::string(text.param->layer);
                p.name = std::string(text.param->name);
                p.dtype = std::string(text.param->dtype);
                p.view.layer = p.layer.c_str();
                p.view.name = p.name.c_str();
                p.view.dtype = p.dtype.c_str();
                p.view.numel = text.param->numel;
                p.view.sharded_numel = text.param->sharded_numel;
                ev.param_index = static_cast<uint32_t>(params_.size() - 1);
                if (e.aux < (uint32_t{1} << 24)) {  // a trace's indices are dense
                    if (param_index_.size() <= e.aux) param_index_.resize(e.aux + 1, kUnmapped);
                    param_index_[e.aux] = ev.param_index;
                }
            }
            break;
        }
        case EventKind::derived: {
            // About a parameter the stream never registered: nothing to say.
            if (e.aux >= param_index_.size() || param_index_[e.aux] == kUnmapped) return;
            ev.param_index = param_index_[e.aux];
            break;
        }
        default:
            break;
    }

    const bool step_changed = e.kind == EventKind::step ? e.step != step_ : e.step > step_;
    if (step_changed) {
        step_ = e.step;
        for (auto& in : instances_) {
            if (in->enabled && in->on_step) {
                invoke(*in, "on_step", [&] { return in->on_step(in->state, step_, source); });
            }
        }
    }
    std::string note;
    if (e.kind == EventKind::mark || e.kind == EventKind::derived) {
        note = text.text;
        ev.text = note.c_str();
    }
    // A kind outside the mask's 32 bits reaches no plugin.
    const uint32_t bit = ev.kind < 32 ? ALLOCSCOPE_EVENT_BIT(ev.kind) : 0u;
    for (const allocscope_event_v2& one :
         range_frees.empty() ? std::span(&ev, 1) : std::span(range_frees)) {
        // Version 1 plugins get the event through the v1 adapter, made once.
        allocscope_event_v1 v1{};
        bool v1_made = false;
        for (auto& in : instances_) {
            if (!in->enabled || (in->event_mask & bit) == 0) continue;
            if (in->plugin && in->plugin->on_event) {
                invoke(*in, "on_event", [&] { return in->plugin->on_event(in->state, &one); });
            } else if (in->plugin_v1 && in->plugin_v1->on_event) {
                if (!v1_made) v1 = to_v1(one);
                v1_made = true;
                invoke(*in, "on_event", [&] { return in->plugin_v1->on_event(in->state, &v1); });
            }
        }
    }
}

uint32_t PluginHost::host_string(std::span<const std::string> strings, uint32_t id) {
    // The caller's table only grows while it feeds one stream (a trace's,
    // the interposer's written strings); another table starts over.
    if (strings.data() != mapped_table_ || strings.size() < mapped_.size()) {
        mapped_table_ = strings.data();
        mapped_.clear();
    }
    if (id >= strings.size()) return 0;
    if (id >= mapped_.size()) mapped_.resize(strings.size(), kUnmapped);
    uint32_t& host = mapped_[id];
    if (host == kUnmapped) host = strings_.intern(strings[id]).id;
    return host;
}

void PluginHost::feed(const Event& e, std::span<const std::string> strings,
                      std::span<const ParamRecord> params, uint32_t source) {
    feed(e, strings, params, {}, source);
}

void PluginHost::feed(const Event& e, std::span<const std::string> strings,
                      std::span<const ParamRecord> params, std::span<const LiveChange> changes,
                      uint32_t source) {
    if (finished_ || enabled_count() == 0) return;
    if (source != source_) start_stream(source);
    auto str = [&strings](uint32_t id) -> std::string_view {
        return id < strings.size() ? std::string_view(strings[id]) : std::string_view();
    };
    EventText text;
    ParamInfo param;
    if (e.kind == EventKind::mark) text.text = str(e.aux);
    if (e.kind == EventKind::derived) text.text = str(static_cast<uint32_t>(e.stream));
    if (e.kind == EventKind::param && e.aux < params.size()) {
        const ParamRecord& p = params[e.aux];
        param.layer = str(p.layer);
        param.name = str(p.name);
        param.dtype = str(p.dtype);
        param.numel = p.numel;
        param.sharded_numel = p.sharded_numel;
        text.param = &param;
    }
    const uint32_t layer = host_string(strings, e.layer);
    const uint32_t phase = host_string(strings, e.phase);
    deliver(e, layer, phase, text, source, changes);
}

}  // namespace allocscope
