// The plugin host's private state (core/plugin_host.h), shared by its two
// files: plugin_host.cpp (loading, the host table, findings) and
// plugin_feed.cpp (the event stream). Not for anything else to include.
#pragma once

#include <allocscope/plugin_v2.h>
#include <allocscope/sdk/flat_map.h>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "plugin_host.h"

namespace allocscope {

// Control characters of a plugin's text (a name, an exception's message)
// become spaces, so each warning stays one line.
inline std::string one_line(std::string_view text) {
    std::string out(text);
    for (char& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = ' ';
    }
    return out;
}

// Whether plugins see a live record of `pool`: not a plain driver
// allocation (a library's own, which the host never delivers). An owning
// host's table holds none; a view of the writer's Replay skips them, exactly
// the records Replay::direct_driver_live_bytes counts.
inline bool shown_to_plugins(Pool pool, const LiveRecord& r) noexcept {
    return (pool != Pool::device_segment || !is_direct_driver_allocation(r.api)) && !r.graph_pool;
}

struct PluginHost::Instance {
    PluginHost* host = nullptr;
    allocscope_host_v2 api{};
    allocscope_host_v1 api_v1{};  // a version 1 plugin's host table
    // The descriptor: a version 2 plugin's, or a version 1 plugin's (driven
    // through the v1 adapter); exactly one is set once it is installed.
    const allocscope_plugin_v2* plugin = nullptr;
    const allocscope_plugin_v1* plugin_v1 = nullptr;
    // Both versions' calls that share a signature, and the event mask.
    allocscope_plugin_status (*on_step)(void* state, uint64_t step, uint32_t source) = nullptr;
    allocscope_plugin_status (*finish)(void* state) = nullptr;
    uint32_t event_mask = 0;
    bool installed() const noexcept { return plugin || plugin_v1; }
    void* handle = nullptr;  // dlopen handle, nullptr for add()
    void* state = nullptr;
    std::string entry;
    std::string path;
    std::string name;
    bool enabled = false;
    bool finished = false;
    std::string reason;
    std::string invalid_emit;  // set by emit(), acted on when the call returns
    int log_lines = 0;
    // The option keys the plugin asked for (cb_option), in the order asked:
    // an option it never asks for during init is a typo (install()).
    std::vector<std::string> keys_read;
};

struct PluginHost::StoredParam {
    std::string layer, name, dtype;
    allocscope_param_v2 view{};
};

template <typename Call>
void PluginHost::invoke(Instance& in, const char* what, Call&& call) {
    if (!in.enabled) return;
    allocscope_plugin_status status = ALLOCSCOPE_PLUGIN_OK;
    try {
        status = call();
    } catch (const std::exception& e) {
        disable(in, std::string(what) + " threw: " + one_line(e.what()));
        return;
    } catch (...) {
        disable(in, std::string(what) + " threw an exception");
        return;
    }
    if (!in.invalid_emit.empty()) {
        disable(in, in.invalid_emit);
    } else if (status == ALLOCSCOPE_PLUGIN_ERROR) {
        disable(in, std::string(what) + " returned an error");
    } else if (status != ALLOCSCOPE_PLUGIN_OK) {
        disable(in, std::string(what) + " returned an invalid status " +
                        std::to_string(static_cast<int>(status)));
    }
}

}  // namespace allocscope
