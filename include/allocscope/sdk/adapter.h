// Plugin SDK: the adapter from a C++ class to the C ABI
// (allocscope/plugin_v2.h): trampolines that turn exceptions into errors
// logged through the host, and ALLOCSCOPE_DEFINE_PLUGIN, which defines the
// plugin's one exported symbol.
#pragma once

#include <allocscope/plugin_v2.h>

#include <exception>
#include <memory>
#include <string>

namespace allocscope::plugins {

// C ABI trampolines for a class T with
//   explicit T(const allocscope_host_v2& host);
//   void on_event(const allocscope_event_v2& event);
//   void on_step(uint64_t step, uint32_t source);
//   void finish();
// An exception becomes ALLOCSCOPE_PLUGIN_ERROR and is logged through the
// host, so the host disables the plugin with the reason.
template <class T>
struct Adapter {
    static void log_exception(const allocscope_host_v2* host, const char* call) noexcept {
        try {
            throw;
        } catch (const std::exception& e) {
            if (host) host->log(host->ctx, (std::string(call) + ": " + e.what()).c_str());
        } catch (...) {
            if (host) host->log(host->ctx, (std::string(call) + ": unknown exception").c_str());
        }
    }
    struct State {
        const allocscope_host_v2* host;
        std::unique_ptr<T> plugin;
    };
    static allocscope_plugin_status init(const allocscope_host_v2* host, void** state) noexcept {
        try {
            auto s = std::make_unique<State>(State{host, std::make_unique<T>(*host)});
            *state = s.release();
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(host, "init");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status on_event(void* state, const allocscope_event_v2* e) noexcept {
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

// Defines the one exported symbol of a plugin built from class `Class`
// (ALLOCSCOPE_PLUGIN_V2_SYMBOL, allocscope_plugin_v2, with default
// visibility: build with -fvisibility=hidden, plugins/README.md).
#define ALLOCSCOPE_DEFINE_PLUGIN(Class, plugin_name, plugin_description, mask) \
    ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR = {                                        \
        sizeof(allocscope_plugin_v2),                                          \
        ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,                                      \
        plugin_name,                                                           \
        plugin_description,                                                    \
        mask,                                                                  \
        &::allocscope::plugins::Adapter<Class>::init,                          \
        &::allocscope::plugins::Adapter<Class>::on_event,                      \
        &::allocscope::plugins::Adapter<Class>::on_step,                       \
        &::allocscope::plugins::Adapter<Class>::finish,                        \
    }
