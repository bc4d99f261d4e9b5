#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stack_table.h"
#include "string_table.h"

using namespace allocscope;

namespace {

using Frames = std::vector<uint64_t>;

// Records every on_new call.
struct NewStacks {
    std::vector<std::pair<uint32_t, Frames>> calls;
    auto callback() {
        return [this](uint32_t id, std::span<const uint64_t> frames) {
            calls.emplace_back(id, Frames(frames.begin(), frames.end()));
        };
    }
};

uint32_t intern(StackTable& table, const Frames& frames, NewStacks& news) {
    return table.intern(frames, news.callback());
}

}  // namespace

TEST_CASE("the empty string is id 0 and never new") {
    StringTable t;
    CHECK(t.size() == 1);
    CHECK(t.at(0).empty());
    auto e = t.intern("");
    CHECK(e.id == 0);
    CHECK_FALSE(e.is_new);
    CHECK(t.size() == 1);
}

TEST_CASE("strings get dense ids from 1 in first-seen order and are new only once") {
    StringTable t;
    auto a = t.intern("encoder");
    auto b = t.intern("forward");
    auto a2 = t.intern("encoder");
    auto c = t.intern(std::string("backward"));
    CHECK(a.id == 1);
    CHECK(a.is_new);
    CHECK(b.id == 2);
    CHECK(b.is_new);
    CHECK(a2.id == 1);
    CHECK_FALSE(a2.is_new);
    CHECK(c.id == 3);
    CHECK(c.is_new);
    CHECK(t.size() == 4);
    CHECK(t.at(1) == "encoder");
    CHECK(t.at(2) == "forward");
    CHECK(t.at(3) == "backward");
    CHECK_THROWS_AS(t.at(4), std::out_of_range);
}

TEST_CASE("strings that differ only in case, whitespace or an embedded NUL are distinct") {
    StringTable t;
    CHECK(t.intern("layer").id == 1);
    CHECK(t.intern("Layer").id == 2);
    CHECK(t.intern("layer ").id == 3);
    CHECK(t.intern(std::string_view("layer\0x", 7)).id == 4);
    CHECK(t.intern(std::string_view("layer\0x", 7)).id == 4);
    CHECK(t.at(4).size() == 7);
}

TEST_CASE("many strings keep their ids as the table grows") {
    StringTable t;
    for (uint32_t i = 0; i < 10000; ++i) {
        auto r = t.intern("name-" + std::to_string(i));
        REQUIRE(r.id == i + 1);
        REQUIRE(r.is_new);
    }
    for (uint32_t i = 0; i < 10000; ++i) {
        auto r = t.intern("name-" + std::to_string(i));
        REQUIRE(r.id == i + 1);
        REQUIRE_FALSE(r.is_new);
        REQUIRE(t.at(i + 1) == "name-" + std::to_string(i));
    }
}

TEST_CASE("equal stacks share one id and on_new runs once per distinct stack") {
    StackTable t(64);
    NewStacks news;
    const Frames a = {0x401000, 0x402000, 0x403000};
    const Frames b = {0x501000, 0x502000};
    CHECK(intern(t, a, news) == 1);
    CHECK(intern(t, b, news) == 2);
    CHECK(intern(t, a, news) == 1);
    CHECK(intern(t, Frames(a), news) == 1);  // equal content, other storage
    CHECK(intern(t, b, news) == 2);
    CHECK(t.size() == 2);
    CHECK(t.dropped() == 0);
    REQUIRE(news.calls.size() == 2);
    CHECK(news.calls[0].first == 1);
    CHECK(news.calls[0].second == a);
    CHECK(news.calls[1].first == 2);
    CHECK(news.calls[1].second == b);
}

TEST_CASE("stacks sharing a prefix or differing in depth or order are distinct") {
    StackTable t(64);
    NewStacks news;
    const std::vector<Frames> stacks = {
        {0x10, 0x20, 0x30}, {0x10, 0x20},       {0x10},          {0x10, 0x20, 0x30, 0x40},
        {0x30, 0x20, 0x10}, {0x10, 0x20, 0x31}, {0x10, 0x20, 0}, {0, 0x10, 0x20},
    };
    for (size_t i = 0; i < stacks.size(); ++i) {
        CAPTURE(i);
        CHECK(intern(t, stacks[i], news) == i + 1);
    }
    for (size_t i = 0; i < stacks.size(); ++i) {
        CAPTURE(i);
        CHECK(intern(t, stacks[i], news) == i + 1);
    }
    CHECK(news.calls.size() == stacks.size());
    CHECK(t.size() == stacks.size());
}

TEST_CASE("ids are dense across many stacks, deep ones included") {
    StackTable t(5000);
    NewStacks news;
    for (uint32_t i = 0; i < 5000; ++i) {
        Frames f(1 + i % 200);
        for (size_t k = 0; k < f.size(); ++k)
            f[k] = 0x400000 + i * 1000 + k;
        REQUIRE(intern(t, f, news) == i + 1);
    }
    CHECK(t.size() == 5000);
    for (uint32_t i = 0; i < 5000; i += 7) {
        Frames f(1 + i % 200);
        for (size_t k = 0; k < f.size(); ++k)
            f[k] = 0x400000 + i * 1000 + k;
        REQUIRE(intern(t, f, news) == i + 1);
    }
    CHECK(news.calls.size() == 5000);
    CHECK(t.dropped() == 0);
}

TEST_CASE("a full stack table returns 0 for new stacks, counts them and still finds old ones") {
    StackTable t(3);
    NewStacks news;
    CHECK(intern(t, {1}, news) == 1);
    CHECK(intern(t, {2}, news) == 2);
    CHECK(intern(t, {3}, news) == 3);
    CHECK(intern(t, {4}, news) == 0);
    CHECK(intern(t, {5, 6}, news) == 0);
    CHECK(intern(t, {4}, news) == 0);
    CHECK(t.dropped() == 3);
    CHECK(t.size() == 3);
    CHECK(news.calls.size() == 3);
    CHECK(intern(t, {2}, news) == 2);
    CHECK(t.dropped() == 3);
}

TEST_CASE("a stack's frames are found again from its id") {
    StackTable t(64);
    NewStacks news;
    const uint32_t a = intern(t, {0x10, 0x20, 0x30}, news);
    const uint32_t b = intern(t, {0x40}, news);
    Frames out{0xdead};
    REQUIRE(t.frames_of(a, out));
    CHECK(out == Frames{0x10, 0x20, 0x30});
    REQUIRE(t.frames_of(b, out));
    CHECK(out == Frames{0x40});
    CHECK_FALSE(t.frames_of(0, out));
    CHECK_FALSE(t.frames_of(b + 1, out));
}

TEST_CASE("threads interning overlapping stacks agree on every id and define each once") {
    constexpr int kThreads = 8;
    constexpr uint32_t kDistinct = 4000;
    auto frames_of = [](uint32_t s) {
        Frames f(2 + s % 30);
        for (size_t k = 0; k < f.size(); ++k)
            f[k] = 0x7f0000000000ull + s * 64 + k;
        return f;
    };

    StackTable t(kDistinct);
    std::mutex news_mutex;
    std::map<uint32_t, Frames> defined;
    std::atomic<int> redefinitions{0};
    std::vector<std::vector<uint32_t>> ids(kThreads, std::vector<uint32_t>(kDistinct));
    std::barrier start(kThreads);
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
        threads.emplace_back([&, th] {
            start.arrive_and_wait();
            // Each thread walks the stacks in its own order, several times.
            for (int pass = 0; pass < 3; ++pass) {
                for (uint32_t n = 0; n < kDistinct; ++n) {
                    const uint32_t s = (n * 7919u + static_cast<uint32_t>(th) * 1013u) % kDistinct;
                    const uint32_t id =
                        t.intern(frames_of(s), [&](uint32_t new_id, std::span<const uint64_t> f) {
                            std::lock_guard lock(news_mutex);
                            if (!defined.emplace(new_id, Frames(f.begin(), f.end())).second) {
                                ++redefinitions;
                            }
                        });
                    if (pass == 0) {
                        ids[th][s] = id;
                    } else if (ids[th][s] != id) {
                        ids[th][s] = 0;
                    }
                }
            }
        });
    }
    // A reader looking stacks up by id while they are inserted sees each
    // one whole (frames_of(s) for the s its first frame names) or not yet.
    std::atomic<bool> inserting{true};
    std::atomic<int> torn{0};
    std::thread reader([&] {
        Frames out;
        while (inserting.load()) {
            const uint32_t n = t.size();
            for (uint32_t id = n; id >= 1 && id + 8 > n; --id) {
                if (!t.frames_of(id, out)) continue;
                const uint32_t s = static_cast<uint32_t>((out[0] - 0x7f0000000000ull) / 64);
                if (s >= kDistinct || out != frames_of(s)) ++torn;
            }
        }
    });
    for (std::thread& th : threads)
        th.join();
    inserting = false;
    reader.join();
    CHECK(torn == 0);
    Frames out;
    for (const auto& [id, frames] : defined) {
        REQUIRE(t.frames_of(id, out));
        REQUIRE(out == frames);
    }

    CHECK(redefinitions == 0);
    CHECK(defined.size() == kDistinct);
    CHECK(t.size() == kDistinct);
    CHECK(t.dropped() == 0);
    // Dense ids 1..kDistinct.
    CHECK(defined.begin()->first == 1);
    CHECK(defined.rbegin()->first == kDistinct);
    for (uint32_t s = 0; s < kDistinct; ++s) {
        CAPTURE(s);
        const uint32_t id = ids[0][s];
        REQUIRE(id != 0);
        for (int th = 1; th < kThreads; ++th)
            REQUIRE(ids[th][s] == id);
        REQUIRE(defined.at(id) == frames_of(s));
    }
}
