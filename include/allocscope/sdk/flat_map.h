// Plugin SDK: FlatMap, a small open-addressing hash map, header-only,
// shared by the plugin host (core/plugin_host.cpp) and the plugins. Not
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace allocscope {

// A hash map for state updated on every event (the plugin host's live
// table, the plugins' records): open addressing with linear probing in one
// array, so inserting and erasing allocate nothing but to grow. Keyed by
// integers (alloc seqs, addresses, ids) or by a type whose Hash folds it
// into 64 bits (mixed again here). Pointers to values are invalidated by
// any insert or erase.
template <class K>
struct FlatHash {
    uint64_t operator()(const K& key) const noexcept { return uint64_t(key); }
};

template <class K, class V, class Hash = FlatHash<K>>
class FlatMap {
  public:
    V* find(const K& key) {
        if (size_ == 0) return nullptr;
        for (std::size_t i = home(key);; i = next(i)) {
            Slot& s = slots_[i];
            if (!s.used) return nullptr;
            if (s.key == key) return &s.value;
        }
    }
    const V* find(const K& key) const { return const_cast<FlatMap*>(this)->find(key); }
    bool contains(const K& key) const { return find(key) != nullptr; }

    // The value of `key`, value-initialized when new.
    V& operator[](const K& key) {
        if (2 * (size_ + 1) > slots_.size()) grow();
        std::size_t i = home(key);
        for (; slots_[i].used; i = next(i)) {
            if (slots_[i].key == key) return slots_[i].value;
        }
        slots_[i].used = true;
        slots_[i].key = key;
        slots_[i].value = V{};
        ++size_;
        return slots_[i].value;
    }

    bool erase(const K& key) {
        if (size_ == 0) return false;
        std::size_t i = home(key);
        for (;; i = next(i)) {
            if (!slots_[i].used) return false;
            if (slots_[i].key == key) break;
        }
        // Backward shift: move up each later entry of the probe run that
        // may live at the hole (its home is not cyclically in (hole, j]).
        for (std::size_t j = next(i); slots_[j].used; j = next(j)) {
            const std::size_t h = home(slots_[j].key);
            const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
            if (stays) continue;
            slots_[i] = std::move(slots_[j]);
            i = j;
        }
        slots_[i] = Slot{};
        --size_;
        return true;
    }

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    void clear() {
        slots_.clear();
        size_ = 0;
        bits_ = 0;
    }
    // f(key, value) for every entry, in no particular order.
    template <class F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_) {
            if (s.used) f(s.key, s.value);
        }
    }

    // f(key, value) for entries until f returns true; whether it did.
    template <class F>
    bool any_of(F&& f) const {
        for (const Slot& s : slots_) {
            if (s.used && f(s.key, s.value)) return true;
        }
        return false;
    }

  private:
    struct Slot {
        K key{};
        V value{};
        bool used = false;
    };
    std::size_t home(const K& key) const {
        return std::size_t((Hash{}(key)*0x9E3779B97F4A7C15ull) >> (64 - bits_));
    }
    std::size_t next(std::size_t i) const { return (i + 1) & (slots_.size() - 1); }
    void grow() {
        std::vector<Slot> old(slots_.empty() ? 16 : 2 * slots_.size());
        old.swap(slots_);
        bits_ = 0;
        while ((std::size_t{1} << bits_) < slots_.size())
            ++bits_;
        for (Slot& s : old) {
            if (!s.used) continue;
            std::size_t i = home(s.key);
            while (slots_[i].used)
                i = next(i);
            slots_[i] = std::move(s);
        }
    }
    std::vector<Slot> slots_;
    std::size_t size_ = 0;
    unsigned bits_ = 0;
};

}  // namespace allocscope
