#include "string_table.h"

namespace allocscope {

StringTable::Interned StringTable::intern(std::string_view text) {
    if (text.empty()) return {0, false};
    if (auto it = ids_.find(text); it != ids_.end()) return {it->second, false};
    auto id = static_cast<uint32_t>(strings_.size());
    strings_.emplace_back(text);
    ids_.emplace(strings_.back(), id);
    return {id, true};
}

}  // namespace allocscope
