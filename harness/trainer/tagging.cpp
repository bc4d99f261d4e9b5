#include "trainer/tagging.h"

#include <allocscope/allocscope_dl.h>

#include <string>

#if defined(ALLOCSCOPE_HAVE_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace allocscope::harness::trainer {

namespace {

// What NVTX ranges and marks carry; without the headers --nvtx is refused
// before the trainer runs (trainer/run.cpp), so these are never reached.
void range_push(const std::string& name) {
#if defined(ALLOCSCOPE_HAVE_NVTX)
    nvtxRangePushA(name.c_str());
#else
    (void)name;
#endif
}

void range_pop() {
#if defined(ALLOCSCOPE_HAVE_NVTX)
    nvtxRangePop();
#endif
}

void mark(const std::string& name) {
#if defined(ALLOCSCOPE_HAVE_NVTX)
    nvtxMarkA(name.c_str());
#else
    (void)name;
#endif
}

}  // namespace

bool nvtx_available() noexcept {
#if defined(ALLOCSCOPE_HAVE_NVTX)
    return true;
#else
    return false;
#endif
}

ScopedTag::ScopedTag(Tagging via, const char* layer, const char* phase) : via_(via) {
    if (via_ == Tagging::c_api) {
        allocscope_dl_push(layer, phase);
        return;
    }
    // An empty part keeps the enclosing value, as NULL does for the C API.
    range_push(std::string(ALLOCSCOPE_NVTX_PREFIX) + (layer ? layer : "") + "/" +
               (phase ? phase : ""));
}

ScopedTag::~ScopedTag() {
    if (via_ == Tagging::c_api) {
        allocscope_dl_pop();
    } else {
        range_pop();
    }
}

Provenance::Provenance(bool enabled) noexcept
    : active_(enabled && allocscope_dl()->derived != nullptr) {
    // The trace says whether provenance runs (allocscope.h), so that the
    // run's summary can say what the detectors matched by size alone.
    allocscope_dl_mark(active_ ? ALLOCSCOPE_PROVENANCE_ON
                       : enabled
                           ? ALLOCSCOPE_PROVENANCE_OFF "the interposer has no allocscope_derived"
                           : ALLOCSCOPE_PROVENANCE_OFF "the harness ran with --no-provenance");
}

void Provenance::declare(const void* ptr, const std::string& layer, const std::string& name,
                         const std::string& how) const {
    allocscope_dl_derived(ptr, layer.c_str(), name.c_str(), how.c_str());
}

void tag_step(Tagging via, uint64_t step) {
    if (via == Tagging::c_api) {
        allocscope_dl_step(step);
    } else {
        mark(ALLOCSCOPE_NVTX_STEP + std::to_string(step));
    }
}

void tag_allocator_counters(Tagging via, int device, uint64_t allocated, uint64_t reserved,
                            uint64_t device_used) {
    if (via == Tagging::c_api)
        allocscope_dl_allocator_counters(device, allocated, reserved, device_used);
}

}  // namespace allocscope::harness::trainer
