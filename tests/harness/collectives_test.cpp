// Shared-memory collectives between forked rank processes, rank discovery,
// and the rank launcher (through the collective_test_rank helper).
// Longer than 600 lines: every collective and the rank launcher across forked
// processes, sharing one fork-and-check helper.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collective/communicator.h"
#include "collective/launcher.h"
#include "collective/rank_info.h"

using namespace allocscope::harness::collective;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kSmallSlot = 8 << 10;  // 4 KiB halves: modest messages take many steps

CommunicatorOptions small_slots(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    CommunicatorOptions options;
    options.slot_bytes = kSmallSlot;
    options.timeout = timeout;
    return options;
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// What one forked rank sees: who it is, where to meet, and a region of memory
// shared with the test process for results the test checks afterwards.
struct RankContext {
    int rank;
    int world;
    std::string rendezvous;
    std::span<std::byte> out;

    Communicator join(CommunicatorOptions options = small_slots()) const {
        return Communicator(RankInfo{rank, world, rank}, rendezvous, options);
    }
};

struct RankResult {
    bool ok = false;
    std::string error;   // what the rank threw
    double seconds = 0;  // from fork to the end of the body
    std::vector<std::byte> out;
};

struct alignas(64) SharedReport {
    int finished;
    double seconds;
    char error[1024];
};

std::string fresh_rendezvous() {
    static int runs = 0;
    return "test-" + std::to_string(getpid()) + "-" + std::to_string(++runs);
}

// Forks `world` ranks running `body`, waits for all (killing them after 30 s
// so a bug fails the test instead of hanging it), and checks that no
// /dev/shm entry is left behind.
std::vector<RankResult> run_ranks(int world, const std::function<void(const RankContext&)>& body,
                                  size_t out_bytes = 0) {
    const std::string rendezvous = fresh_rendezvous();
    const size_t stride = sizeof(SharedReport) + (out_bytes + 63) / 64 * 64;
    const size_t total = stride * static_cast<size_t>(world);
    void* shared = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(shared != MAP_FAILED);
    auto* base = static_cast<std::byte*>(shared);
    const auto report_of = [&](int r) {
        return reinterpret_cast<SharedReport*>(base + stride * static_cast<size_t>(r));
    };

    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            const auto start = Clock::now();
            SharedReport* report = report_of(r);
            int code = 0;
            try {
                body(RankContext{
                    r, world, rendezvous, {reinterpret_cast<std::byte*>(report + 1), out_bytes}});
            } catch (const std::exception& error) {
                std::snprintf(report->error, sizeof report->error, "%s", error.what());
                code = 1;
            }
            report->seconds = std::chrono::duration<double>(Clock::now() - start).count();
            report->finished = 1;
            std::_Exit(code);  // no doctest teardown in the child
        }
        pids.push_back(pid);
    }

    std::vector<RankResult> results(static_cast<size_t>(world));
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    for (int r = 0; r < world; ++r) {
        int status = 0;
        while (waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == 0) {
            if (Clock::now() > give_up) {
                for (pid_t pid : pids)
                    kill(pid, SIGKILL);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        const SharedReport* report = report_of(r);
        RankResult& result = results[static_cast<size_t>(r)];
        result.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && report->finished;
        result.error = report->error;
        if (!report->finished)
            result.error = "rank did not finish (status " + std::to_string(status) + ")";
        result.seconds = report->seconds;
        const auto* out = reinterpret_cast<const std::byte*>(report + 1);
        result.out.assign(out, out + out_bytes);
    }
    munmap(shared, total);
    CHECK_MESSAGE(!std::filesystem::exists("/dev/shm" + SharedSegment::name_for(rendezvous)),
                  "segment of " << rendezvous << " left behind");
    return results;
}

void require_all_ok(const std::vector<RankResult>& results) {
    for (size_t r = 0; r < results.size(); ++r) {
        INFO("rank " << r << ": " << results[r].error);
        REQUIRE(results[r].ok);
    }
}

// Throws inside a forked rank, so the test reports the message; `what` is a
// callable so that checks in loops over MiB build no string unless they fail.
template <class Message>
void expect(bool condition, Message&& what) {
    if (condition) return;
    if constexpr (std::is_invocable_v<Message>) {
        throw std::runtime_error(what());
    } else {
        throw std::runtime_error(what);
    }
}

std::byte pattern(int rank, size_t i, size_t size) {
    return static_cast<std::byte>((static_cast<size_t>(rank) * 131 + i * 7 + size) & 0xff);
}

uint16_t bf16_of_exact(float value) {  // only for values bf16 represents exactly
    return static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
}

// Each rank's random contribution for the determinism tests.
std::vector<float> random_floats(int rank, size_t count) {
    std::mt19937 rng(1234u + static_cast<unsigned>(rank));
    std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
    std::vector<float> values(count);
    for (float& v : values)
        v = dist(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
    return values;
}

}  // namespace

TEST_CASE("all_gather concatenates every rank's bytes in rank order, from 1 B to several MiB") {
    const std::vector<size_t> sizes = {0, 1, 3, 63, 4095, 4096, 4097, 12289, (3u << 20) + 5};
    for (int world : {2, 4}) {
        CAPTURE(world);
        require_all_ok(run_ranks(world, [&](const RankContext& ctx) {
            Communicator comm = ctx.join();
            for (size_t size : sizes) {
                std::vector<std::byte> send(size);
                for (size_t i = 0; i < size; ++i)
                    send[i] = pattern(ctx.rank, i, size);
                std::vector<std::byte> recv(size * static_cast<size_t>(world));
                comm.all_gather(send.data(), size, recv.data());
                for (int r = 0; r < world; ++r) {
                    for (size_t i = 0; i < size; ++i) {
                        expect(recv[static_cast<size_t>(r) * size + i] == pattern(r, i, size), [&] {
                            return "size " + std::to_string(size) + ": byte " + std::to_string(i) +
                                   " of rank " + std::to_string(r);
                        });
                    }
                }
            }
        }));
    }
}

TEST_CASE("all_gather with the default 8 MiB slots crosses a step boundary and works in place") {
    const size_t size = (9u << 20) + 3;  // two steps of 4 MiB halves and a tail
    require_all_ok(run_ranks(2, [&](const RankContext& ctx) {
        Communicator comm = ctx.join(CommunicatorOptions{});
        std::vector<std::byte> buffer(size * 2);
        std::byte* mine = buffer.data() + static_cast<size_t>(ctx.rank) * size;
        for (size_t i = 0; i < size; ++i)
            mine[i] = pattern(ctx.rank, i, size);
        comm.all_gather(mine, size, buffer.data());
        for (int r = 0; r < 2; ++r) {
            for (size_t i = 0; i < size; ++i) {
                expect(buffer[static_cast<size_t>(r) * size + i] == pattern(r, i, size), [&] {
                    return "byte " + std::to_string(i) + " of rank " + std::to_string(r);
                });
            }
        }
    }));
}

TEST_CASE("reduce_scatter gives rank r the sum or average of every rank's chunk r, in fp32") {
    // Integers small enough that every sum and quarter is exact in fp32.
    const auto value = [](int rank, int dest, size_t i) {
        return static_cast<float>((rank + 1) * 1000 + dest * 7 + static_cast<int>(i % 97));
    };
    const std::vector<size_t> counts = {1, 17, 255, 256, 257, 1000, 300'003};
    for (int world : {2, 4}) {
        CAPTURE(world);
        require_all_ok(run_ranks(world, [&](const RankContext& ctx) {
            Communicator comm = ctx.join();
            for (Op op : {Op::sum, Op::avg}) {
                for (size_t count : counts) {
                    std::vector<float> send(count * static_cast<size_t>(world));
                    for (int d = 0; d < world; ++d) {
                        for (size_t i = 0; i < count; ++i) {
                            send[static_cast<size_t>(d) * count + i] = value(ctx.rank, d, i);
                        }
                    }
                    std::vector<float> recv(count, -1.0f);
                    comm.reduce_scatter(send.data(), count, recv.data(), op);
                    for (size_t i = 0; i < count; ++i) {
                        float expected = 0;
                        for (int r = 0; r < world; ++r)
                            expected += value(r, ctx.rank, i);
                        if (op == Op::avg) expected /= static_cast<float>(world);
                        expect(recv[i] == expected, [&] {
                            return std::string(op == Op::sum ? "sum" : "avg") + ", count " +
                                   std::to_string(count) + ": element " + std::to_string(i);
                        });
                    }
                }
            }
        }));
    }
}

TEST_CASE("reduce_scatter works in place: send is recv's rank-th chunk") {
    const size_t count = 5000;
    require_all_ok(run_ranks(4, [&](const RankContext& ctx) {
        Communicator comm = ctx.join();
        std::vector<float> buffer(count * 4);
        for (size_t i = 0; i < buffer.size(); ++i) {
            buffer[i] = static_cast<float>(ctx.rank * 10 + static_cast<int>(i % 10));
        }
        float* mine = buffer.data() + static_cast<size_t>(ctx.rank) * count;
        comm.reduce_scatter(buffer.data(), count, mine, Op::sum);
        for (size_t i = 0; i < count; ++i) {
            const size_t j = static_cast<size_t>(ctx.rank) * count + i;
            expect(mine[i] == static_cast<float>(60 + 4 * static_cast<int>(j % 10)),
                   [&] { return "element " + std::to_string(i); });
        }
    }));
}

TEST_CASE("reduce_scatter_bf16 sums exactly representable values for 2 and 4 ranks across steps") {
    const auto value = [](int rank, int dest, size_t i) {
        return static_cast<float>(rank + dest + static_cast<int>(i % 8));
    };
    for (int world : {2, 4}) {
        CAPTURE(world);
        require_all_ok(run_ranks(world, [&](const RankContext& ctx) {
            Communicator comm = ctx.join();
            for (Op op : {Op::sum, Op::avg}) {
                for (size_t count :
                     {size_t{1}, size_t{511}, size_t{512}, size_t{513}, size_t{200'001}}) {
                    std::vector<uint16_t> send(count * static_cast<size_t>(world));
                    for (int d = 0; d < world; ++d) {
                        for (size_t i = 0; i < count; ++i) {
                            send[static_cast<size_t>(d) * count + i] =
                                bf16_of_exact(value(ctx.rank, d, i));
                        }
                    }
                    std::vector<uint16_t> recv(count);
                    comm.reduce_scatter_bf16(send.data(), count, recv.data(), op);
                    for (size_t i = 0; i < count; ++i) {
                        float expected = 0;
                        for (int r = 0; r < world; ++r)
                            expected += value(r, ctx.rank, i);
                        if (op == Op::avg) expected /= static_cast<float>(world);
                        expect(recv[i] == bf16_of_exact(expected), [&] {
                            return "count " + std::to_string(count) + ": element " +
                                   std::to_string(i);
                        });
                    }
                }
            }
        }));
    }
}

TEST_CASE("reduce_scatter_bf16 accumulates in fp32 and rounds once, to nearest even") {
    // Rank 0 sends 1.0 (or 1 + 2^-7), the others 2^-8: half a bf16 ulp of 1.
    const auto run = [](int world, uint16_t first, Op op) {
        auto results = run_ranks(
            world,
            [&](const RankContext& ctx) {
                Communicator comm = ctx.join();
                std::vector<uint16_t> send(static_cast<size_t>(world),
                                           ctx.rank == 0 ? first : uint16_t{0x3b80});
                uint16_t recv = 0;
                comm.reduce_scatter_bf16(send.data(), 1, &recv, op);
                std::memcpy(ctx.out.data(), &recv, sizeof recv);
            },
            sizeof(uint16_t));
        require_all_ok(results);
        uint16_t bits = 0;
        std::memcpy(&bits, results[0].out.data(), sizeof bits);
        for (const RankResult& r : results)
            CHECK(std::memcmp(r.out.data(), &bits, 2) == 0);
        return bits;
    };
    CHECK(run(2, 0x3f80, Op::sum) == 0x3f80);  // 1 + 2^-8: a tie, stays on even 1.0
    CHECK(run(2, 0x3f81, Op::sum) == 0x3f82);  // 1 + 3 * 2^-8: a tie, up to even
    // 1 + 3 * 2^-8 in fp32 is a tie, up to even; rounding after each add would stay at 1.0.
    CHECK(run(4, 0x3f80, Op::sum) == 0x3f82);
    CHECK(run(4, 0x3f80, Op::avg) == 0x3e82);  // 0.25 + 1.5 ulp of 0.25: a tie, to even
}

TEST_CASE("reductions sum in rank order: every rank gets the same bits, and so does a rerun") {
    const int world = 4;
    const size_t count = 100'003;
    const auto run = [&] {
        auto results = run_ranks(
            world,
            [&](const RankContext& ctx) {
                Communicator comm = ctx.join();
                const std::vector<float> send = random_floats(ctx.rank, count * world);
                auto* out = reinterpret_cast<float*>(ctx.out.data());
                comm.all_reduce(send.data(), out, count * world);
                comm.reduce_scatter(send.data(), count, out + count * world, Op::avg);
            },
            (count * world + count) * sizeof(float));
        require_all_ok(results);
        return results;
    };
    const auto first = run();
    const auto second = run();

    std::vector<std::vector<float>> sent;
    for (int r = 0; r < world; ++r)
        sent.push_back(random_floats(r, count * world));
    std::vector<float> all_reduced(count * world);
    for (size_t i = 0; i < all_reduced.size(); ++i) {
        float sum = sent[0][i];
        for (int r = 1; r < world; ++r)
            sum += sent[static_cast<size_t>(r)][i];
        all_reduced[i] = sum;
    }
    for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        const auto& out = first[static_cast<size_t>(r)].out;
        CHECK(out == second[static_cast<size_t>(r)].out);
        CHECK(std::memcmp(out.data(), all_reduced.data(), count * world * sizeof(float)) == 0);
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) {
            mine[i] = all_reduced[static_cast<size_t>(r) * count + i] / static_cast<float>(world);
        }
        CHECK(std::memcmp(out.data() + count * world * sizeof(float), mine.data(),
                          count * sizeof(float)) == 0);
    }
}

TEST_CASE("all_reduce works in place and broadcast copies the root's bytes to every rank") {
    require_all_ok(run_ranks(4, [](const RankContext& ctx) {
        Communicator comm = ctx.join();
        std::vector<float> values(3000, static_cast<float>(ctx.rank + 1));
        comm.all_reduce(values.data(), values.data(), values.size(), Op::avg);
        for (float v : values)
            expect(v == 2.5f, "all_reduce avg");

        for (int root : {0, 3}) {
            const size_t size = 10'007;
            std::vector<std::byte> data(size, std::byte{0});
            if (ctx.rank == root) {
                for (size_t i = 0; i < size; ++i)
                    data[i] = pattern(root, i, size);
            }
            comm.broadcast(data.data(), size, root);
            for (size_t i = 0; i < size; ++i) {
                expect(data[i] == pattern(root, i, size),
                       [&] { return "broadcast byte " + std::to_string(i); });
            }
        }
        comm.barrier();
    }));
}

TEST_CASE("a world of one rank runs every collective locally") {
    require_all_ok(run_ranks(1, [](const RankContext& ctx) {
        Communicator comm = ctx.join();
        const float send[2] = {1.5f, -2.0f};
        float recv[2] = {};
        comm.reduce_scatter(send, 2, recv, Op::avg);
        expect(recv[0] == 1.5f && recv[1] == -2.0f, "reduce_scatter");
        comm.all_gather(send, sizeof send, recv);
        expect(recv[0] == 1.5f && recv[1] == -2.0f, "all_gather");
    }));
}

TEST_CASE("a peer that dies makes the others fail quickly, naming it and the collective") {
    const auto results = run_ranks(3, [](const RankContext& ctx) {
        Communicator comm = ctx.join(small_slots(std::chrono::seconds(5)));
        if (ctx.rank == 1) std::_Exit(0);  // no destructor: as if killed
        std::byte send[8] = {};
        std::byte recv[24];
        comm.all_gather(send, sizeof send, recv);
    });
    for (int r : {0, 2}) {
        const RankResult& result = results[static_cast<size_t>(r)];
        INFO(result.error);
        CHECK_FALSE(result.ok);
        CHECK(contains(result.error, "rank " + std::to_string(r) + ": all_gather(8 B per rank)"));
        CHECK(contains(result.error, "rank 1 (pid"));
        CHECK(contains(result.error, "died"));
        CHECK(result.seconds < 4.0);  // noticed, not timed out
    }
}

TEST_CASE("a peer that destroys its communicator early makes the others fail") {
    const auto results = run_ranks(2, [](const RankContext& ctx) {
        Communicator comm = ctx.join(small_slots(std::chrono::seconds(5)));
        if (ctx.rank == 1) return;
        comm.barrier();
    });
    INFO(results[0].error);
    CHECK_FALSE(results[0].ok);
    CHECK(contains(results[0].error, "rank 1 (pid"));
    CHECK(contains(results[0].error, "destroyed its communicator"));
    CHECK(results[0].seconds < 4.0);
}

TEST_CASE("a live peer that does not call makes the others time out; it then learns why") {
    const auto results = run_ranks(2, [](const RankContext& ctx) {
        Communicator comm = ctx.join(small_slots(std::chrono::milliseconds(500)));
        if (ctx.rank == 1) {
            // Stays attached until rank 0 has given up, then is told so at once.
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        }
        float value = 1.0f;
        comm.all_reduce(&value, &value, 1);
    });
    INFO(results[0].error);
    INFO(results[1].error);
    CHECK(contains(results[0].error,
                   "rank 0: all_reduce(1 fp32) #2: timed out after 0.5 s "
                   "waiting for rank 1"));
    CHECK(results[0].seconds < 1.4);
    CHECK(contains(results[1].error, "rank 1: all_reduce(1 fp32) #2: rank 0 failed"));
    CHECK(results[1].seconds < 2.5);
}

TEST_CASE("a rank that never attaches makes the others fail to join, and no name is left") {
    const auto results = run_ranks(3, [](const RankContext& ctx) {
        if (ctx.rank == 2) return;
        Communicator comm = ctx.join(small_slots(std::chrono::milliseconds(500)));
    });
    INFO(results[0].error);
    INFO(results[1].error);
    // Rank 0 names rank 2 itself, or passes on rank 1's error when rank 1
    // timed out first (a loaded machine): either way the error says who.
    CHECK(contains(results[0].error, "rank 0: join #1: "));
    CHECK(contains(results[0].error, "timed out after 0.5 s waiting for rank 2 (never attached)"));
    CHECK_FALSE(results[1].ok);
    CHECK(results[2].ok);
}

TEST_CASE("a rank whose rank 0 never comes fails to join, naming the segment") {
    const auto results = run_ranks(2, [](const RankContext& ctx) {
        if (ctx.rank == 0) return;
        Communicator comm = ctx.join(small_slots(std::chrono::milliseconds(300)));
    });
    INFO(results[1].error);
    CHECK(contains(results[1].error, "rank 1: join: rank 0 did not create /allocscope-coll-"));
}

TEST_CASE("mismatched calls are refused on every rank, and the communicator stays broken") {
    const auto results = run_ranks(2, [](const RankContext& ctx) {
        Communicator comm = ctx.join();
        std::byte data[32] = {};
        std::byte recv[64];
        try {
            comm.all_gather(data, ctx.rank == 0 ? 8 : 16, recv);
        } catch (const CollectiveError& first) {
            try {
                comm.barrier();
            } catch (const CollectiveError& again) {
                expect(contains(again.what(), "unusable after an earlier failure"),
                       std::string("second error: ") + again.what());
                throw first;
            }
        }
    });
    INFO(results[0].error);
    INFO(results[1].error);
    // Whichever rank compares first reports the mismatch; a slower one may
    // see that rank's abort first, whose reason carries the same comparison.
    for (int r : {0, 1}) {
        const std::string& error = results[static_cast<size_t>(r)].error;
        CHECK(contains(error, "allocscope collective: rank " + std::to_string(r) + ": all_gather"));
        CHECK(contains(error, "all_gather(8 B per rank) #2"));
        CHECK(contains(error, "all_gather(16 B per rank) #2"));
        CHECK(contains(error, " instead"));
    }
}

TEST_CASE("the segment's name is gone from /dev/shm as soon as every rank has joined") {
    require_all_ok(run_ranks(2, [](const RankContext& ctx) {
        Communicator comm = ctx.join();
        comm.barrier();  // rank 0 unlinks at the end of its constructor
        expect(!std::filesystem::exists("/dev/shm" + SharedSegment::name_for(ctx.rendezvous)),
               "name still there after joining");
    }));
}

TEST_CASE("impossible ranks and options are refused before touching shared memory") {
    CHECK_THROWS_WITH_AS(Communicator(RankInfo{1, 2, 0}, "x"),
                         doctest::Contains("needs all ranks on one host"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Communicator(RankInfo{2, 2, 2}, "x"), doctest::Contains("outside [0, 2)"),
                         std::invalid_argument);
    CommunicatorOptions tiny;
    tiny.slot_bytes = 256;
    CHECK_THROWS_WITH_AS(Communicator(RankInfo{0, 4, 0}, "x", tiny),
                         doctest::Contains("too small for 4 ranks"), std::invalid_argument);
    CHECK(SharedSegment::name_for("127.0.0.1:29500/x") == "/allocscope-coll-127.0.0.1_29500_x");
}

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

std::string rank_info_error(std::map<std::string, std::string> vars) {
    try {
        rank_info_from_env(env_of(std::move(vars)));
    } catch (const std::invalid_argument& error) {
        return error.what();
    }
    return "no error";
}

}  // namespace

TEST_CASE("RankInfo comes from RANK, WORLD_SIZE and LOCAL_RANK, or is absent without a launcher") {
    CHECK_FALSE(rank_info_from_env(env_of({})).has_value());
    const auto info =
        rank_info_from_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}));
    REQUIRE(info.has_value());
    CHECK(info->rank == 3);
    CHECK(info->world_size == 4);
    CHECK(info->local_rank == 1);
    CHECK(rank_info_from_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}))->local_rank == 1);
}

TEST_CASE("malformed rank variables are errors that name the variable and its value") {
    CHECK(rank_info_error({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}) ==
          "RANK='abc' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}) ==
          "RANK='2' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}) ==
          "RANK='-1' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}) ==
          "RANK='1x' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", ""}, {"WORLD_SIZE", "2"}}) ==
          "RANK='' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}) ==
          "WORLD_SIZE='0' is not an integer >= 1");
    CHECK(rank_info_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}) ==
          "WORLD_SIZE='99999999999' is not an integer >= 1");
    CHECK(rank_info_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}}) ==
          "LOCAL_RANK='5' is not an integer in [0, WORLD_SIZE=2)");
    CHECK(rank_info_error({{"RANK", "0"}}) == "RANK is set but WORLD_SIZE is not");
    CHECK(rank_info_error({{"WORLD_SIZE", "2"}}) == "WORLD_SIZE is set but RANK is not");
}

TEST_CASE("the rendezvous id is the launcher's, else MASTER_ADDR and MASTER_PORT") {
    CHECK(rendezvous_from_env(env_of({{kRendezvousVariable, "42-abc"}, {"MASTER_PORT", "1"}})) ==
          "42-abc");
    CHECK(rendezvous_from_env(env_of({{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}})) ==
          "127.0.0.1-29500");
    CHECK_THROWS_WITH_AS(rendezvous_from_env(env_of({{"MASTER_ADDR", "h"}})),
                         doctest::Contains("no rendezvous id"), std::invalid_argument);
}

namespace {

struct Launch {
    int status = -1;  // the launcher's exit status, 128 + signal if killed
    std::vector<pid_t> rank_pids;
};

std::filesystem::path fresh_dir() {
    static int dirs = 0;
    auto dir = std::filesystem::temp_directory_path() /
               ("collectives_test." + std::to_string(getpid()) + "." + std::to_string(++dirs));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

std::vector<pid_t> read_pids(const std::filesystem::path& dir) {
    std::vector<pid_t> pids;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        std::ifstream in(entry.path());
        pid_t pid = 0;
        if (in >> pid) pids.push_back(pid);
    }
    return pids;
}

// Runs the helper as a launcher of `ranks` ranks. `while_running` gets the
// launcher's pid once every rank has written its pid file.
Launch launch_helper(int ranks, std::vector<std::string> args,
                     const std::function<void(pid_t)>& while_running = {}) {
    const char* helper = std::getenv("COLLECTIVE_TEST_RANK");
    REQUIRE_MESSAGE(helper, "COLLECTIVE_TEST_RANK is not set (run through meson test)");
    const auto dir = fresh_dir();
    std::vector<std::string> argv = {helper, "--ranks", std::to_string(ranks), "--pid-dir",
                                     dir.string()};
    argv.insert(argv.end(), args.begin(), args.end());

    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", kRendezvousVariable}) {
            unsetenv(name);
        }
        std::vector<char*> cargv;
        for (std::string& a : argv)
            cargv.push_back(a.data());
        cargv.push_back(nullptr);
        execv(helper, cargv.data());
        std::_Exit(127);
    }
    if (while_running) {
        const auto give_up = Clock::now() + std::chrono::seconds(20);
        while (read_pids(dir).size() < static_cast<size_t>(ranks) && Clock::now() < give_up) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        while_running(pid);
    }
    Launch launch;
    int status = 0;
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (Clock::now() > give_up) kill(pid, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    launch.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    launch.rank_pids = read_pids(dir);
    std::filesystem::remove_all(dir);
    return launch;
}

bool all_gone(const std::vector<pid_t>& pids) {
    for (pid_t pid : pids) {
        if (kill(pid, 0) == 0 || errno != ESRCH) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("the launcher runs N rank processes that agree on their collectives and exits 0") {
    for (int ranks : {1, 4}) {
        CAPTURE(ranks);
        const Launch launch = launch_helper(ranks, {});
        CHECK(launch.status == 0);
        CHECK(launch.rank_pids.size() == static_cast<size_t>(ranks));
        CHECK(all_gone(launch.rank_pids));
    }
}

TEST_CASE("a failing rank makes the launcher stop the others and return the rank's status") {
    const auto start = Clock::now();
    const Launch launch =
        launch_helper(4, {"--scenario", "hang", "--fail-rank", "2", "--exit-code", "3"});
    CHECK(launch.status == 3);
    CHECK(launch.rank_pids.size() == 4);
    CHECK(all_gone(launch.rank_pids));
    CHECK(Clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("a rank that dies mid-run makes the launcher exit non-zero") {
    const Launch launch =
        launch_helper(3, {"--scenario", "fail", "--fail-rank", "1", "--exit-code", "7"});
    CHECK(launch.status != 0);
    CHECK(all_gone(launch.rank_pids));
}

TEST_CASE("SIGTERM to the launcher is forwarded to the ranks and reported as 128 + 15") {
    const Launch launch =
        launch_helper(2, {"--scenario", "wait"}, [](pid_t launcher) { kill(launcher, SIGTERM); });
    CHECK(launch.status == 128 + SIGTERM);
    CHECK(launch.rank_pids.size() == 2);
    CHECK(all_gone(launch.rank_pids));
}
