// C++ side of the plugin ABI (include/allocscope/plugin_v1.h) shared by the
// built-in plugins: the adapter from a C++ class to the C struct, per-thread
// tag tracking, and finding construction. Header-only; each plugin is its
// own shared module, so nothing here is shared at run time.
#pragma once

#include <allocscope/plugin_v1.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace allocscope::plugins {

// `phase` is `base` or one of its sub-phases ("forward/quantize" is within
// "forward").
inline bool phase_within(std::string_view phase, std::string_view base) {
    return phase == base || (phase.size() > base.size() && phase.substr(0, base.size()) == base &&
                             phase[base.size()] == '/');
}

// `layer` is the module `scope` or one of its sub-modules
// ("layers.3.mlp.fc1" is within "layers.3", "layers.30" is not).
inline bool layer_within(std::string_view layer, std::string_view scope) {
    return layer == scope || (layer.size() > scope.size() &&
                              layer.substr(0, scope.size()) == scope && layer[scope.size()] == '.');
}

struct Tag {
    std::string layer;
    std::string phase;
    bool operator==(const Tag&) const = default;
};

// Per-thread tag stacks rebuilt from TAG_PUSH / TAG_POP events, so a plugin
// knows what a pop returns to (the enclosing tag). A pop on an empty stack
// (a stream that starts mid-scope) is ignored.
class TagTracker {
  public:
    void on_event(const allocscope_event_v1& e) {
        std::vector<Tag>& stack = stacks_[e.tid];
        if (e.kind == ALLOCSCOPE_EVENT_TAG_PUSH) {
            stack.push_back({e.layer ? e.layer : "", e.phase ? e.phase : ""});
        } else if (e.kind == ALLOCSCOPE_EVENT_TAG_POP && !stack.empty()) {
            stack.pop_back();
        }
    }
    // The thread's tag after the events seen so far ("" / "" when none).
    Tag current(uint32_t tid) const {
        auto it = stacks_.find(tid);
        if (it == stacks_.end() || it->second.empty()) return {};
        return it->second.back();
    }
    std::size_t depth(uint32_t tid) const {
        auto it = stacks_.find(tid);
        return it == stacks_.end() ? 0 : it->second.size();
    }
    void clear() { stacks_.clear(); }

  private:
    std::unordered_map<uint32_t, std::vector<Tag>> stacks_;
};

// One allocation that proves a finding; strings owned here.
struct Evidence {
    uint64_t size = 0;
    std::string layer;
    std::string phase;
    uint64_t step = 0;
    uint64_t alloc_seq = 0;
    uint64_t free_seq = 0;  // 0: alive when the finding was made
    uint32_t stack_id = 0;
};

struct Finding {
    allocscope_severity_v1 severity = ALLOCSCOPE_SEVERITY_WARNING;
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::vector<Evidence> evidence;
};

// Hands a Finding to the host (which copies it).
inline void emit(const allocscope_host_v1& host, const Finding& f) {
    std::vector<allocscope_evidence_v1> ev;
    ev.reserve(f.evidence.size());
    for (const Evidence& e : f.evidence) {
        ev.push_back({e.size, e.layer.c_str(), e.phase.c_str(), e.step, e.alloc_seq, e.free_seq,
                      e.stack_id});
    }
    allocscope_finding_v1 out{};
    out.struct_size = sizeof out;
    out.severity = uint32_t(f.severity);
    out.layer = f.layer.c_str();
    out.phase = f.phase.c_str();
    out.bytes = f.bytes;
    out.count = f.count;
    out.summary = f.summary.c_str();
    out.evidence = ev.data();
    out.evidence_count = ev.size();
    host.emit(host.ctx, &out);
}

// Option `key` of this plugin as a number, or `fallback` when unset. A value
// that is not a non-negative integer (optionally with a K/M/G/KiB/MiB/GiB
// suffix) throws std::invalid_argument naming the option, which disables
// the plugin with that message.
inline uint64_t option_bytes(const allocscope_host_v1& host, const char* key, uint64_t fallback) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    std::string_view v(text);
    uint64_t value = 0;
    std::size_t i = 0;
    for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) {
        if (value > (UINT64_MAX - 9) / 10)
            throw std::invalid_argument(std::string(key) + "=" + text + ": too large");
        value = value * 10 + uint64_t(v[i] - '0');
    }
    const std::string_view suffix = v.substr(i);
    uint64_t unit = 1;
    if (suffix == "K" || suffix == "KiB")
        unit = 1ull << 10;
    else if (suffix == "M" || suffix == "MiB")
        unit = 1ull << 20;
    else if (suffix == "G" || suffix == "GiB")
        unit = 1ull << 30;
    else if (!suffix.empty() && suffix != "B")
        i = 0;
    if (i == 0) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected bytes such as 51200, 50KiB or 1MiB");
    }
    return value * unit;
}

inline double option_number(const allocscope_host_v1& host, const char* key, double fallback) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= 0)) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected a non-negative number");
    }
    return value;
}

// C ABI trampolines for a class T with
//   explicit T(const allocscope_host_v1& host);
//   void on_event(const allocscope_event_v1& event);
//   void on_step(uint64_t step, uint32_t source);
//   void finish();
// An exception becomes ALLOCSCOPE_PLUGIN_ERROR and is logged through the
// host, so the host disables the plugin with the reason.
template <class T>
struct Adapter {
    static void log_exception(const allocscope_host_v1* host, const char* call) noexcept {
        try {
            throw;
        } catch (const std::exception& e) {
            if (host) host->log(host->ctx, (std::string(call) + ": " + e.what()).c_str());
        } catch (...) {
            if (host) host->log(host->ctx, (std::string(call) + ": unknown exception").c_str());
        }
    }
    struct State {
        const allocscope_host_v1* host;
        std::unique_ptr<T> plugin;
    };
    static allocscope_plugin_status init(const allocscope_host_v1* host, void** state) noexcept {
        try {
            auto s = std::make_unique<State>(State{host, std::make_unique<T>(*host)});
            *state = s.release();
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(host, "init");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status on_event(void* state, const allocscope_event_v1* e) noexcept {
        auto* s = static_cast<State*>(state);
        try {
            s->plugin->on_event(*e);
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "on_event");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status on_step(void* state, uint64_t step, uint32_t source) noexcept {
        auto* s = static_cast<State*>(state);
        try {
            s->plugin->on_step(step, source);
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "on_step");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status finish(void* state) noexcept {
        std::unique_ptr<State> s(static_cast<State*>(state));
        try {
            s->plugin->finish();
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "finish");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
};

}  // namespace allocscope::plugins

// Defines the one exported symbol of a plugin built from class `Class`.
#define ALLOCSCOPE_DEFINE_PLUGIN(Class, plugin_name, plugin_description, mask) \
    extern "C" __attribute__((visibility("default")))                          \
    const allocscope_plugin_v1 allocscope_plugin = {                           \
        sizeof(allocscope_plugin_v1),                                          \
        ALLOCSCOPE_PLUGIN_ABI_VERSION,                                         \
        plugin_name,                                                           \
        plugin_description,                                                    \
        mask,                                                                  \
        &::allocscope::plugins::Adapter<Class>::init,                          \
        &::allocscope::plugins::Adapter<Class>::on_event,                      \
        &::allocscope::plugins::Adapter<Class>::on_step,                       \
        &::allocscope::plugins::Adapter<Class>::finish,                        \
    }
