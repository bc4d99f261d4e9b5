// Plugin SDK: byte counts as findings' summaries write them ("1.50 MiB
// (1574912 B)", "+512 B").
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace allocscope::plugins {

// "512 B", "48.0 KiB (49152 B)", "1.50 MiB (1574912 B)": readable, and
// exact for whoever compares numbers.
inline std::string format_bytes(uint64_t bytes) {
    if (bytes < 1024) return std::to_string(bytes) + " B";
    const char* unit = "KiB";
    double value = double(bytes) / 1024.0;
    if (bytes >= (1ull << 30)) {
        unit = "GiB";
        value = double(bytes) / double(1ull << 30);
    } else if (bytes >= (1ull << 20)) {
        unit = "MiB";
        value = double(bytes) / double(1ull << 20);
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f %s (%llu B)", value < 10 ? 2 : 1, value, unit,
                  static_cast<unsigned long long>(bytes));
    return buf;
}

// "-1.50 MiB" / "+512 B" for signed differences.
inline std::string format_signed_bytes(double bytes) {
    const double magnitude = bytes < 0 ? -bytes : bytes;
    return std::string(bytes < 0 ? "-" : "+") + format_bytes(uint64_t(magnitude + 0.5));
}

}  // namespace allocscope::plugins
