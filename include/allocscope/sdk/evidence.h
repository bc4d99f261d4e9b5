// Evidence: one allocation that proves a finding, as the findings files
// carry it (docs/FINDINGS.md) and as plugins build it before emitting
// (allocscope/sdk/finding.h). Header-only, shared by core and the plugins.
#pragma once

#include <cstdint>
#include <string>

namespace allocscope {

// One allocation that proves a finding; strings owned here. free_seq 0
// means alive when the finding was made.
struct Evidence {
    uint64_t size = 0;
    std::string layer;
    std::string phase;
    uint64_t step = 0;
    uint64_t alloc_seq = 0;
    uint64_t free_seq = 0;
    uint32_t stack_id = 0;  // the rank's trace's stack id, 0: none
    std::string note;       // what it is and why alive (a derivation chain); "" for none

    bool operator==(const Evidence&) const = default;
};

}  // namespace allocscope

// The plugin SDK's namespace names it too (it was declared there first).
namespace allocscope::plugins {
using allocscope::Evidence;
}  // namespace allocscope::plugins
