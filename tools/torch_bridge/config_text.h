// The bridge's ALLOCSCOPE_* settings: asked of liballocscope.so
// (allocscope_config_get, allocscope.h), which parsed them once with the
// rest of its configuration (core/config_table.h), never read from the
// environment here.
#pragma once

#include <cstdint>
#include <string>

#include <allocscope/allocscope_dl.h>

namespace allocscope::torch_bridge {

// The canonical text of variable `name` ("1"/"0" for a switch, "debug" for
// ALLOCSCOPE_LOG=debug, ...); "" without the interposer, which then records
// nothing whatever the variable says.
inline std::string config_text(const char* name) {
    char value[256];
    const int64_t n = allocscope_dl_config_get(name, value, sizeof value);
    if (n < 0) return {};
    if (static_cast<uint64_t>(n) < sizeof value) return value;
    std::string long_value(static_cast<size_t>(n) + 1, '\0');
    allocscope_dl_config_get(name, long_value.data(), long_value.size());
    long_value.resize(static_cast<size_t>(n));
    return long_value;
}

}  // namespace allocscope::torch_bridge
