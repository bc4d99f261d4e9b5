// The shape of every allocation and free hook, shared by the runtime hooks
// (hooks_runtime.cpp) and the driver hooks (hooks_driver.cpp): resolve the
// real function, guard, call it, record, return its result and
// out-parameters untouched. What differs between the two APIs is in `Hooks`:
//
//   Result                  the API's status type (cudaError_t, CUresult)
//   kSuccess, kNotFound     success, and the status when nothing is loaded
//   recording(guard)        whether this call is recorded
#pragma once

#include <cstdint>

#include "recorder.h"

namespace allocscope::hooks {

inline uint64_t as_int(const void* p) {
    return reinterpret_cast<uint64_t>(p);
}

// The address an allocation handed out: a pointer (runtime) or a device
// pointer (driver).
inline void* as_address(void* p) {
    return p;
}
inline void* as_address(unsigned long long v) {
    return reinterpret_cast<void*>(v);
}

// An allocation: `real(out, args...)`, then `describe(rc)` says what to
// record once the real call has returned (for the pitched allocations the
// size depends on it).
template <typename Hooks, typename Real, typename Describe, typename Out, typename... Args>
typename Hooks::Result forward_alloc(Real real, Describe describe, Out* out, Args... args) {
    if (!real) return Hooks::kNotFound;
    recorder::HookGuard guard;
    typename Hooks::Result rc = real(out, args...);
    if (Hooks::recording(guard)) {
        recorder::record_alloc(describe(rc),
                               rc == Hooks::kSuccess && out ? as_address(*out) : nullptr, rc);
    }
    return rc;
}

// A free of `address` (nullptr: forwarded unrecorded, it frees nothing) on
// `stream`: `real(args...)` between the two halves of the recorded free.
template <typename Hooks, typename Real, typename... Args>
typename Hooks::Result forward_free(Real real, Api api, void* address, const void* stream,
                                    Args... args) {
    if (!real) return Hooks::kNotFound;
    recorder::HookGuard guard;
    if (!Hooks::recording(guard) || address == nullptr) return real(args...);
    recorder::PendingFree pending;
    recorder::begin_free(pending, api, Level::segment, address, as_int(stream));
    typename Hooks::Result rc = real(args...);
    recorder::end_free(pending, rc);
    return rc;
}

}  // namespace allocscope::hooks
