// Plugin SDK: per-thread tag stacks rebuilt from a plugin's event stream
// (TagTracker), so a plugin knows the tag a pop returns to.
#pragma once

#include <allocscope/plugin_v2.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {

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
    void on_event(const allocscope_event_v2& e) {
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

}  // namespace allocscope::plugins
