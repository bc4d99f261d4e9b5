// The stack walk (interposer/unwind.h, unwind_cfi.h): the cached CFI
// unwinder against _Unwind_Backtrace on mixed frame shapes, cold and warm,
// on many threads; replayed captures; fallbacks (DWARF-expression CFAs,
// signal frames); depth, skip and leading-frame rules. Longer than 600
// lines: the cases need their own noinline frame shapes, defined next to
// the cases that use them.
#include <alloca.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
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
    allocscope::LeadingFrames leading{};  // the cached walk only
    allocscope::WalkCookie** cookie = nullptr;
    uint64_t cookie_key = 0;
};

// Fixed storage: captures are also taken inside a signal handler.
struct Frames {
    std::array<uint64_t, kMaxFrames> pcs{};
    size_t size = 0;

    const uint64_t* begin() const { return pcs.data(); }
    const uint64_t* end() const { return pcs.data() + size; }
    bool empty() const { return size == 0; }
    bool operator==(const Frames& other) const {
        return std::equal(begin(), end(), other.begin(), other.end());
    }
    // Frames [first, first + count) of this capture, as a capture of its own.
    Frames slice(size_t first, size_t count = kMaxFrames) const {
        Frames part;
        for (size_t i = first; i < size && part.size < count; ++i)
            part.pcs[part.size++] = pcs[i];
        return part;
    }
};

// Both walks taken from the same function, so both start at its caller.
struct Capture {
    Frames cached;
    Frames reference;
    uintptr_t frame = 0;  // of the function that called capture_stack
    size_t returned = 0;  // by capture_stack
};

struct ReferenceState {
    Frames* frames;
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
    state->frames->pcs[state->frames->size++] = ip;
    return state->frames->size < state->max_depth ? _URC_NO_REASON : _URC_END_OF_STACK;
}

// Same contract as capture_stack(), computed by plain _Unwind_Backtrace.
__attribute__((noinline)) Frames reference_stack(size_t max_depth, size_t skip) {
    Frames frames;
    if (max_depth == 0) return frames;
    ReferenceState state{&frames, skip + 2, max_depth};
    _Unwind_Backtrace(collect_reference, &state);
    asm volatile("" ::: "memory");
    return frames;
}

__attribute__((noinline)) Capture capture_both(const Request& request) {
    Capture capture;
    capture.returned = capture_stack(capture.cached.pcs.data(), request.max_depth, request.skip,
                                     request.leading, request.cookie, request.cookie_key);
    capture.cached.size = capture.returned == allocscope::kFramesInCookie ? 0 : capture.returned;
    capture.reference = reference_stack(request.max_depth, request.skip);
    capture.frame = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
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
    if ((a ^ b ^ c ^ d ^ e ^ f ^ g) == 42) capture.cached.size = 0;
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

// A 64-byte aligned local makes GCC realign rsp and address the frame from rbp.
__attribute__((noinline)) Capture realigned_frame(const char* shape, const Request& request) {
    alignas(64) char block[64] = {};
    asm volatile("" : : "r"(block) : "memory");
    Capture capture = descend(shape + 1, request);
    asm volatile("" : : "r"(block) : "memory");
    return capture;
}

// Calls fn(argument) from a frame whose CFA rule is DW_CFA_def_cfa_expression
// (DW_OP_breg6 16, i.e. rbp + 16), which the rule cache does not represent.
extern "C" void call_through_cfa_expression(void (*fn)(void*), void* argument);
asm(R"(
    .text
    .p2align 4
    .type call_through_cfa_expression, @function
call_through_cfa_expression:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov %rsp, %rbp
    .cfi_escape 0x0f, 0x02, 0x76, 0x10
    mov %rdi, %rax
    mov %rsi, %rdi
    call *%rax
    pop %rbp
    .cfi_def_cfa %rsp, 8
    ret
    .cfi_endproc
    .size call_through_cfa_expression, .-call_through_cfa_expression
)");

struct Continuation {
    const char* shape;
    const Request* request;
    Capture* capture;
};

__attribute__((noinline)) Capture cfa_expression_frame(const char* shape, const Request& request) {
    Capture capture;
    Continuation continuation{shape, &request, &capture};
    call_through_cfa_expression(
        [](void* argument) {
            auto* continuation = static_cast<Continuation*>(argument);
            *continuation->capture = descend(continuation->shape + 1, *continuation->request);
        },
        &continuation);
    return capture;
}

thread_local const char* t_signal_shape = nullptr;
thread_local const Request* t_signal_request = nullptr;
thread_local Capture* t_signal_capture = nullptr;

// ASan's fake stacks (detect_stack_use_after_return=1) are not async-signal-safe.
__attribute__((no_sanitize("address"))) void capture_in_signal_handler(int) {
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
// x CFA expression, g signal handler.
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
        case 'x':
            return cfa_expression_frame(shape, request);
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
const std::string kMixedShape = "pfnacsoqrpfnacpppcafnrsoqcnfap";

}  // namespace

TEST_CASE("the cached unwinder returns the same frames as _Unwind_Backtrace") {
    for (const char* shape : {"", "p", "pppppppppppppppppppppppp", "ffffffff", "nnnnnnnn",
                              "aaaaaaaa", "cccccccc", "ssss", "oooo", "qqqq"}) {
        CAPTURE(shape);
        Capture capture = capture_through(shape);
        REQUIRE(capture.reference.size >= 3);
        CHECK(capture.cached == capture.reference);
    }
}

TEST_CASE("stacks of mixed frame shapes match _Unwind_Backtrace cold and warm") {
    allocscope::clear_frame_rule_cache();
    Capture captures[2];  // cold, then warm, from the same call site
    for (Capture& capture : captures)
        capture = capture_through(kMixedShape);
    for (const Capture& capture : captures)
        CHECK(capture.cached == capture.reference);
    CHECK(captures[1].cached == captures[0].cached);
    CHECK(captures[0].reference.size > kMixedShape.size());
}

TEST_CASE("walks one after the other on a thread, sharing some frames and not others, all match") {
    // The walk remembers the rules of the thread's last walk by position;
    // shapes that differ inside, in length and in their outer frames shift
    // which positions still hold the same return address.
    const char* shapes[] = {"ppppcafn",   "ppppcafn", "ppfpcafn", "pppcafn", "ssppcafn",
                            "ppppcafnpp", "nnppcafn", "ppppcafn", "p",       "ppppcafn"};
    for (int round = 0; round < 2; ++round) {
        for (const char* shape : shapes) {
            CAPTURE(round);
            CAPTURE(shape);
            Capture capture = capture_through(shape);
            CHECK(capture.cached == capture.reference);
        }
    }
}

TEST_CASE("a frame met again at another position takes its rule from the thread's recent rules") {
    allocscope::enable_walk_stats(false);
    // The same frames, then one more inside them: every frame of the first
    // walk is one position further out in the second.
    const Capture first = capture_through("ppppcafn");
    const allocscope::WalkStats before = allocscope::walk_stats();
    const Capture shifted = capture_through("ppppcafnp");
    const allocscope::WalkStats after = allocscope::walk_stats();
    CHECK(first.cached == first.reference);
    CHECK(shifted.cached == shifted.reference);
    CHECK(after.walks == before.walks + 1);
    CHECK(after.recent_hits - before.recent_hits >= 8);
    CHECK(after.frames - before.frames >= after.recent_hits - before.recent_hits);
}

__attribute__((noinline)) uintptr_t frame_of_a_call() {
    return reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
}

// Captures with capture_both's frame at the same address whatever the
// caller's depth: alloca pads the stack down to `target`.
__attribute__((noinline)) Capture capture_at(uintptr_t target, const Request& request) {
    const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    auto* pad = static_cast<char*>(alloca(here - target));
    asm volatile("" : : "r"(pad) : "memory");
    Capture capture = capture_both(request);
    asm volatile("" : : "r"(pad) : "memory");
    return capture;
}

// Callers of capture_at with frames of different sizes: each instance is a
// function of its own, with its own return address into it.
template <size_t kBlock>
__attribute__((noinline)) Capture via_frame_of(uintptr_t target, const Request& request) {
    char block[kBlock] = {};
    asm volatile("" : : "r"(block) : "memory");
    Capture capture = capture_at(target, request);
    asm volatile("" : : "r"(block) : "memory");
    return capture;
}

TEST_CASE("a capture from the registers of an earlier one, over the same stack words, replays it") {
    allocscope::clear_frame_rule_cache();
    allocscope::enable_walk_stats(false);
    const Request request{24, 0};
    Capture captures[3];
    allocscope::WalkStats stats[4];
    stats[0] = allocscope::walk_stats();
    for (int i = 0; i < 3; ++i) {
        captures[i] = capture_through("ppfnacpp", request);
        stats[i + 1] = allocscope::walk_stats();
    }
    for (const Capture& capture : captures) {
        CHECK(capture.cached == capture.reference);
        CHECK(capture.frame == captures[0].frame);
    }
    // The first walks; the others compare the words it read and copy its frames.
    CHECK(stats[1].walks == stats[0].walks + 1);
    CHECK(stats[1].replays == stats[0].replays);
    for (int i = 2; i <= 3; ++i) {
        CHECK(stats[i].walks == stats[i - 1].walks);
        CHECK(stats[i].replays == stats[i - 1].replays + 1);
    }
}

TEST_CASE(
    "two stacks that reach the capture with the same registers are told apart, and both replay") {
    allocscope::clear_frame_rule_cache();
    allocscope::enable_walk_stats(false);
    const Request request{16, 0};
    // Below the callers' frames (a few hundred bytes each), 16-byte aligned.
    const uintptr_t target = (frame_of_a_call() - 8192) & ~uintptr_t{15};
    Capture (*const callers[])(uintptr_t, const Request&) = {via_frame_of<32>, via_frame_of<480>};
    Capture captures[6];
    const allocscope::WalkStats before = allocscope::walk_stats();
    for (int i = 0; i < 6; ++i)
        captures[i] = callers[i % 2](target, request);
    const allocscope::WalkStats after = allocscope::walk_stats();
    // The premise: capture_stack saw the same return address and rsp each time.
    REQUIRE(captures[1].frame == captures[0].frame);
    for (const Capture& capture : captures)
        CHECK(capture.cached == capture.reference);
    CHECK_FALSE(captures[0].cached == captures[1].cached);
    // Only the first of each was walked: the second's return address into
    // its caller differs from the first's, so it did not replay the first.
    CHECK(after.walks == before.walks + 2);
    CHECK(after.replays == before.replays + 4);
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
    for (const char* shape : {"x", "ppxpp", "pxfrnx"}) {
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

// Captures with each request from one call site, so the stacks are comparable.
std::vector<Capture> capture_each(const std::string& shape, const std::vector<Request>& requests) {
    std::vector<Capture> captures;
    for (const Request& request : requests)
        captures.push_back(capture_through(shape, request));
    return captures;
}

std::vector<Capture> capture_each(const std::vector<Request>& requests) {
    return capture_each(kMixedShape, requests);
}

TEST_CASE("a capture with another request from the same registers walks again") {
    allocscope::clear_frame_rule_cache();
    allocscope::enable_walk_stats(false);
    const Request requests[] = {{24, 0}, {24, 1}, {24, 1}};
    Capture captures[3];
    allocscope::WalkStats stats[4];
    stats[0] = allocscope::walk_stats();
    for (int i = 0; i < 3; ++i) {
        captures[i] = capture_through("ppfnacpp", requests[i]);
        stats[i + 1] = allocscope::walk_stats();
    }
    for (const Capture& capture : captures)
        CHECK(capture.cached == capture.reference);
    CHECK(captures[1].cached == captures[0].cached.slice(1));
    CHECK(stats[2].walks == stats[1].walks + 1);  // skip 1 is not skip 0's walk
    CHECK(stats[2].replays == stats[1].replays);
    CHECK(stats[3].replays == stats[2].replays + 1);
}

TEST_CASE("a replayed capture hands back what the caller kept with the walk it replays") {
    allocscope::clear_frame_rule_cache();
    allocscope::WalkCookie* cookie = nullptr;
    Request requests[4];
    for (Request& request : requests)
        request = {24, 0, {}, &cookie, 7};
    requests[3].cookie_key = 8;  // another key: the frames come back
    Capture captures[4];
    allocscope::WalkCookie* cookies[4] = {};
    for (int i = 0; i < 4; ++i) {
        captures[i] = capture_through("ppfnacpp", requests[i]);
        cookies[i] = cookie;
        if (i == 0 && cookie) *cookie = {7, 42};  // what the recorder keeps: an id
    }
    REQUIRE(cookies[0] != nullptr);
    CHECK(captures[0].cached == captures[0].reference);
    // Replays of the same walk: the same cookie; with its key no frames.
    CHECK(cookies[1] == cookies[0]);
    CHECK(captures[1].returned == allocscope::kFramesInCookie);
    CHECK(cookies[1]->value == 42);
    CHECK(captures[2].returned == allocscope::kFramesInCookie);
    CHECK(cookies[3] == cookies[0]);
    CHECK(captures[3].returned == captures[0].cached.size);
    CHECK(captures[3].cached == captures[3].reference);
}

TEST_CASE("a new walk's cookie is empty, and none is given without a record of the walk") {
    allocscope::clear_frame_rule_cache();
    allocscope::WalkCookie* cookie = nullptr;
    Capture fresh = capture_through("ppfnacpp", {24, 0, {}, &cookie, 7});
    REQUIRE(cookie != nullptr);
    CHECK(cookie->key == 0);
    CHECK(cookie->value == 0);
    CHECK(fresh.cached == fresh.reference);
    // A walk through a frame libgcc's unwinder must take is not recorded.
    Capture fallback = capture_through("ppxpp", {24, 0, {}, &cookie, 7});
    CHECK(cookie == nullptr);
    CHECK(fallback.cached == fallback.reference);
}

TEST_CASE("max_depth truncates to the innermost frames") {
    std::vector<Capture> captures =
        capture_each({{kMaxFrames, 0}, {1, 0}, {2, 0}, {7, 0}, {24, 0}});
    const Capture& full = captures[0];
    REQUIRE(full.cached.size > 24);
    for (const Capture& capture : captures) {
        CHECK(capture.cached == capture.reference);
        CHECK(capture.cached == full.cached.slice(0, capture.cached.size));
    }
    CHECK(captures[1].cached.size == 1);
    CHECK(captures[4].cached.size == 24);
}

TEST_CASE("skip drops that many innermost frames") {
    std::vector<Capture> captures =
        capture_each({{kMaxFrames, 0}, {kMaxFrames, 1}, {kMaxFrames, 5}, {kMaxFrames, 20}, {4, 3}});
    const Capture& full = captures[0];
    for (const Capture& capture : captures)
        CHECK(capture.cached == capture.reference);
    CHECK(captures[1].cached == full.cached.slice(1));
    CHECK(captures[2].cached == full.cached.slice(5));
    CHECK(captures[3].cached == full.cached.slice(20));
    CHECK(captures[4].cached == full.cached.slice(3, 4));
}

// How many leading frames of `frames` lie in [lo, hi), at most `max`.
size_t leading_in(const Frames& frames, allocscope::LeadingFrames leading) {
    size_t n = 0;
    while (n < frames.size && n < leading.max && frames.pcs[n] >= leading.lo &&
           frames.pcs[n] < leading.hi)
        ++n;
    return n;
}

void check_leading_frames_dropped(const std::string& shape) {
    // A range around the first three frames' return addresses (the same from
    // any call site); deeper frames of the same functions fall in it too,
    // and are kept.
    const Capture probe = capture_through(shape);
    REQUIRE(probe.cached.size > 12);
    const auto [lo, hi] =
        std::minmax({probe.cached.pcs[0], probe.cached.pcs[1], probe.cached.pcs[2]});
    const std::vector<Request> requests = {
        {kMaxFrames, 0, {}},     {kMaxFrames, 0, {lo, hi + 1, 8}},
        {5, 0, {lo, hi + 1, 8}}, {kMaxFrames, 0, {lo, hi + 1, 1}},
        {5, 0, {lo, hi + 1, 0}}, {5, 0, {0, 1, 8}}};
    const std::vector<Capture> captures = capture_each(shape, requests);
    const Frames& full = captures[0].cached;
    REQUIRE(full == captures[0].reference);
    for (size_t i = 1; i < requests.size(); ++i) {
        CAPTURE(i);
        const size_t dropped = leading_in(full, requests[i].leading);
        CHECK(captures[i].cached == full.slice(dropped, requests[i].max_depth));
    }
    const size_t all = leading_in(full, {lo, hi + 1, 8});
    CHECK(all >= 3);
    size_t kept_in_range = 0;  // deeper frames in the range that were kept
    for (size_t i = all; i < full.size; ++i)
        kept_in_range += full.pcs[i] >= lo && full.pcs[i] <= hi;
    CHECK(kept_in_range > 0);
}

TEST_CASE("leading frames in an address range are dropped without counting towards max_depth") {
    check_leading_frames_dropped(kMixedShape);
}

TEST_CASE("leading frames are dropped the same way when the walk falls back to libgcc") {
    const uint64_t fallbacks_before = allocscope::fallback_capture_count();
    check_leading_frames_dropped("ppp" + kMixedShape.substr(0, 10) + "x");
    CHECK(allocscope::fallback_capture_count() > fallbacks_before);
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

TEST_CASE("threads capturing at once, cold cache, match without fallback") {
    allocscope::clear_frame_rule_cache();
    uint64_t fallbacks_before = allocscope::fallback_capture_count();
    constexpr int kThreads = 8;
    std::atomic<int> mismatches{0};
    std::atomic<int> captures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &mismatches, &captures] {
            std::string shape = kMixedShape.substr(static_cast<size_t>(t));
            for (int round = 0; round < 50; ++round) {
                Capture capture = capture_through(shape + std::string(size_t(round % 5), 'p'));
                if (!(capture.cached == capture.reference) || capture.reference.size < 3) {
                    ++mismatches;
                }
                ++captures;
            }
        });
    }
    for (std::thread& thread : threads)
        thread.join();
    CHECK(captures.load() == kThreads * 50);
    CHECK(mismatches.load() == 0);
    CHECK(allocscope::fallback_capture_count() == fallbacks_before);
}

TEST_CASE("compute_frame_rule describes an ordinary call site as one step") {
    Capture capture = capture_through("pp");
    REQUIRE(!capture.reference.empty());
    allocscope::FrameRule rule = allocscope::compute_frame_rule(capture.reference.pcs[0]);
    CHECK(rule.kind == allocscope::FrameRuleKind::kStep);
    CHECK(rule.cfa_offset >= 16);
    CHECK(allocscope::compute_frame_rule(0).kind == allocscope::FrameRuleKind::kFallback);
}
