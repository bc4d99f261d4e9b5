// The trainer's tags, through the C API (<allocscope/allocscope_dl.h>) or,
// with --nvtx, through NVTX ranges and marks named by the convention of
// <allocscope/allocscope.h> (ALLOCSCOPE_NVTX_PREFIX). liballocscope.so maps
// those back to the same tags when it is the process's NVTX injection
// library (`allocscope run --nvtx`), so both give identical traces
// (tests/harness/harness_nvtx_test.cpp). Parameters are registered, and
// provenance declared, through the C API either way: NVTX has no such calls.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/options.h"

namespace allocscope::harness::trainer {

// Whether this build can tag through NVTX (the nvtx3 headers were found).
bool nvtx_available() noexcept;

// Enters (layer, phase) for the lifetime of the object; NULL keeps the
// enclosing tag's value, as in allocscope_push.
class ScopedTag {
  public:
    ScopedTag(Tagging via, const char* layer, const char* phase);
    ~ScopedTag();
    ScopedTag(const ScopedTag&) = delete;
    ScopedTag& operator=(const ScopedTag&) = delete;

  private:
    Tagging via_;
};

void tag_step(Tagging via, uint64_t step);
// The allocator's own counters at a step boundary (allocscope's self-check);
// through the C API only.
void tag_allocator_counters(Tagging via, int device, uint64_t allocated, uint64_t reserved,
                            uint64_t device_used);

// Provenance (allocscope_derived): declares which parameter an allocation's
// bytes were computed from. Inactive when switched off (--no-provenance) or
// when no interposer provides allocscope_derived, and then a declaration
// costs one branch: its `how` is built only when active.
class Provenance {
  public:
    explicit Provenance(bool enabled) noexcept;
    bool active() const noexcept { return active_; }

    // `ptr`: the block's address as the caching allocator reported it;
    // (layer, name): the parameter as registered with
    // allocscope_register_param; how(): a short std::string saying how.
    template <typename How>
    void derived(const void* ptr, const std::string& layer, const std::string& name,
                 How&& how) const {
        if (active_) declare(ptr, layer, name, how());
    }

  private:
    void declare(const void* ptr, const std::string& layer, const std::string& name,
                 const std::string& how) const;
    bool active_ = false;
};

}  // namespace allocscope::harness::trainer
