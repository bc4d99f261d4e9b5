// What an NVTX range or mark name means to allocscope: the naming convention
// of include/allocscope/allocscope.h (ALLOCSCOPE_NVTX_PREFIX) and the range
// names FSDP2 gives its hooks through torch.profiler.record_function. Pure
// functions of the name (and, for FSDP sub-phases, of the thread's current
// phase), so every rule is unit-tested without a recorder
// (tests/nvtx_names_test.cpp). docs/DESIGN.md, "Tags", states the rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace allocscope::nvtx {

// Longer names are never mapped (no layer path comes near it); an
// injection callback stops reading a name here.
inline constexpr size_t kMaxNameBytes = 1024;

// The tag a range push (or start) enters.
struct RangeTag {
    bool mapped = false;     // false: the range is not a tag (its pop pops nothing)
    bool keep_layer = true;  // layer of the enclosing tag (NULL in allocscope_push)
    bool keep_phase = true;  // phase of the enclosing tag
    bool sub_phase = false;  // `phase` is a sub-phase of the enclosing phase's
                             // base (see sub_phase_of)
    std::string layer;
    std::string phase;
    std::optional<uint64_t> step;  // `allocscope:step=<n>`: sets the step, no tag
};
RangeTag map_range(std::string_view name);

// What a mark does.
struct MarkAction {
    enum class Kind { none, step, note } kind = Kind::none;
    uint64_t step = 0;
    std::string_view note;  // a view into the name
};
MarkAction map_mark(std::string_view name);

// "forward/all_gather" for ("forward/prefetch", "all_gather"): the part of the
// current phase before its first '/', then '/', then `sub`; `sub` alone when
// the thread has no phase.
std::string sub_phase_of(std::string_view current_phase, std::string_view sub);

// The name without what torch.autograd.profiler.emit_nvtx appends to a
// record_function name: ", seq = N", ", op_id = N", ", sizes = [...]",
// ", input_op_ids = ..." (the first ", <words> = " and everything after it).
std::string_view strip_profiler_suffix(std::string_view name);

}  // namespace allocscope::nvtx
