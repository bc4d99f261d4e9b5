// Plugin SDK: which allocation level (caching-allocator blocks or
// runtime-API segments) a detector follows: the option and the filter.
#pragma once

#include <allocscope/plugin_v2.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace allocscope::plugins {

// Which allocation level a detector follows. "block": a caching allocator's
// tensors (~ memory_allocated); "segment": runtime-API allocations (under
// PyTorch's cudaMallocAsync backend every tensor is one); "auto": blocks
// once the stream has reported any, segments until then.
enum class LevelMode { automatic, block, segment };

inline LevelMode option_level(const allocscope_host_v2& host, const char* key) {
    const char* text = host.option(host.ctx, key);
    if (!text) return LevelMode::automatic;
    const std::string_view v(text);
    if (v == "auto") return LevelMode::automatic;
    if (v == "block") return LevelMode::block;
    if (v == "segment") return LevelMode::segment;
    throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                ": expected auto, block or segment");
}

class LevelFilter {
  public:
    explicit LevelFilter(LevelMode mode) : mode_(mode) { reset(); }
    // A new stream (the run after the baseline).
    void reset() {
        level_ = mode_ == LevelMode::segment ? ALLOCSCOPE_LEVEL_SEGMENT
                 : mode_ == LevelMode::block ? ALLOCSCOPE_LEVEL_BLOCK
                                             : ALLOCSCOPE_LEVEL_SEGMENT;
    }
    // Whether an ALLOC/FREE event is of the followed level. Returns true
    // and sets *switched when auto mode moves to blocks on this event (the
    // caller drops what it holds of segments).
    bool follow(const allocscope_event_v2& e, bool* switched) {
        *switched = false;
        if (mode_ == LevelMode::automatic && level_ == ALLOCSCOPE_LEVEL_SEGMENT &&
            e.level == ALLOCSCOPE_LEVEL_BLOCK && e.kind == ALLOCSCOPE_EVENT_ALLOC) {
            level_ = ALLOCSCOPE_LEVEL_BLOCK;
            *switched = true;
        }
        return e.level == level_;
    }
    uint32_t level() const { return level_; }

  private:
    LevelMode mode_;
    uint32_t level_ = ALLOCSCOPE_LEVEL_SEGMENT;
};

}  // namespace allocscope::plugins
