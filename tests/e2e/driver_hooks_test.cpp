// Driver-level hooks, end to end: tests/e2e/driver_program.cpp gets CUDA
// driver entry points every way programs do (the runtime's
// cudaGetDriverEntryPointByVersion, cuGetProcAddress_v2 found by dlsym on a
// dlopen'ed driver, dlsym of the symbol itself, RTLD_DEFAULT) and allocates
// through each, under `allocscope run`. In CI the driver is the host-memory
// libsimcuda.so behind the host-memory libcudart; with DRIVER_GPU=1 it is
// libcuda.so.1 behind the real runtime (exit 77 without a GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../support.h"
#include "event.h"
#include "replay.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool on_gpu() {
    const char* v = std::getenv("DRIVER_GPU");
    return v && std::string(v) == "1";
}

std::string driver_lib() {
    return on_gpu() ? "libcuda.so.1" : env("DRIVER_SIM_LIB");
}

struct Run {
    TempDir dir;
    int status = -1;
    std::string out, err;
    Trace trace;

    explicit Run(const std::string& extra_env = "") {
        const fs::path traces = dir / "out";
        // The exported cuMemAlloc_v2 finds the host-memory driver by this
        // variable (libcuda.so.1 is looked for otherwise).
        const std::string lib_env =
            on_gpu() ? std::string() : "ALLOCSCOPE_CUDA_DRIVER_LIB=" + driver_lib() + " ";
        status = sh(lib_env + extra_env + " " + env("E2E_CLI") + " run --plugins none --out " +
                        traces.string() + " -- " + env("DRIVER_PROGRAM") + " " + driver_lib(),
                    &out, &err);
        for (const auto& f : fs::directory_iterator(traces)) {
            if (f.path().extension() == ".trace") trace = load_trace(f.path().string());
        }
    }

    std::vector<Event> find(EventKind kind, Api api) const {
        std::vector<Event> found;
        for (const Event& e : trace.events)
            if (e.kind == kind && e.api == api) found.push_back(e);
        return found;
    }
    size_t count(EventKind kind, Api api) const { return find(kind, api).size(); }
};

std::string program_output_without_allocscope() {
    std::string out;
    sh(env("DRIVER_PROGRAM") + " " + driver_lib(), &out);
    return out;
}

void require_device() {
    if (!on_gpu()) return;
    if (sh(env("DRIVER_PROBE") + " probe") != 0) {
        MESSAGE("no usable CUDA device: skipped");
        std::exit(77);
    }
}

}  // namespace

TEST_CASE("a runtime allocation that lands in the driver is recorded once, by the runtime hook") {
    require_device();
    Run run;
    INFO(run.err);
    REQUIRE(run.status == 0);
    const auto mallocs = run.find(EventKind::alloc, Api::cudaMalloc);
    REQUIRE(mallocs.size() == 1);
    CHECK(mallocs[0].size == kMiB);
    CHECK(run.count(EventKind::free, Api::cudaFree) == 1);
    for (const Event& e : run.find(EventKind::alloc, Api::cuMemAlloc_v2))
        CHECK(e.size != kMiB);  // the runtime's own driver call is not recorded again
}

TEST_CASE("entry points from cudaGetDriverEntryPointByVersion are wrapped and carry the tag") {
    require_device();
    Run run;
    REQUIRE(run.status == 0);
    std::vector<Event> two;
    for (const Event& e : run.find(EventKind::alloc, Api::cuMemAlloc_v2))
        if (e.size == 2 * kMiB) two.push_back(e);
    REQUIRE(two.size() == 1);
    CHECK(run.trace.str(two[0].layer) == "layers.0");
    CHECK(run.trace.str(two[0].phase) == "forward");
    CHECK(two[0].level == Level::segment);
    CHECK(two[0].memory == MemoryKind::device);
    CHECK(two[0].stack != 0);
    // Its free, through the wrapped cuMemFree, finds the record.
    bool freed = false;
    for (const Event& e : run.find(EventKind::free, Api::cuMemFree_v2))
        freed |= e.address == two[0].address && e.size == 2 * kMiB && e.result == 0;
    CHECK(freed);
}

TEST_CASE("cuGetProcAddress found by dlsym hands out wrapped per-thread-stream variants") {
    require_device();
    Run run;
    REQUIRE(run.status == 0);
    const auto allocs = run.find(EventKind::alloc, Api::cuMemAllocAsync_ptsz);
    REQUIRE(allocs.size() == 1);
    CHECK(allocs[0].size == 3 * kMiB);
    const auto frees = run.find(EventKind::free, Api::cuMemFreeAsync_ptsz);
    REQUIRE(frees.size() == 1);
    CHECK(frees[0].size == 3 * kMiB);
    CHECK(frees[0].address == allocs[0].address);
}

TEST_CASE(
    "virtual memory: mappings are device segments, handles and VA ranges are counted apart; "
    "a retained handle's extra release frees nothing") {
    require_device();
    Run run;
    REQUIRE(run.status == 0);
    CHECK(run.count(EventKind::alloc, Api::cuMemAddressReserve) == 1);
    CHECK(run.count(EventKind::alloc, Api::cuMemCreate) == 2);
    CHECK(run.count(EventKind::alloc, Api::cuMemMap) == 2);
    CHECK(run.count(EventKind::free, Api::cuMemRelease) == 2);
    CHECK(run.count(EventKind::free, Api::cuMemAddressFree) == 1);
    // One cuMemUnmap over both mappings: one event for the range, which the
    // replay splits into one free per mapping, both found.
    const auto unmaps = run.find(EventKind::free, Api::cuMemUnmap);
    REQUIRE(unmaps.size() == 1);
    CHECK(unmaps[0].size == 4 * kMiB);
    CHECK((unmaps[0].flags & kFlagRange) != 0);
    CHECK((unmaps[0].flags & (kFlagUnknownAddress | kFlagDoubleFree)) == 0);
    CHECK(unmaps[0].result == 0);
    CHECK(unmaps[0].memory == MemoryKind::device);
    std::vector<LiveChange> split;
    Replay splitter;
    for (const Event& e : run.trace.events)
        splitter.apply(e, [&](const LiveChange& c) {
            if (c.event->api == Api::cuMemUnmap) split.push_back(c);
        });
    REQUIRE(split.size() == 2);
    for (const LiveChange& c : split) {
        CHECK(c.released());
        CHECK(c.record.size == 2 * kMiB);
        CHECK(c.record.api == Api::cuMemMap);
    }
    CHECK(split[0].address == unmaps[0].address);
    CHECK(split[0].address + 2 * kMiB == split[1].address);
    for (const Event& e : run.find(EventKind::alloc, Api::cuMemCreate)) {
        CHECK(e.memory == MemoryKind::physical);
        CHECK(e.size == 2 * kMiB);
        CHECK(e.device == 0);
    }

    Replay replay;
    uint64_t segment_live_during_vmm = 0;
    for (const Event& e : run.trace.events) {
        replay.apply(e);
        if (e.kind == EventKind::alloc && e.api == Api::cuMemMap)
            segment_live_during_vmm = replay.totals(Pool::device_segment).live_bytes;
    }
    // Mapped bytes count once, as segments; the handles (4 MiB) and the VA
    // range (8 MiB) are in their own pools and never in the device total.
    CHECK(segment_live_during_vmm == 4 * kMiB);
    CHECK(replay.totals(Pool::physical).peak_bytes == 4 * kMiB);
    CHECK(replay.totals(Pool::address_range).peak_bytes == 8 * kMiB);
    CHECK(replay.totals(Pool::physical).live_bytes == 0);
    CHECK(replay.totals(Pool::address_range).live_bytes == 0);
    // A release of a retained reference frees nothing: no double free.
    CHECK(replay.double_frees() == 0);
}

TEST_CASE("dlsym of a driver symbol and the exported entry point are both recorded") {
    require_device();
    Run run;
    REQUIRE(run.status == 0);
    std::map<uint64_t, int> sizes;
    for (const Event& e : run.find(EventKind::alloc, Api::cuMemAlloc_v2))
        ++sizes[e.size];
    CHECK(sizes[5 * kMiB] == 1);  // dlsym(driver, "cuMemAlloc_v2")
    CHECK(sizes[6 * kMiB] == 1);  // dlsym(RTLD_DEFAULT, ...): liballocscope.so's export
    Replay replay;
    for (const Event& e : run.trace.events)
        replay.apply(e);
    // Both kept until exit; nothing else the program allocated is left.
    CHECK(replay.totals(Pool::device_segment).live_bytes == 11 * kMiB);
    CHECK(replay.unknown_frees() == 1);  // the bad free below
}

TEST_CASE("a failing driver call returns its error unchanged and is recorded as failed") {
    require_device();
    Run run;
    REQUIRE(run.status == 0);  // driver_program checks every return code itself
    std::vector<Event> failed;
    for (const Event& e : run.find(EventKind::free, Api::cuMemFree_v2))
        if (e.result != 0) failed.push_back(e);
    REQUIRE(failed.size() == 1);
    CHECK((failed[0].flags & kFlagUnknownAddress) != 0);
    CHECK(run.out == program_output_without_allocscope());
}

TEST_CASE("ALLOCSCOPE_DRIVER_HOOKS=0 leaves driver calls unrecorded and the program unchanged") {
    require_device();
    Run run("ALLOCSCOPE_DRIVER_HOOKS=0");
    REQUIRE(run.status == 0);
    size_t driver_events = 0;
    for (const Event& e : run.trace.events)
        driver_events += e.api >= Api::cuMemAlloc_v2;
    CHECK(driver_events == 0);
    CHECK(run.count(EventKind::alloc, Api::cudaMalloc) == 1);
    CHECK(run.out == program_output_without_allocscope());
}
