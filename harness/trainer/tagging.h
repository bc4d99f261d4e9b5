// The trainer's tags, through the C API (<allocscope/allocscope_dl.h>) or,
// with --nvtx, through NVTX ranges and marks named by the convention of
// <allocscope/allocscope.h> (ALLOCSCOPE_NVTX_PREFIX). liballocscope.so maps
// those back to the same tags when it is the process's NVTX injection
// library (`allocscope run --nvtx`), so both give identical traces
// (tests/harness/harness_nvtx_test.cpp). Parameters are registered through
// the C API either way: NVTX has no such call.
#pragma once

#include <cstdint>

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

}  // namespace allocscope::harness::trainer
