// Plugin SDK: Interner, dense ids for the tag strings of a plugin's events
// (keyed by the host's interned addresses), with cached base phases.
#pragma once

#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/tag_rules.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {

// Dense ids for strings (layers, phases): a plugin keys its maps by id and
// turns ids back into text only when it emits. Id 0 is "".
class Interner {
  public:
    Interner() { intern(""); }
    uint32_t intern(std::string_view text) {
        auto it = ids_.find(text);
        if (it != ids_.end()) return it->second;
        const auto id = uint32_t(texts_.size());
        texts_.emplace_back(text);
        ids_.emplace(texts_.back(), id);
        return id;
    }
    // A tag string of an event or live record. The host interns those
    // (plugin_v2.h): one address per text, valid until finish. So the
    // address is the key, and each distinct one is hashed by text once.
    uint32_t tag(const char* text) {
        if (!text) return 0;
        const auto key = reinterpret_cast<uintptr_t>(text);
        if (const uint32_t* id = tags_.find(key)) return *id;
        const uint32_t id = intern(std::string_view(text));
        tags_[key] = id;
        return id;
    }
    const std::string& text(uint32_t id) const { return texts_.at(id); }
    // The id of the base phase of phase `id` (see base_phase()), cached.
    uint32_t base_phase(uint32_t id) {
        if (id >= bases_.size()) bases_.resize(id + 1, UINT32_MAX);
        if (bases_[id] == UINT32_MAX) {
            // A copy: interning may move the strings a view would point into.
            const std::string base(allocscope::base_phase(text(id)));
            bases_[id] = intern(base);
        }
        return bases_[id];
    }

  private:
    // Transparent, so a lookup by string_view builds no std::string.
    struct Hash {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const noexcept {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> ids_;
    std::vector<std::string> texts_;
    FlatMap<uintptr_t, uint32_t> tags_;
    std::vector<uint32_t> bases_;
};

}  // namespace allocscope::plugins
