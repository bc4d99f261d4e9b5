// x86-64 DWARF call-frame information reduced to the one step the fast stack
// walk needs: from a frame's rsp/rbp at a call site to its caller's.
#pragma once

#include <cstdint>

// The part of libgcc's unwinder interface used by the walk, its fallback and
// its tests, as in GCC's unwind.h and unwind-dw2-fde.h for x86-64. Declared
// here because <unwind.h> resolves to interposer/unwind.h whenever this
// directory is on the include path, as it is in the meson build; do not
// include the real <unwind.h> next to this header.
extern "C" {
struct _Unwind_Context;
typedef enum {
    _URC_NO_REASON = 0,
    _URC_FOREIGN_EXCEPTION_CAUGHT = 1,
    _URC_FATAL_PHASE2_ERROR = 2,
    _URC_FATAL_PHASE1_ERROR = 3,
    _URC_NORMAL_STOP = 4,
    _URC_END_OF_STACK = 5,
    _URC_HANDLER_FOUND = 6,
    _URC_INSTALL_CONTEXT = 7,
    _URC_CONTINUE_UNWIND = 8
} _Unwind_Reason_Code;
typedef _Unwind_Reason_Code (*_Unwind_Trace_Fn)(struct _Unwind_Context*, void*);
_Unwind_Reason_Code _Unwind_Backtrace(_Unwind_Trace_Fn trace, void* argument);
uintptr_t _Unwind_GetIP(struct _Unwind_Context* context);

// Exported by libgcc_s since GCC_3.0 (and by LLVM libunwind). Searches frames
// registered with __register_frame_info and every loaded object's
// .eh_frame_hdr.
struct dwarf_eh_bases {
    void* tbase;
    void* dbase;
    void* func;
};
const void* _Unwind_Find_FDE(void* pc, struct dwarf_eh_bases* bases);
}

namespace allocscope {

enum class FrameRuleKind : uint8_t {
    kEmpty = 0,      // never returned; an all-zero word marks an unfilled cache slot
    kStep = 1,       // the fields below describe how to reach the caller
    kOutermost = 2,  // return address is DW_CFA_undefined: the thread's first frame
    kFallback = 3,   // no FDE, signal frame or a rule outside this model
};

// For kStep, with rsp/rbp the frame's registers right after the call:
//   cfa        = (flags & kCfaFromRbp ? rbp : rsp) + cfa_offset
//   caller rip = *(cfa - 8)
//   caller rsp = cfa
//   caller rbp = flags & kRbpSaved ? *(cfa + rbp_offset) : rbp
// Exactly 8 bytes without padding so a cache slot can publish it as one
// atomic word.
struct FrameRule {
    static constexpr uint8_t kCfaFromRbp = 1;
    static constexpr uint8_t kRbpSaved = 2;

    int32_t cfa_offset = 0;
    int16_t rbp_offset = 0;
    FrameRuleKind kind = FrameRuleKind::kEmpty;
    uint8_t flags = 0;
};
static_assert(sizeof(FrameRule) == 8);

// Interprets the FDE covering `return_address - 1` (found with libgcc's
// _Unwind_Find_FDE, which may take the loader lock). Never throws; anything
// it cannot express yields kFallback.
FrameRule compute_frame_rule(uintptr_t return_address) noexcept;

// Defined in unwind.cpp next to the cache and the walk.
// Forgets every cached rule, and the calling thread's memo of its last
// walk's rules. Only while no thread is inside capture_stack(): tests and
// benchmarks use it to measure the cold path.
void clear_frame_rule_cache() noexcept;
// capture_stack() calls answered by _Unwind_Backtrace instead of the cache.
uint64_t fallback_capture_count() noexcept;

}  // namespace allocscope
