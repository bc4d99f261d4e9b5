#include <alloca.h>
#include <doctest/doctest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "unwind.h"
#include "unwind_cfi.h"

using allocscope::capture_stack;

namespace {

constexpr size_t kMaxFrames = 256;

struct Request {
    size_t max_depth = kMaxFrames;
    size_t skip = 0;
};

// Both walks taken from the same function, so both start at its caller.
struct Capture {
    std::vector<uint64_t> cached;
    std::vector<uint64_t> reference;
};

struct ReferenceState {
    std::vector<uint64_t>* frames;
    size_t skip;
    size_t max_depth;
};

_Unwind_Reason_Code collect_reference(_Unwind_Context* context, void* arg) {
    auto* state = static_cast<ReferenceState*>(arg);
    uintptr_t ip = _Unwind_GetIP(context);
    if (ip == 0) return _URC_END_OF_STACK;
    if (state->skip > 0) {
        --state->skip;
        return _URC_NO_REASON;
    }
    state->frames->push_back(ip);
    return state->frames->size() < state->max_depth ? _URC_NO_REASON : _URC_END_OF_STACK;
}

// Same contract as capture_stack(), computed by plain _Unwind_Backtrace.
__attribute__((noinline)) std::vector<uint64_t> reference_stack(size_t max_depth, size_t skip) {
    std::vector<uint64_t> frames;
    if (max_depth == 0) return frames;
    ReferenceState state{&frames, skip + 2, max_depth};
    _Unwind_Backtrace(collect_reference, &state);
    asm volatile("" ::: "memory");
    return frames;
}

__attribute__((noinline)) Capture capture_both(const Request& request) {
    uint64_t frames[kMaxFrames];
    size_t depth = capture_stack(frames, request.max_depth, request.skip);
    Capture capture;
    capture.cached.assign(frames, frames + depth);
    capture.reference = reference_stack(request.max_depth, request.skip);
    asm volatile("" ::: "memory");
    return capture;
}

// Frame shapes. Each level consumes one character of `shape` and calls the
// next level; the empty string captures. The asm barrier after each call
// keeps the compiler from turning it into a tail call.
Capture descend(const char* shape, const Request& request);

__attribute__((noinline)) Capture plain_frame(const char* shape, const Request& request) {
    Capture capture = descend(shape + 1, request);
    asm volatile("" ::: "memory");
    return capture;
}

__attribute__((noinline, optimize("no-omit-frame-pointer"))) Capture frame_pointer_frame(
    const char* shape, const Request& request) {
    Capture capture = descend(shape + 1, request);
    asm volatile("" ::: "memory");
    return capture;
}

__attribute__((noinline, optimize("omit-frame-pointer"))) Capture no_frame_pointer_frame(
    const char* shape, const Request& request) {
    char scratch[40] = {};
    asm volatile("" : : "r"(scratch) : "memory");
    Capture capture = descend(shape + 1, request);
    asm volatile("" : : "r"(scratch) : "memory");
    return capture;
}

__attribute__((noinline)) Capture alloca_frame(const char* shape, const Request& request) {
    size_t size = 16 + std::strlen(shape) * 24;
    auto* block = static_cast<char*>(alloca(size));
    std::memset(block, 0x5a, size);
    asm volatile("" : : "r"(block) : "memory");
    Capture capture = descend(shape + 1, request);
    asm volatile("" : : "r"(block) : "memory");
    return capture;
}

__attribute__((noinline)) Capture callee_saved_frame(const char* shape, const Request& request) {
    // Values live across the call occupy rbx, rbp, r12-r15.
    uint64_t a = reinterpret_cast<uintptr_t>(shape);
    uint64_t b = a * 3, c = a ^ 0x55, d = a + 7, e = a * 11, f = a - 1, g = a << 2;
    asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g));
    Capture capture = descend(shape + 1, request);
    asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g));
    if ((a ^ b ^ c ^ d ^ e ^ f ^ g) == 42) capture.cached.push_back(0);
    return capture;
}

__attribute__((noinline)) Capture std_function_frame(const char* shape, const Request& request) {
    std::function<Capture()> next = [&] { return descend(shape + 1, request); };
    Capture capture = next();
    asm volatile("" ::: "memory");
    return capture;
}

// std::call_once runs its callable from __once_proxy inside libstdc++.so,
// called by pthread_once in libc: two shared objects built without frame
// pointers.
__attribute__((noinline)) Capture call_once_frame(const char* shape, const Request& request) {
    std::once_flag once;
    Capture capture;
    std::call_once(once, [&] { capture = descend(shape + 1, request); });
    asm volatile("" ::: "memory");
    return capture;
}

// The comparator runs inside libc's qsort.
struct QsortContext {
    const char* shape;
    const Request* request;
    Capture* capture;
};
thread_local QsortContext* t_qsort_context = nullptr;

__attribute__((noinline)) Capture qsort_frame(const char* shape, const Request& request) {
    Capture capture;
    QsortContext context{shape, &request, &capture};
    QsortContext* outer = t_qsort_context;
    t_qsort_context = &context;
    int values[2] = {2, 1};
    std::qsort(values, 2, sizeof(int), [](const void* x, const void* y) {
        QsortContext* context = t_qsort_context;
        if (context->shape != nullptr) {
            *context->capture = descend(context->shape + 1, *context->request);
            context->shape = nullptr;
        }
        return *static_cast<const int*>(x) - *static_cast<const int*>(y);
    });
    t_qsort_context = outer;
    return capture;
}

// A 64-byte aligned local makes GCC realign the stack; the CFA of this frame
// is then a DWARF expression, which the cache cannot represent.
__attribute__((noinline)) Capture realigned_frame(const char* shape, const Request& request) {
    alignas(64) char block[64] = {};
    asm volatile("" : : "r"(block) : "memory");
    Capture capture = descend(shape + 1, request);
    asm volatile("" : : "r"(block) : "memory");
    return capture;
}

thread_local const char* t_signal_shape = nullptr;
thread_local const Request* t_signal_request = nullptr;
thread_local Capture* t_signal_capture = nullptr;

void capture_in_signal_handler(int) {
    *t_signal_capture = descend(t_signal_shape + 1, *t_signal_request);
}

__attribute__((noinline)) Capture signal_frame(const char* shape, const Request& request) {
    Capture capture;
    t_signal_shape = shape;
    t_signal_request = &request;
    t_signal_capture = &capture;
    struct sigaction action = {};
    struct sigaction previous = {};
    action.sa_handler = capture_in_signal_handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR2, &action, &previous);
    raise(SIGUSR2);
    sigaction(SIGUSR2, &previous, nullptr);
    return capture;
}

// p plain, f frame pointer, n no frame pointer, a alloca, c callee-saved
// registers, s std::function, o std::call_once, q qsort, r realigned,
// g signal handler.
Capture descend(const char* shape, const Request& request) {
    switch (*shape) {
        case 'p':
            return plain_frame(shape, request);
        case 'f':
            return frame_pointer_frame(shape, request);
        case 'n':
            return no_frame_pointer_frame(shape, request);
        case 'a':
            return alloca_frame(shape, request);
        case 'c':
            return callee_saved_frame(shape, request);
        case 's':
            return std_function_frame(shape, request);
        case 'o':
            return call_once_frame(shape, request);
        case 'q':
            return qsort_frame(shape, request);
        case 'r':
            return realigned_frame(shape, request);
        case 'g':
            return signal_frame(shape, request);
        default:
            return capture_both(request);
    }
}

Capture capture_through(const std::string& shape, Request request = {}) {
    return descend(shape.c_str(), request);
}

// Without ordinary frames on the way the cached walk never gets to run.
const std::string kMixedShape = "pfnacsoqpfnacpppcafnsoqcnfap";

}  // namespace

TEST_CASE("the cached unwinder returns the same frames as _Unwind_Backtrace") {
    for (const char* shape : {"", "p", "pppppppppppppppppppppppp", "ffffffff", "nnnnnnnn",
                              "aaaaaaaa", "cccccccc", "ssss", "oooo", "qqqq"}) {
        CAPTURE(shape);
        Capture capture = capture_through(shape);
        REQUIRE(capture.reference.size() >= 3);
        CHECK(capture.cached == capture.reference);
    }
}

TEST_CASE("stacks of mixed frame shapes match _Unwind_Backtrace cold and warm") {
    allocscope::clear_frame_rule_cache();
    Capture cold = capture_through(kMixedShape);
    Capture warm = capture_through(kMixedShape);
    CHECK(cold.cached == cold.reference);
    CHECK(warm.cached == warm.reference);
    CHECK(warm.cached == cold.cached);
    CHECK(cold.reference.size() > kMixedShape.size());
}

TEST_CASE("ordinary frames, libc and libstdc++ frames included, are walked without fallback") {
    capture_through(kMixedShape);
    uint64_t fallbacks_before = allocscope::fallback_capture_count();
    Capture capture = capture_through(kMixedShape);
    CHECK(capture.cached == capture.reference);
    CHECK(allocscope::fallback_capture_count() == fallbacks_before);
}

TEST_CASE("a frame whose CFA is a DWARF expression falls back and still matches") {
    uint64_t fallbacks_before = allocscope::fallback_capture_count();
    for (const char* shape : {"r", "pprpp", "prfrnr"}) {
        CAPTURE(shape);
        Capture capture = capture_through(shape);
        CHECK(capture.cached == capture.reference);
    }
    CHECK(allocscope::fallback_capture_count() > fallbacks_before);
}

TEST_CASE("a signal frame on the stack falls back and still matches") {
    uint64_t fallbacks_before = allocscope::fallback_capture_count();
    for (const char* shape : {"g", "ppgpp", "pgcagn"}) {
        CAPTURE(shape);
        Capture capture = capture_through(shape);
        CHECK(capture.cached == capture.reference);
    }
    CHECK(allocscope::fallback_capture_count() > fallbacks_before);
}

TEST_CASE("max_depth truncates to the innermost frames") {
    Capture full = capture_through(kMixedShape);
    for (size_t depth : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{24}}) {
        CAPTURE(depth);
        Capture capture = capture_through(kMixedShape, {depth, 0});
        CHECK(capture.cached == capture.reference);
        REQUIRE(capture.cached.size() == depth);
        CHECK(std::equal(capture.cached.begin(), capture.cached.end(), full.cached.begin()));
    }
}

TEST_CASE("skip drops that many innermost frames") {
    Capture full = capture_through(kMixedShape);
    for (size_t skip : {size_t{1}, size_t{2}, size_t{5}, size_t{20}}) {
        CAPTURE(skip);
        Capture capture = capture_through(kMixedShape, {kMaxFrames, skip});
        CHECK(capture.cached == capture.reference);
        CHECK(std::vector<uint64_t>(full.cached.begin() + static_cast<ptrdiff_t>(skip),
                                    full.cached.end()) == capture.cached);
    }
    Capture window = capture_through(kMixedShape, {4, 3});
    CHECK(window.cached == window.reference);
    CHECK(window.cached.size() == 4);
}

TEST_CASE("skipping past the outermost frame returns no frames") {
    Capture capture = capture_through("ppp", {kMaxFrames, 10000});
    CHECK(capture.cached.empty());
    CHECK(capture.reference.empty());
}

TEST_CASE("max_depth 0 returns 0 and writes nothing") {
    uint64_t frames[4] = {1, 2, 3, 4};
    CHECK(capture_stack(frames, 0, 0) == 0);
    CHECK(frames[0] == 1);
    CHECK(frames[3] == 4);
}

TEST_CASE("threads capturing at once each get their own stack") {
    allocscope::clear_frame_rule_cache();
    constexpr int kThreads = 8;
    std::atomic<int> mismatches{0};
    std::atomic<int> captures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &mismatches, &captures] {
            std::string shape = kMixedShape.substr(static_cast<size_t>(t));
            for (int round = 0; round < 50; ++round) {
                Capture capture = capture_through(shape + std::string(size_t(round % 5), 'p'));
                if (capture.cached != capture.reference || capture.reference.size() < 3) {
                    ++mismatches;
                }
                ++captures;
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    CHECK(captures.load() == kThreads * 50);
    CHECK(mismatches.load() == 0);
}

TEST_CASE("compute_frame_rule describes an ordinary call site as one step") {
    Capture capture = capture_through("pp");
    REQUIRE(!capture.reference.empty());
    allocscope::FrameRule rule = allocscope::compute_frame_rule(capture.reference[0]);
    CHECK(rule.kind == allocscope::FrameRuleKind::kStep);
    CHECK(rule.cfa_offset >= 16);
    CHECK(allocscope::compute_frame_rule(0).kind == allocscope::FrameRuleKind::kFallback);
}
