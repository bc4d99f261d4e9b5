// Plugin SDK: a plugin's options (host->option) read as numbers: byte
// counts with units, plain numbers, bounded integers. A bad value throws
// std::invalid_argument naming the option, which disables the plugin with
// that message.
#pragma once

#include <allocscope/plugin_v2.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace allocscope::plugins {

// Option `key` of this plugin as a number, or `fallback` when unset. A value
// that is not a non-negative integer (optionally with a K/M/G/KiB/MiB/GiB
// suffix) throws std::invalid_argument naming the option, which disables
// the plugin with that message.
inline uint64_t option_bytes(const allocscope_host_v2& host, const char* key, uint64_t fallback) {
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

inline double option_number(const allocscope_host_v2& host, const char* key, double fallback) {
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

// Option `key` as a plain integer in [min, max], or `fallback` when unset.
// Anything else throws std::invalid_argument naming the option (the plugin
// is then disabled with that message).
inline uint64_t option_count(const allocscope_host_v2& host, const char* key, uint64_t fallback,
                             uint64_t min, uint64_t max) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    std::string_view v(text);
    uint64_t value = 0;
    bool ok = !v.empty() && v.size() <= 19;
    for (char c : v) {
        if (c < '0' || c > '9') {
            ok = false;
            break;
        }
        value = value * 10 + uint64_t(c - '0');
    }
    if (!ok || value < min || value > max) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected an integer from " + std::to_string(min) + " to " +
                                    std::to_string(max));
    }
    return value;
}

}  // namespace allocscope::plugins
