// A minimal allocscope_host_v2 for the built-in plugins' tests: a Stream is a
// synthetic event list written like a training loop's calls, and a Driver
// loads nothing itself but drives a plugin (loaded with load_plugin, from the
// module path the test's meson definition puts in the environment) through
// one or two streams the way the real host does:
//   * one rank's stream, events in sequence order, only the kinds in the
//     plugin's event_mask; every event of a stream takes one sequence
//     number (from 1), whether delivered or not, so a test can predict them;
//   * per-thread tag stacks (a NULL layer or phase on push keeps the
//     enclosing one): ALLOC/FREE carry the thread's current tag; TAG_PUSH
//     the new tag, TAG_POP the tag being left (a pop without a push: "");
//   * a live table keyed by (level, address): FREE gets the size and the
//     alloc_* fields of the allocation it frees (alloc_seq 0 and size 0 for
//     an unknown address); live_foreach / live_bytes read it;
//   * on_step(step), as core/plugin_host.h does it: when a STEP event
//     carries a step other than the current one (0 when a stream begins),
//     or any other event a larger one, before that event;
//   * baseline mode: run(baseline, run) sets has_baseline and delivers the
//     baseline stream (source BASELINE) first, then the run's (RUN), each
//     with its own live table and tags; params stay registered across;
//   * DERIVED events name a parameter the same stream registered earlier
//     (Stream::derived); param_index is that registration's host index, as
//     core/plugin_host.cpp maps a trace's parameter indices;
//   * a finding whose struct_size is short of allocscope_finding_v2 has its
//     basis and evidence notes left unread (the host refuses it);
//   * options ("<key>" of this plugin), rank and world size, findings (copied,
//     with plugin name and rank) and log lines collected;
//   * a call that fails disables the plugin: nothing more is delivered,
//     failed_call() names it; finish() still runs once so the plugin frees
//     its state, and what it emits then is dropped (findings emitted before
//     the failure are kept).
// An allocation's stack id, unless given, is a stable id of its tag (1, 2,
// ... in order of first use), so evidence carries non-zero stacks.
#pragma once

#include <allocscope/plugin_v2.h>
#include <allocscope/sdk/evidence.h>
#include <dlfcn.h>
#include <elf.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace allocscope::test {

// The plugin struct of the module at the path in environment variable
// `variable`. The module stays loaded for the life of the process. Throws
// when the variable is unset or the module cannot be loaded.
inline const allocscope_plugin_v2* load_plugin(const char* variable) {
    const char* path = std::getenv(variable);
    if (!path) throw std::runtime_error(std::string(variable) + " is not set (see meson.build)");
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw std::runtime_error(std::string("dlopen ") + path + ": " + dlerror());
    auto* plugin =
        static_cast<const allocscope_plugin_v2*>(dlsym(handle, ALLOCSCOPE_PLUGIN_V2_SYMBOL));
    if (!plugin) throw std::runtime_error(std::string(path) + ": no " ALLOCSCOPE_PLUGIN_V2_SYMBOL);
    return plugin;
}

// Names of the symbols an ELF64 shared object defines in its dynamic
// symbol table (global, weak or unique binding), or nullopt when the file
// cannot be read as one.
inline std::optional<std::vector<std::string>> defined_dynamic_symbols(const char* path) {
    if (!path) return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto fits = [&](uint64_t offset, uint64_t size) {
        return offset <= image.size() && size <= image.size() - offset;
    };
    Elf64_Ehdr eh;
    if (!fits(0, sizeof eh)) return std::nullopt;
    std::memcpy(&eh, image.data(), sizeof eh);
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) ||
        !fits(eh.e_shoff, uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr))) {
        return std::nullopt;
    }
    auto section = [&](size_t i) {
        Elf64_Shdr sh;
        std::memcpy(&sh, image.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
        return sh;
    };
    std::vector<std::string> names;
    for (size_t i = 0; i < eh.e_shnum; ++i) {
        const Elf64_Shdr sh = section(i);
        if (sh.sh_type != SHT_DYNSYM) continue;
        if (sh.sh_link >= eh.e_shnum || !fits(sh.sh_offset, sh.sh_size)) return std::nullopt;
        const Elf64_Shdr strtab = section(sh.sh_link);
        if (!fits(strtab.sh_offset, strtab.sh_size)) return std::nullopt;
        for (uint64_t k = 1; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
            Elf64_Sym sym;
            std::memcpy(&sym, image.data() + sh.sh_offset + k * sizeof sym, sizeof sym);
            const unsigned bind = ELF64_ST_BIND(sym.st_info);
            if (sym.st_shndx == SHN_UNDEF ||
                (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) ||
                sym.st_name >= strtab.sh_size) {
                continue;
            }
            const char* name = image.data() + strtab.sh_offset + sym.st_name;
            names.emplace_back(name, strnlen(name, strtab.sh_size - sym.st_name));
        }
        return names;
    }
    return std::nullopt;
}

// One event of a Stream, its tag resolved when it was written.
struct StreamEvent {
    uint32_t kind = 0;
    uint64_t seq = 0;
    uint64_t step = 0;
    uint32_t tid = 1;
    uint32_t level = ALLOCSCOPE_LEVEL_NONE;
    uint64_t address = 0;
    uint64_t size = 0;
    uint32_t stack = 0;
    std::string layer;
    std::string phase;
    std::string text;           // MARK: the note; DERIVED: how
    uint32_t stream_param = 0;  // DERIVED: the stream's registration (0, 1, ... in order)
    // PARAM
    std::string param_layer;
    std::string param_name;
    uint64_t numel = 0;
    uint64_t sharded_numel = 0;
    std::string dtype;
};

// Events as one rank's program would produce them. Every call returns the
// event's sequence number.
class Stream {
  public:
    uint64_t step(uint64_t n) {
        step_ = n;
        return add(event(ALLOCSCOPE_EVENT_STEP, 1));
    }
    // Enters (layer, phase) on `tid`; nullptr keeps the enclosing value.
    uint64_t push(const char* layer, const char* phase, uint32_t tid = 1) {
        std::vector<Tag>& stack = tags_[tid];
        Tag t = stack.empty() ? Tag{} : stack.back();
        if (layer) t.layer = layer;
        if (phase) t.phase = phase;
        stack.push_back(t);
        return add(event(ALLOCSCOPE_EVENT_TAG_PUSH, tid));
    }
    uint64_t pop(uint32_t tid = 1) {
        StreamEvent e = event(ALLOCSCOPE_EVENT_TAG_POP, tid);
        std::vector<Tag>& stack = tags_[tid];
        if (!stack.empty()) stack.pop_back();
        return add(std::move(e));
    }
    // `stack`: the stack id; unset: the tag's own (see above); 0: none.
    uint64_t alloc(uint64_t address, uint64_t size, uint32_t tid = 1,
                   uint32_t level = ALLOCSCOPE_LEVEL_BLOCK,
                   std::optional<uint32_t> stack = std::nullopt) {
        StreamEvent e = event(ALLOCSCOPE_EVENT_ALLOC, tid);
        e.level = level;
        e.address = address;
        e.size = size;
        e.stack = stack ? *stack : tag_stack(e.layer, e.phase);
        return add(std::move(e));
    }
    uint64_t free(uint64_t address, uint32_t tid = 1, uint32_t level = ALLOCSCOPE_LEVEL_BLOCK) {
        StreamEvent e = event(ALLOCSCOPE_EVENT_FREE, tid);
        e.level = level;
        e.address = address;
        return add(std::move(e));
    }
    uint64_t oom(uint64_t size, uint32_t tid = 1, uint32_t level = ALLOCSCOPE_LEVEL_SEGMENT) {
        StreamEvent e = event(ALLOCSCOPE_EVENT_OOM, tid);
        e.level = level;
        e.size = size;
        return add(std::move(e));
    }
    uint64_t param(const std::string& layer, const std::string& name, uint64_t numel,
                   uint64_t sharded_numel, const std::string& dtype = "bf16") {
        StreamEvent e = event(ALLOCSCOPE_EVENT_PARAM, 1);
        e.param_layer = layer;
        e.param_name = name;
        e.numel = numel;
        e.sharded_numel = sharded_numel;
        e.dtype = dtype;
        registered_[layer + '\n' + name] = params_++;
        return add(std::move(e));
    }
    // Provenance: the allocation at `address` holds bytes computed from
    // parameter (layer, name), which this stream registered earlier (its
    // latest registration); `how` as allocscope_derived() takes it.
    uint64_t derived(uint64_t address, const std::string& layer, const std::string& name,
                     const std::string& how = "", uint32_t tid = 1) {
        auto it = registered_.find(layer + '\n' + name);
        if (it == registered_.end())
            throw std::logic_error("derived: " + layer + "." + name + " not registered");
        StreamEvent e = event(ALLOCSCOPE_EVENT_DERIVED, tid);
        e.address = address;
        e.stream_param = it->second;
        e.text = how;
        return add(std::move(e));
    }
    uint64_t mark(const std::string& text, uint32_t tid = 1) {
        StreamEvent e = event(ALLOCSCOPE_EVENT_MARK, tid);
        e.text = text;
        return add(std::move(e));
    }

    const std::vector<StreamEvent>& events() const { return events_; }
    uint64_t last_seq() const { return events_.empty() ? 0 : events_.back().seq; }

  private:
    struct Tag {
        std::string layer;
        std::string phase;
    };
    StreamEvent event(uint32_t kind, uint32_t tid) const {
        StreamEvent e;
        e.kind = kind;
        e.seq = events_.size() + 1;
        e.step = step_;
        e.tid = tid;
        auto it = tags_.find(tid);
        if (it != tags_.end() && !it->second.empty()) {
            e.layer = it->second.back().layer;
            e.phase = it->second.back().phase;
        }
        return e;
    }
    uint64_t add(StreamEvent e) {
        events_.push_back(std::move(e));
        return events_.back().seq;
    }
    uint32_t tag_stack(const std::string& layer, const std::string& phase) {
        auto [it, added] = stacks_.try_emplace(layer + '\0' + phase, uint32_t(stacks_.size() + 1));
        return it->second;
    }

    std::vector<StreamEvent> events_;
    std::unordered_map<uint32_t, std::vector<Tag>> tags_;
    std::map<std::string, uint32_t> stacks_;
    std::map<std::string, uint32_t> registered_;  // "layer\nname" -> registration
    uint32_t params_ = 0;
    uint64_t step_ = 0;
};

// One evidence entry as the host would copy it: the SDK's Evidence.
using CollectedEvidence = allocscope::Evidence;

struct CollectedFinding {
    std::string plugin;
    int32_t rank = -1;
    uint32_t severity = 0;
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::vector<CollectedEvidence> evidence;
    std::string basis;
};

class Driver {
  public:
    explicit Driver(const allocscope_plugin_v2* plugin) : plugin_(*plugin) {
        host_.struct_size = sizeof host_;
        host_.abi_version = ALLOCSCOPE_PLUGIN_V2_ABI_VERSION;
        host_.ctx = this;
        host_.rank = 0;
        host_.world_size = 1;
        host_.param_count = [](void* ctx) { return self(ctx).params_.size(); };
        host_.param = [](void* ctx, size_t i) -> const allocscope_param_v2* {
            Driver& d = self(ctx);
            return i < d.params_.size() ? &d.params_[i].view : nullptr;
        };
        host_.live_foreach = [](void* ctx, uint32_t level, allocscope_live_visitor_v2 visit,
                                void* user) -> size_t {
            size_t n = 0;
            for (const auto& [key, r] : self(ctx).live_) {
                if (level != 0 && r.level != level) continue;
                const allocscope_live_v2 l{r.address,
                                           r.size,
                                           r.seq,
                                           r.step,
                                           r.level,
                                           r.stack,
                                           self(ctx).interned(r.layer),
                                           self(ctx).interned(r.phase)};
                ++n;
                if (visit(user, &l)) break;
            }
            return n;
        };
        host_.live_bytes = [](void* ctx, uint32_t level) -> uint64_t {
            uint64_t bytes = 0;
            for (const auto& [key, r] : self(ctx).live_) {
                if (level == 0 || r.level == level) bytes += r.size;
            }
            return bytes;
        };
        host_.option = [](void* ctx, const char* key) -> const char* {
            const auto& options = self(ctx).options_;
            auto it = options.find(key);
            return it == options.end() ? nullptr : it->second.c_str();
        };
        host_.emit = [](void* ctx, const allocscope_finding_v2* f) { self(ctx).collect(*f); };
        host_.log = [](void* ctx, const char* message) {
            Driver& d = self(ctx);
            d.logs_.push_back(std::string(d.plugin_.name) + ": " + message);
        };
    }
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    void set_option(const std::string& key, const std::string& value) { options_[key] = value; }
    void set_rank(int32_t rank, int32_t world_size) {
        host_.rank = rank;
        host_.world_size = world_size;
    }

    // init, the stream, finish. True when the plugin was not disabled.
    bool run(const Stream& stream) { return drive(nullptr, stream); }
    // Baseline mode: the baseline's stream first.
    bool run(const Stream& baseline, const Stream& stream) { return drive(&baseline, stream); }

    const std::vector<CollectedFinding>& findings() const { return findings_; }
    const std::vector<std::string>& logs() const { return logs_; }
    // "init", "on_event", "on_step", "finish" or "abi"; empty when none failed.
    const std::string& failed_call() const { return failed_; }

  private:
    struct Live {
        uint64_t address = 0;
        uint64_t size = 0;
        uint64_t seq = 0;
        uint64_t step = 0;
        uint32_t level = 0;
        uint32_t stack = 0;
        std::string layer;
        std::string phase;
    };
    struct Param {
        std::string layer, name, dtype;
        allocscope_param_v2 view{};
    };

    static Driver& self(void* ctx) { return *static_cast<Driver*>(ctx); }

    bool drive(const Stream* baseline, const Stream& stream) {
        if (ran_) throw std::logic_error("a Driver runs once");
        ran_ = true;
        if (plugin_.struct_size < sizeof(allocscope_plugin_v2) ||
            plugin_.abi_version != ALLOCSCOPE_PLUGIN_V2_ABI_VERSION) {
            failed_ = "abi";
            return false;
        }
        host_.has_baseline = baseline ? 1 : 0;
        void* state = nullptr;
        if (plugin_.init(&host_, &state) != ALLOCSCOPE_PLUGIN_OK) {
            failed_ = "init";
            return false;
        }
        if (baseline) deliver(state, *baseline, ALLOCSCOPE_SOURCE_BASELINE);
        deliver(state, stream, ALLOCSCOPE_SOURCE_RUN);
        dropping_ = !failed_.empty();
        if (plugin_.finish(state) != ALLOCSCOPE_PLUGIN_OK && failed_.empty()) failed_ = "finish";
        return failed_.empty();
    }

    void deliver(void* state, const Stream& stream, uint32_t source) {
        live_.clear();
        std::vector<uint32_t> host_index;  // the stream's registrations -> params_ indices
        uint64_t step = 0;
        for (const StreamEvent& s : stream.events()) {
            if (!failed_.empty()) return;
            if (s.kind == ALLOCSCOPE_EVENT_STEP ? s.step != step : s.step > step) {
                step = s.step;
                if (plugin_.on_step(state, step, source) != ALLOCSCOPE_PLUGIN_OK) {
                    failed_ = "on_step";
                    return;
                }
            }
            allocscope_event_v2 e{};
            e.struct_size = sizeof e;
            e.seq = s.seq;
            e.t_ns = s.seq * 1000;
            e.step = s.step;
            e.address = s.address;
            e.size = s.size;
            e.kind = s.kind;
            e.level = s.level;
            e.source = source;
            e.device = 0;
            e.tid = s.tid;
            e.stack_id = s.stack;
            e.layer = interned(s.layer);
            e.phase = interned(s.phase);
            e.alloc_layer = e.alloc_phase = interned("");
            e.text = s.text.c_str();
            Live freed;  // keeps the alloc_* strings alive during the call
            if (s.kind == ALLOCSCOPE_EVENT_ALLOC) {
                live_[{s.level, s.address}] = {s.address, s.size,  s.seq,   s.step,
                                               s.level,   s.stack, s.layer, s.phase};
            } else if (s.kind == ALLOCSCOPE_EVENT_FREE) {
                auto it = live_.find({s.level, s.address});
                if (it != live_.end()) {
                    freed = std::move(it->second);
                    live_.erase(it);
                    e.size = freed.size;
                    e.alloc_seq = freed.seq;
                    e.alloc_step = freed.step;
                    e.alloc_layer = interned(freed.layer);
                    e.alloc_phase = interned(freed.phase);
                    e.alloc_stack_id = freed.stack;
                }
            } else if (s.kind == ALLOCSCOPE_EVENT_PARAM) {
                Param& p = params_.emplace_back();  // a deque: earlier views stay valid
                p.layer = s.param_layer;
                p.name = s.param_name;
                p.dtype = s.dtype;
                p.view = {p.layer.c_str(), p.name.c_str(), s.numel, s.sharded_numel,
                          p.dtype.c_str()};
                e.param_index = uint32_t(params_.size() - 1);
                host_index.push_back(e.param_index);
            } else if (s.kind == ALLOCSCOPE_EVENT_DERIVED) {
                e.param_index = host_index.at(s.stream_param);
            }
            if (!(plugin_.event_mask & ALLOCSCOPE_EVENT_BIT(s.kind))) continue;
            if (plugin_.on_event(state, &e) != ALLOCSCOPE_PLUGIN_OK) failed_ = "on_event";
        }
    }

    void collect(const allocscope_finding_v2& f) {
        if (dropping_) return;
        CollectedFinding c;
        c.plugin = plugin_.name;
        c.rank = host_.rank;
        c.severity = f.severity;
        c.layer = f.layer ? f.layer : "";
        c.phase = f.phase ? f.phase : "";
        c.bytes = f.bytes;
        c.count = f.count;
        c.summary = f.summary ? f.summary : "";
        const bool extended = f.struct_size >= sizeof(allocscope_finding_v2);
        const char* const* notes = extended ? f.evidence_notes : nullptr;
        if (extended && f.basis) c.basis = f.basis;
        for (size_t i = 0; i < f.evidence_count; ++i) {
            const allocscope_evidence_v2& e = f.evidence[i];
            c.evidence.push_back({e.size, e.layer ? e.layer : "", e.phase ? e.phase : "", e.step,
                                  e.alloc_seq, e.free_seq, e.stack_id,
                                  notes && notes[i] ? notes[i] : ""});
        }
        findings_.push_back(std::move(c));
    }

    const allocscope_plugin_v2& plugin_;
    allocscope_host_v2 host_{};
    std::map<std::string, std::string> options_;
    std::map<std::pair<uint32_t, uint64_t>, Live> live_;
    std::deque<Param> params_;
    // Tag strings as plugin_v2.h promises them: one address per text, valid
    // until finish (node-based: elements never move).
    const char* interned(const std::string& text) { return tags_.insert(text).first->c_str(); }
    std::unordered_set<std::string> tags_;
    std::vector<CollectedFinding> findings_;
    std::vector<std::string> logs_;
    std::string failed_;
    bool ran_ = false;
    bool dropping_ = false;
};

}  // namespace allocscope::test
