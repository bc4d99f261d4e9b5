// The driver hooks' wrapping (hooks_driver.cpp) as the rest of the library
// reaches it: the dlsym trampoline (dlsym_trampoline.cpp) for the libcuda
// symbols whose lookups are wrapped, and the runtime's driver entry point
// lookups (hooks_runtime.cpp).
#pragma once

#pragma GCC visibility push(hidden)

namespace allocscope::driver {

// The exported libcuda names the driver hooks wrap, in the order of the
// wrapping table (hooks_driver.cpp, kEntries, checks it name for name).
// Constant-initialized: the trampoline reads it before anything else has
// run (see dlsym_trampoline.cpp).
inline constexpr const char* kWrappedSymbols[] = {
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemAllocManaged",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemRetainAllocationHandle",
    "cuMemImportFromShareableHandle",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
};

// Whether driver entry points are handed out wrapped (ALLOCSCOPE_DRIVER_HOOKS,
// ALLOCSCOPE_DISABLE).
bool wrapping_enabled() noexcept;

// The wrapper of `real`, the definition of exported name `symbol` (dlsym);
// `real` itself when that name is not wrapped.
void* wrap_symbol(const char* symbol, void* real);

// The wrapper of `real`, what cuGetProcAddress handed out for `base_name`
// (no _v2 or _ptsz suffix) at `cuda_version` with `flags`; `real` itself
// when that entry point, or that version of its ABI, is not wrapped.
void* wrap_entry(const char* base_name, int cuda_version, unsigned long long flags, void* real);

}  // namespace allocscope::driver

#pragma GCC visibility pop
