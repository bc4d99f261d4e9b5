// The recorder's shared internal state: the per-thread state, the
// process-wide State and the globals behind recorder.h, and the few helpers
// every part of the recorder uses. Only the recorder's own files include it
// (lifecycle, emit, tag_stack, annotations, module_map, live_plugins,
// writer_thread, check_scope, device_cache).
//
// Everything here is hidden: references from the other files of the library
// go straight to it (PC-relative, no GOT), as when it was file-local. The
// small helpers the hot path inlines are defined here, inline.
#pragma once

#include <limits.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "config.h"
#include "event_ring.h"
#include "plugin_host.h"
#include "recorder.h"
#include "replay.h"
#include "segment_owners.h"
#include "stack_table.h"
#include "string_table.h"
#include "trace_bound.h"
#include "trace_writer.h"

#pragma GCC visibility push(hidden)

namespace allocscope::recorder {

enum : int { kUninitialized = 0, kRecording = 1, kOff = 2 };

constexpr uint32_t kMaxTagDepth = 64;

struct TagEntry {
    uint32_t layer;
    uint32_t phase;
    // Keyed tags (allocscope_enter and friends); 0 / 0 / 0 for a plain push.
    uint32_t kind;
    uint64_t key;
    uint64_t generation;
    // The layer's interned text: the string table's strings never move, so
    // the owning thread reads it without the lock. nullptr for "".
    const std::string* layer_text;
};

// A string this thread interned, by the pointer it came in: a tag call
// whose text sits at the same address with the same content (checked with
// strcmp against the interned copy, which never changes or moves) takes
// its id from here, without the definitions lock and the table's hash.
struct InternedText {
    const char* ptr;
    const std::string* text;
    uint32_t id;
};
constexpr size_t kInternCacheSlots = 32;

// A stack this thread interned, by its 64-bit hash and depth: a capture
// whose frames hash to the same value takes the id from here instead of
// the process-wide table, whose slot and stored frames are two cache
// misses in a program that evicts them between captures. Two different
// stacks of one depth with one hash would share an id; with 64-bit hashes
// and n distinct stacks that has odds of about n^2 / 2^65 per process.
struct StackIdSlot {
    uint64_t hash;  // 0: empty (StackTable::hash never returns 0)
    uint32_t id;
    uint32_t depth;
};
constexpr size_t kStackIdSlots = 1024;  // 16 KiB per thread

// Trivially constructible so TLS needs no constructor or destructor calls.
struct ThreadState {
    bool in_hook;
    bool is_writer;
    uint32_t tid;
    uint32_t depth;  // pushes minus pops, including those beyond kMaxTagDepth
    int32_t device;  // cached current device, valid while device_context is current
    void* device_context;
    TagEntry tags[kMaxTagDepth];
    InternedText interned[kInternCacheSlots];
    StackIdSlot stack_ids[kStackIdSlots];
};
// Defined in emit.cpp. constinit: no dynamic initialization, so other files
// reach it directly, without a TLS wrapper call.
extern constinit thread_local ThreadState t_thread;

struct Definition {
    RecordType type;
    uint32_t id;
    std::string text;
    std::vector<uint64_t> frames;
    ParamRecord param;
};

struct ModuleRange {
    uint64_t start;
    uint64_t end;
};

// Bounded recording, the writer thread's (trace_bound.cpp; core/trace_bound.h).
struct TraceBound {
    bool on = false;
    bool failed = false;     // a compaction failed: the trace grows unbounded from then
    uint32_t mark_text = 0;  // kBoundedMark's string id
    bool head_sealed = false;
    TraceCheckpoint head;              // the end of the kept first steps
    std::deque<TraceCheckpoint> cuts;  // later checkpoints, oldest first
    uint64_t file_carried = 0;         // carried events in the file now
    uint64_t file_overhead = 0;        // bytes of definitions and carried events in the file now
    uint64_t dropped_events = 0;       // events dropped so far
    uint64_t dropped_bytes = 0;
    uint64_t last_seq = 0;  // the last event written
    uint64_t last_t_ns = 0;
    uint64_t last_step = 0;
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> open;  // tid -> scopes
    SegmentOwners owners;  // which live segments have held a block
};

struct State {
    Config config;
    uint64_t start_mono_ns = 0;
    pid_t owner_pid = 0;

    EventRing ring;
    // The one live set: the writer thread's only (track_live). The live
    // plugins' host is a view of it (PluginHost::view_live); live_changes
    // holds what it reported for the event being written, for that host.
    Replay live;
    std::vector<LiveChange> live_changes;
    StackTable stacks;
    std::atomic<uint64_t> step{0};
    std::atomic<uint64_t> events_dropped{0};
    // ALLOCSCOPE_LOG=debug only: what stack capture costs the program's
    // threads, reported in one line at exit (see capture_stack_id).
    bool cost_stats = false;
    std::atomic<uint64_t> stacks_captured{0};
    std::atomic<uint64_t> stack_ns{0};
    std::atomic<uint64_t> walk_ns{0};  // of stack_ns: the walk, the rest is interning
    std::atomic<uint64_t> python_frames{0};
    uint64_t self_start = 0;  // text of liballocscope.so, see capture_stack_id
    uint64_t self_end = 0;

    // Definitions (strings, stacks, params) wait here until the writer puts
    // them into the trace ahead of the events that use them.
    std::mutex defs_mutex;
    StringTable strings;
    uint32_t params = 0;
    // (layer, name) string ids -> the latest param index registered for it,
    // for allocscope_derived.
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> param_index;
    std::vector<Definition> pending_defs;

    // Owned by the writer thread once it runs.
    TraceWriter writer;
    std::vector<ModuleRange> module_ranges;
    std::set<std::pair<uint64_t, std::string>> modules_written;
    pthread_t writer_thread{};
    std::atomic<bool> stop{false};
    std::atomic<bool> trace_done{false};  // footer written
    std::atomic<bool> writer_done{false};

    // Live plugins (writer thread only). The writer keeps its own copy of
    // the definitions it writes, so events are resolved exactly as a reader
    // of the trace resolves them.
    std::unique_ptr<PluginHost> plugins;
    std::vector<std::string> written_strings{std::string()};  // index = string id
    std::vector<ParamRecord> written_params;                  // index = param index
    // Scoped checks (allocscope_check_begin/end), fed by the writer too.
    CheckSet checks;
    // ALLOCSCOPE_MAX_TRACE_SIZE: the writer's checkpoints and compactions
    // (trace_bound.cpp).
    TraceBound bound;
};

// lifecycle.cpp
extern std::atomic<int> g_state;
// Never destroyed (it lives in static storage constructed in place):
// hooks may run during static destruction of other objects.
extern State* g;
// Set when the library is loaded (see note_how_loaded): its absolute path,
// and the CUDA library that was loaded before it, if any.
extern char g_self_path[PATH_MAX];
extern char g_loaded_after[256];

// emit.cpp
extern std::atomic<OuterFrames> g_outer_frames;    // set_outer_frames
extern std::atomic<ScopeDerived> g_scope_derived;  // set_scope_listener
extern std::atomic<AddressFreed> g_address_freed;  // set_scope_listener

inline uint64_t mono_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline uint64_t wall_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline uint32_t thread_id() noexcept {
    if (t_thread.tid == 0) t_thread.tid = static_cast<uint32_t>(syscall(SYS_gettid));
    return t_thread.tid;
}

inline TagEntry current_tag() noexcept {
    uint32_t d = t_thread.depth;
    if (d == 0) return {};
    return t_thread.tags[(d < kMaxTagDepth ? d : kMaxTagDepth) - 1];
}

// --- trace_bound.cpp ----------------------------------------------------------

// Writer thread, when ALLOCSCOPE_MAX_TRACE_SIZE is set. bound_start before
// the first drain; bound_event for each event before it is written (a step
// change takes a checkpoint there); bound_live_change for each change the
// writer's Replay reports (the segments that held a block, SegmentOwners);
// bound_after_flush after each flush (seals the head, takes checkpoints in
// long steps, compacts past the bound).
void bound_start();
void bound_event(const Event& e);
void bound_live_change(const LiveChange& change) noexcept;
void bound_written(const Event& e);
void bound_after_flush();

// --- lifecycle.cpp ------------------------------------------------------------

// One line on stderr when the configured log level is at least `at_least`.
void log_line(LogLevel at_least, const std::string& line);

// Brings the recorder up on first use; true while it records.
bool ensure_started() noexcept;

// --- emit.cpp -----------------------------------------------------------------

// Interns `text` ("" and NULL: 0), queueing a new string's definition for the
// writer; intern_locked with defs_mutex held.
uint32_t intern_locked(const char* text);
uint32_t intern(const char* text);

// Reserves a ring slot and fills the fields every event shares (every field
// is written: slots are reused); nullptr when the event is dropped.
EventRing::Slot* begin_event(EventKind kind) noexcept;

// An event of the C API with only a tag, aux and flags of its own.
inline void emit_simple(EventKind kind, uint32_t layer, uint32_t phase, uint32_t aux,
                        uint32_t flags) noexcept {
    EventRing::Slot* slot = begin_event(kind);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = layer;
    e.phase = phase;
    e.aux = aux;
    e.flags = flags;
    e.api = Api::c_api;
    EventRing::publish(slot);
}

// The hooks' guard (HookGuard), inline: marks the thread as inside
// allocscope and returns whether it was not already (`outer`).
inline bool enter_guard() noexcept {
    const bool outer = !t_thread.in_hook;
    t_thread.in_hook = true;
    return outer;
}
// Whether a call so guarded is recorded.
inline bool guard_recording(bool outer) noexcept {
    return outer && g_state.load(std::memory_order_relaxed) != kOff;
}
inline void leave_guard(bool outer) noexcept {
    if (outer) t_thread.in_hook = false;
}

// C API calls are not hooks, but CUDA calls they trigger must not be
// recorded as the user's either; they share the hooks' guard (as HookGuard,
// but inline in the recorder's files).
// --- annotations.cpp: frame scopes (allocscope_python_frame_scope) ------------------

// What allocations whose innermost Python frame is one line of generated
// code are: made by `module` of the enclosing layer, and (when `param` is
// set) holding bytes computed from parameter `param` of `param_module`.
struct FrameScope {
    std::string module;
    std::string param_module;
    std::string param;
    std::string how;
    // (enclosing layer id + 1) << 32 | the scoped layer's id, per enclosing
    // layer id modulo kLayerCache: one generated file serves every block
    // compiled alike, so a line's allocations alternate between layers.
    static constexpr size_t kLayerCache = 16;
    mutable std::atomic<uint64_t> layer_cache[kLayerCache]{};
};

// Whether any scope was registered: record_alloc looks only then.
extern std::atomic<bool> g_any_frame_scope;
// The scope of Python frame `frame` (a pseudo-address), or null; lock-free.
const FrameScope* frame_scope(uint64_t frame) noexcept;
// Sets `e`'s layer (the calling thread's tag) to the scope's module of it.
void apply_frame_scope(const FrameScope& scope, Event& e) noexcept;
// Declares the allocation at `address` derived, when the scope says so.
void frame_scope_derived(const FrameScope& scope, uint64_t address) noexcept;

class ApiScope {
  public:
    ApiScope() noexcept : outer_(enter_guard()), recording_(guard_recording(outer_)) {}
    ~ApiScope() { leave_guard(outer_); }
    ApiScope(const ApiScope&) = delete;
    ApiScope& operator=(const ApiScope&) = delete;

    // HookGuard::recording().
    bool recording() const noexcept { return recording_; }
    // Recording, and the recorder is up.
    bool active() const noexcept { return recording_ && ensure_started(); }

  private:
    bool outer_;
    bool recording_;
};

// --- module_map.cpp (writer thread, but find_own_module) -------------------------

// Writes the modules loaded so far and not yet written to the trace.
// Held around every call of allocscope's that takes the dynamic loader's
// locks (dl_iterate_phdr, dlopen, dlsym) outside the program's own calls:
// fork() waits until none is under way, and none starts until the fork is
// done (pthread_atfork), so a child never inherits a loader lock that
// allocscope's writer thread held at the fork, which would hang the
// child's next dlopen.
struct LoaderGuard {
    LoaderGuard() noexcept;
    ~LoaderGuard();
    LoaderGuard(const LoaderGuard&) = delete;
    LoaderGuard& operator=(const LoaderGuard&) = delete;
};

void scan_modules();
// Scans again when a frame lies outside every module known.
void cover_modules(const std::vector<uint64_t>& frames);
// Sets g->self_start / self_end to the text of liballocscope.so.
void find_own_module();

// --- live_plugins.cpp (writer thread, but plugin_dir) ----------------------------

// Keeps a written definition for the plugins and checks.
void keep_definition(const Definition& d);
// Where plugin names are looked up ("" when no directory is found).
std::string plugin_dir();
// Starts the live plugins' host, a view of g->live.
void start_plugins();
// For each event, around the writer's apply of it to g->live (a viewing
// host's order, PluginHost::view_live): before_live_plugins(e), then the
// apply, collecting g->live_changes, then feed_plugins(e, tracked), where
// `tracked` says the apply and its changes are complete (else out of
// memory: the plugins stop, their live set would be wrong).
void before_live_plugins(const Event& e);
void feed_plugins(const Event& e, bool tracked);
void checkpoint_findings();
void finish_plugins();

// --- writer_thread.cpp ------------------------------------------------------------

// Opens the trace file under its unique name.
bool open_trace(std::string& error);
// Starts the writer thread (with every signal blocked).
bool start_writer();

}  // namespace allocscope::recorder

#pragma GCC visibility pop
