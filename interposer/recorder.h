// The process-global recording state of liballocscope.so and the small API
// the hooks use. Everything here is hidden; only hooks and the public C API
// are exported. Implemented by the recorder's files, one concern each
// (recorder_internal.h names them).
//
// Lifecycle: uninitialized -> (first hook or API call) -> recording | off.
// `off` covers ALLOCSCOPE_DISABLE=1, an output that could not be created,
// a forked child, and the time after the final flush at exit or on SIGTERM.
// In `off` every hook forwards to the real function and records nothing.
//
// SIGTERM: when recording starts and the program leaves SIGTERM at SIG_DFL
// (no handler of its own, not ignored; ALLOCSCOPE_SIGTERM=0: never), a
// handler finishes the trace first: it only flips atomics (recording off,
// the writer's stop flag) and waits, with exit's time limits, for the writer
// thread, which drains, writes the footer and the plugins' findings as at
// exit; then it restores SIG_DFL and re-raises, so the process still dies by
// SIGTERM. A program's own handler, installed before or after, is left
// alone. If the interrupted thread holds a lock the writer needs, the wait
// times out and the trace is cut, as without the handler. A forked child
// gets SIG_DFL back. docs/DESIGN.md (SIGTERM) has the reasons.
//
// Fork policy: a child created by fork() without exec stops recording (its
// copy of the state is never touched again, so locks held by threads that do
// not exist in the child cannot deadlock it). A child that execs with the
// preload still set starts afresh and records into its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <string>

#include "checks.h"
#include "config.h"
#include "event.h"

namespace allocscope::recorder {

// Fronts every hook. Marks the thread as inside allocscope for its lifetime,
// so CUDA calls made underneath (a runtime function calling another hooked
// one, or allocscope's own work) are forwarded without being recorded.
// Nests: the previous state is restored on destruction.
class HookGuard {
  public:
    HookGuard() noexcept;
    ~HookGuard();
    HookGuard(const HookGuard&) = delete;
    HookGuard& operator=(const HookGuard&) = delete;

    // True when this call should be recorded: not nested inside another hook
    // and the recorder is (or could be brought) up.
    bool recording() const noexcept { return recording_; }

  private:
    bool outer_;
    bool recording_;
};

struct AllocInfo {
    Api api;
    Level level;
    MemoryKind memory;
    uint64_t size;
    uint64_t stream;
    int32_t device;
    uint32_t flags = 0;  // EventFlag bits of the alloc event (kFlagGraphPool)
    uint32_t aux = 0;    // its aux (kFlagGraphPool: the pool's id)
};

// A successful allocation at `address`, or a failed one (`result` != 0 or
// a null address: record_oom). `outer` frames, at most
// kMaxOuterFrames, are appended to the captured native stack (Python frames
// from python_frame()); without any (a null `outer`), those of the
// set_outer_frames provider, if one is registered.
inline constexpr size_t kMaxOuterFrames = 32;
void record_alloc(const AllocInfo& info, void* address, int result,
                  std::span<const uint64_t> outer = {}) noexcept;

// A request that failed: a runtime or driver call that returned `result`
// (record_alloc sends those here), or a caching allocator's verdict
// (allocscope_block_oom, level block). Recorded as an oom event with the
// requested size, the thread's tag, step and stack (the provider's Python
// frames appended), and `device_free` in the event's address field (the
// device's free bytes as the allocator measured them; 0 when not known).
void record_oom(const AllocInfo& info, int result, uint64_t device_free) noexcept;

// The pseudo-address of a Python frame (core/event.h, python_frame_address):
// its text is interned once. 0 when not recording. Callable inside a hook.
uint64_t python_frame(const char* function, const char* file, int line) noexcept;
// Allocations whose innermost Python frame is (file, line): their layer is
// the module's of the enclosing one, and when `param` is set they are
// declared derived from it (allocscope_python_frame_scope).
void python_frame_scope(const char* file, int line, const char* module, const char* param_module,
                        const char* param, const char* how) noexcept;
// Frames at (file, line) named by python_frame() from now on as
// `function (as_file:as_line)` (allocscope_python_frame_alias).
void python_frame_alias(const char* file, int line, const char* function, const char* as_file,
                        int as_line) noexcept;

// A function that writes the calling thread's outer (Python) frames, at most
// `max`, innermost first, and returns how many; called by record_alloc,
// inside the hook, for allocations recorded without frames of their own.
// It must not call CUDA, block, or throw. nullptr unregisters.
using OuterFrames = size_t (*)(uint64_t* out, size_t max);
void set_outer_frames(OuterFrames provider) noexcept;

// Who else follows what frame scopes declare (allocscope_set_scope_listener):
// `derived` after each allocation a frame scope declared derived, with the
// declaration's arguments; `freed` before every free of an address (any
// API, any level), while registered. Both are called inside the hooks, so
// they must not call CUDA, block on anything a hook can hold, or throw.
// nullptr unregisters either.
using ScopeDerived = void (*)(const void* address, const char* layer, const char* param,
                              const char* how);
using AddressFreed = void (*)(const void* address);
void set_scope_listener(ScopeDerived derived, AddressFreed freed) noexcept;

// A free is recorded in two halves around the real call so its seq precedes
// any later allocation that reuses the address.
struct PendingFree {
    void* slot = nullptr;  // reserved ring slot, nullptr when not recording
};
void begin_free(PendingFree& pending, Api api, Level level, void* address,
                uint64_t stream) noexcept;
// A free of everything that starts in [address, address + size) (cuMemUnmap):
// one event (kFlagRange), which the writer's replay splits into the frees of
// the mappings the range covers (core/replay.h).
void begin_range_free(PendingFree& pending, Api api, Level level, void* address,
                      uint64_t size) noexcept;
void end_free(PendingFree& pending, int result) noexcept;

// Public C API backends. push_tag returns whether the tag went onto the
// thread's stack (false when not recording or inside a hook), so the NVTX
// side pops only what it pushed.
bool push_tag(const char* layer, const char* phase) noexcept;
void pop_tag() noexcept;
// Keyed tags (allocscope_enter, allocscope_leave, allocscope_leave_kind,
// allocscope_enter_nested, allocscope_keyed_depth, allocscope_keyed_kind_depth
// in allocscope.h). `layer` of leave_tag, when not null, gets the left
// entry's layer: interned text that lives as long as the process.
int enter_tag(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
              const char* phase) noexcept;
int64_t leave_tag(uint64_t key, uint32_t kind, const char** layer) noexcept;
void leave_kind(uint32_t kind, uint64_t older_than) noexcept;
int enter_nested(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
                 const char* phase) noexcept;
// Keyed entries on the calling thread: all of them (kind 0), or of `kind`.
uint32_t keyed_depth(uint32_t kind = 0) noexcept;
// The layer of the calling thread's innermost tag ("" when none).
std::string current_layer();
void set_step(uint64_t step) noexcept;
// The step counter's value (0 before the first allocscope_step).
uint64_t current_step() noexcept;
void register_param(const char* layer, const char* name, uint64_t numel, const char* dtype,
                    uint64_t sharded_numel) noexcept;
void mark(const char* text) noexcept;
// A mark ALLOCSCOPE_COUNTERS_MARK carrying an allocator's counters
// (allocscope_allocator_counters).
void allocator_counters(int device, uint64_t allocated, uint64_t reserved,
                        uint64_t device_used) noexcept;
// A mark ALLOCSCOPE_OOM_PARAM_MARK naming the parameter (or the first of
// `count`) the thread was processing when it ran out of memory
// (allocscope_oom_parameter).
void oom_parameter(const char* layer, const char* name, uint64_t count) noexcept;
// allocscope_derived: the allocation at `ptr` is derived from parameter
// (layer, name); `how` may be NULL.
void derived(const void* ptr, const char* layer, const char* name, const char* how) noexcept;
// The phase of the calling thread's innermost tag ("" when untagged or not
// recording): NVTX sub-phases are made from it.
std::string current_phase();
// allocscope_check_begin / _end (interposer/checks.h).
uint64_t check_begin(const char* plugins, const char* options, std::string& error) noexcept;
bool check_end(uint64_t id, CheckSet::Outcome& out) noexcept;
// The stack of the finding's first evidence that has one, as text, one frame
// per line ("" when none or on any failure); symbolizes in this process
// (check_stacks.cpp), so only for allocscope_check_end.
std::string finding_stack(const Finding& finding) noexcept;

// The ALLOCSCOPE_* configuration, parsed from the environment once, on first
// use: when the recorder starts, or before by the driver hooks, which need
// ALLOCSCOPE_DRIVER_HOOKS whether or not anything is recorded. nullptr when
// it could not be parsed (out of memory); a later call tries again.
const Config* config() noexcept;

// Device of the calling thread as the runtime reports it, -1 if unknown.
int32_t current_device() noexcept;

}  // namespace allocscope::recorder
