// The hooks' event ring (interposer/event_ring.h): a full ring makes a
// producer wait; it drops its event only when the consumer has released
// nothing for the whole patience, never because other producers took the
// slots a consumer that keeps going released.
#include "event_ring.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "allocscope/doctest.h"

using allocscope::EventRing;

namespace {

constexpr uint64_t kMs = 1'000'000;

// A ring with every slot reserved and published (nothing consumed).
std::unique_ptr<EventRing> full_ring() {
    auto ring = std::make_unique<EventRing>();
    for (uint64_t i = 0; i < EventRing::kCapacity; ++i) {
        EventRing::Slot* slot = ring->reserve(kMs);
        REQUIRE(slot != nullptr);
        EventRing::publish(slot);
    }
    return ring;
}

}  // namespace

TEST_CASE("the ring hands out seqs densely and the consumer sees them published in order") {
    EventRing ring;
    for (uint64_t i = 0; i < 10; ++i) {
        EventRing::Slot* slot = ring.reserve(kMs);
        REQUIRE(slot != nullptr);
        CHECK(slot->event.seq == i);
        slot->event.size = 100 + i;
        if (i != 7) EventRing::publish(slot);  // 7 is still being filled
    }
    CHECK(ring.published_run(100) == 7);
    CHECK(ring.at(6).size == 106);
    ring.release_until(7);
    CHECK(ring.consumed() == 7);
    CHECK(ring.reserved() == 10);
}

TEST_CASE("a full ring whose consumer stalls drops the event after the patience") {
    std::unique_ptr<EventRing> ring = full_ring();
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(ring->reserve(50 * kMs) == nullptr);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(50));
    CHECK(ring->reserved() == EventRing::kCapacity);  // no seq taken, no hole
}

TEST_CASE(
    "producers behind a slow consumer that keeps releasing wait longer than the patience "
    "and drop nothing") {
    // 200 producers want one slot each from a full ring whose consumer frees
    // one slot every 5 ms: the last of them waits about a second, four
    // times the patience. Only a consumer standing still for the whole
    // patience may cost an event: on a loaded machine the consumer thread
    // itself may not run for that long (200 waiting producers on 2 cores),
    // and then, and only then, a drop is what the ring promises.
    std::unique_ptr<EventRing> ring = full_ring();
    constexpr int kProducers = 200;
    constexpr uint64_t kPatience = 250 * kMs;
    std::atomic<int> dropped{0}, reserved{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> producers;
    for (int i = 0; i < kProducers; ++i) {
        producers.emplace_back([&] {
            while (!go.load())
                std::this_thread::yield();
            EventRing::Slot* slot = ring->reserve(kPatience);
            if (!slot) {
                dropped.fetch_add(1);
                return;
            }
            EventRing::publish(slot);
            reserved.fetch_add(1);
        });
    }
    go.store(true);
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t released = 0;
    auto last_release = t0;
    std::chrono::steady_clock::duration longest_still{};  // the consumer's longest pause
    while (reserved.load() + dropped.load() < kProducers &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        // One slot at a time, and only what is published (as the writer).
        if (ring->published_run(1) == 1) {
            ring->release_until(++released);
            const auto now = std::chrono::steady_clock::now();
            longest_still = std::max(longest_still, now - last_release);
            last_release = now;
        }
    }
    for (std::thread& t : producers)
        t.join();
    const auto waited = std::chrono::steady_clock::now() - t0;
    const bool consumer_stood_still =
        longest_still >= std::chrono::nanoseconds(kPatience) - std::chrono::milliseconds(5);
    MESSAGE("200 producers served in "
            << std::chrono::duration<double>(waited).count() << " s; the consumer's longest pause "
            << std::chrono::duration<double>(longest_still).count() << " s");
    if (!consumer_stood_still) CHECK(dropped.load() == 0);
    CHECK(reserved.load() + dropped.load() == kProducers);
    CHECK(reserved.load() > 0);
    // Whoever gave up took no seq: no hole in the sequence.
    CHECK(ring->reserved() == EventRing::kCapacity + uint64_t(reserved.load()));
}
