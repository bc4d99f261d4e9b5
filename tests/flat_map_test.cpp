// allocscope/sdk/flat_map.h: the open-addressing map under the plugin host's live
// table and the built-in plugins' per-event state, checked against
// std::unordered_map on random operations, with a good hash and with one
// that sends every key to a handful of slots (long probe runs that wrap
// around the end of the array, where erase's backward shift is delicate).
#include <allocscope/sdk/flat_map.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using allocscope::FlatMap;

namespace {

struct FewSlots {  // 4 distinct hashes for all keys
    uint64_t operator()(uint64_t key) const noexcept { return key % 4; }
};

template <class Map>
void check_equal(const Map& flat, const std::unordered_map<uint64_t, std::string>& ref) {
    REQUIRE(flat.size() == ref.size());
    for (const auto& [key, value] : ref) {
        const std::string* found = flat.find(key);
        REQUIRE(found);
        CHECK(*found == value);
    }
    size_t visited = 0;
    flat.for_each([&](uint64_t key, const std::string& value) {
        ++visited;
        auto it = ref.find(key);
        REQUIRE(it != ref.end());
        CHECK(it->second == value);
    });
    CHECK(visited == ref.size());
}

template <class Map>
void random_operations(uint64_t key_range, int operations, unsigned seed) {
    Map flat;
    std::unordered_map<uint64_t, std::string> ref;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < operations; ++i) {
        const uint64_t key = rng() % key_range;
        switch (rng() % 4) {
            case 0:
            case 1: {  // insert or overwrite
                const std::string value = "v" + std::to_string(i);
                flat[key] = value;
                ref[key] = value;
                break;
            }
            case 2:
                CHECK(flat.erase(key) == (ref.erase(key) == 1));
                break;
            default:
                CHECK((flat.find(key) != nullptr) == ref.count(key));
                break;
        }
        if (i % 997 == 0) check_equal(flat, ref);
    }
    check_equal(flat, ref);
    // Erase everything: the map is empty and usable again.
    for (uint64_t key = 0; key < key_range; ++key)
        flat.erase(key);
    CHECK(flat.empty());
    CHECK(flat.find(1) == nullptr);
    flat[7] = "again";
    CHECK(*flat.find(7) == "again");
}

}  // namespace

TEST_CASE("random inserts, overwrites, erases and finds agree with std::unordered_map") {
    random_operations<FlatMap<uint64_t, std::string>>(5000, 60000, 1);
    random_operations<FlatMap<uint64_t, std::string>>(64, 20000, 2);  // dense churn
}

TEST_CASE("with colliding hashes, probe runs wrap around and erase keeps every entry reachable") {
    random_operations<FlatMap<uint64_t, std::string, FewSlots>>(300, 30000, 3);
}

TEST_CASE("a new key's value starts value-initialized, even in a slot used before") {
    FlatMap<uint64_t, uint64_t> m;
    m[5] = 42;
    CHECK(m.erase(5));
    CHECK(m[5] == 0);
    CHECK_FALSE(m.erase(6));
    CHECK(m.size() == 1);
}

TEST_CASE("any_of stops at the first entry the function accepts") {
    FlatMap<uint64_t, int> m;
    for (uint64_t k = 1; k <= 100; ++k)
        m[k] = int(k);
    int calls = 0;
    CHECK(m.any_of([&](uint64_t, int v) {
        ++calls;
        return v % 10 == 0;
    }));
    CHECK(calls <= 100);
    CHECK_FALSE(m.any_of([](uint64_t, int v) { return v > 100; }));
    m.clear();
    CHECK(m.empty());
    CHECK_FALSE(m.any_of([](uint64_t, int) { return true; }));
}

TEST_CASE("zero is a key like any other") {
    FlatMap<uint64_t, int> m;
    CHECK(m.find(0) == nullptr);
    m[0] = 3;
    REQUIRE(m.find(0));
    CHECK(*m.find(0) == 3);
    CHECK(m.erase(0));
    CHECK(m.find(0) == nullptr);
}
