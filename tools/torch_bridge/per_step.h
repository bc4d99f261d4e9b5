// The bridge's ALLOCSCOPE_LOG=debug lines: a cost per training step, from
// the interposer's step counter (allocscope_current_step, looked up when
// asked: the CPU test library has no link to the interposer).
#pragma once

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace allocscope::torch_bridge {

// "; N us a step over S steps" for `ns` in all, "" before the first step
// or without the interposer.
inline std::string per_step_text(uint64_t ns) {
    using CurrentStep = uint64_t (*)();
    const auto step = reinterpret_cast<CurrentStep>(dlsym(RTLD_DEFAULT, "allocscope_current_step"));
    const uint64_t steps = step ? step() : 0;
    if (steps == 0) return {};
    char text[96];
    std::snprintf(text, sizeof text, "; %llu us a step over %llu steps",
                  static_cast<unsigned long long>(ns / steps / 1000),
                  static_cast<unsigned long long>(steps));
    return text;
}

}  // namespace allocscope::torch_bridge
