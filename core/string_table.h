// Interns layer names, phases, dtypes and mark texts into dense ids.
// Not thread-safe: the interposer serializes access with its definitions lock.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>

namespace allocscope {

class StringTable {
  public:
    StringTable() { strings_.emplace_back(); }

    struct Interned {
        uint32_t id;
        bool is_new;
    };
    // Id 0 is the empty string. Ids are handed out densely from 1 in the
    // order strings are first seen, which is the order the trace defines them.
    Interned intern(std::string_view text);

    // Stable: a string stays at the same address for the table's life.
    const std::string& at(uint32_t id) const { return strings_.at(id); }
    size_t size() const noexcept { return strings_.size(); }

  private:
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const noexcept {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> ids_;
    std::deque<std::string> strings_;  // a deque: interned strings never move
};

}  // namespace allocscope
