/* allocscope public C API.
 *
 * These functions are exported by liballocscope.so. A program that wants to
 * run unchanged when the interposer is not loaded should not link against
 * them directly but use <allocscope/allocscope_dl.h>, which resolves them at
 * run time and turns every call into a no-op when they are absent.
 *
 * Tags. Every recorded allocation carries the tag (rank, step, layer, phase)
 * that is current on the calling thread. The rank comes from the environment
 * (RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID), the step is process-wide, and
 * layer/phase form a per-thread stack: a new thread starts untagged.
 * Well-known phases are "forward", "backward", "optimizer" and "idle";
 * sub-phases are written with a slash ("forward/all_gather").
 *
 * All functions are thread-safe, never fail and never throw. Strings are
 * copied; the caller keeps ownership.
 */
#ifndef ALLOCSCOPE_ALLOCSCOPE_H
#define ALLOCSCOPE_ALLOCSCOPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ALLOCSCOPE_API_VERSION 1

/* Enters (layer, phase) on the calling thread. A NULL layer or phase keeps
 * the value of the enclosing tag, so allocscope_push(NULL, "backward") changes
 * only the phase. Depth is bounded (64); deeper pushes are counted and
 * matched by their pops but do not change the tag. */
void allocscope_push(const char* layer, const char* phase);

/* Leaves the innermost tag of the calling thread. A pop without a push is
 * ignored. */
void allocscope_pop(void);

/* Keyed tags, for tags entered and left by hooks that may not come in
 * pairs (a hook skipped by an exception, a backward that never reaches a
 * module): each entry remembers a caller-chosen `key` (e.g. an object's
 * address), a `kind` (> 0; plain pushes are kind 0) and a `generation`, so a
 * leave finds its own entry however many others are above it. They share
 * the thread's stack and its depth bound with allocscope_push/pop; an entry
 * beyond depth 64 is not found again by its leave.
 *
 * allocscope_enter: like allocscope_push (NULL keeps the enclosing value,
 *   "" is none), the entry keyed. Returns the number of keyed entries on the
 *   thread before it (0: the thread was in no keyed tag), -1 when not
 *   recording.
 * allocscope_leave: pops down to and including the innermost entry
 *   (key, kind); the tags above it go with it. Returns its generation (and,
 *   when `layer` is not NULL, its layer, text that lives as long as the
 *   process) or -1 when there is none: then nothing is popped.
 * allocscope_leave_kind: pops down to and including the outermost entry of
 *   `kind` whose generation is below `older_than` (UINT64_MAX: any).
 * allocscope_enter_nested: for scopes named like nested modules ("a.b" is
 *   inside "a", everything is inside "") whose ends are never signalled, such
 *   as a module's backward: pops the entries of `kind` from an earlier
 *   generation; returns 0 if (key, kind) is entered already; otherwise the
 *   outermost entry of `kind` whose layer does not enclose `layer` is over:
 *   it and everything above it are popped, `layer` is entered, and the popped
 *   entries of `kind` inside `layer` are entered again on top of it in their
 *   order. Returns 1 when entered, -1 when not recording.
 * allocscope_keyed_depth: the number of keyed entries on the calling thread.
 * allocscope_keyed_kind_depth: the number of keyed entries of `kind` on the
 *   calling thread (0 for kind 0): e.g. whether the thread is inside a
 *   backward its hooks entered.
 * allocscope_current_layer: copies the calling thread's innermost layer
 *   ("" when none) into out (NUL-terminated, cut to size) and returns its
 *   full length. */
int allocscope_enter(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
                     const char* phase);
int64_t allocscope_leave(uint64_t key, uint32_t kind, const char** layer);
void allocscope_leave_kind(uint32_t kind, uint64_t older_than);
int allocscope_enter_nested(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
                            const char* phase);
int allocscope_keyed_depth(void);
int allocscope_keyed_kind_depth(uint32_t kind);
size_t allocscope_current_layer(char* out, size_t size);

/* Sets the process-wide training step. */
void allocscope_step(uint64_t step);
/* The step counter's value (0 before the first allocscope_step): what a
 * component divides its costs by for ALLOCSCOPE_LOG=debug's per-step figures. */
uint64_t allocscope_current_step(void);

/* Declares a parameter of `layer`: `numel` elements when unsharded,
 * `sharded_numel` on this rank (equal to numel when not sharded), stored as
 * `dtype` ("bf16", "fp32", "fp8_e4m3", ...). Detectors use these sizes to
 * recognise weight-derived allocations. */
void allocscope_register_param(const char* layer, const char* name, uint64_t numel,
                               const char* dtype, uint64_t sharded_numel);

/* Records a free-form note in the trace at this point. */
void allocscope_mark(const char* text);

/* Provenance: declares that the allocation starting at `ptr` (live, made
 * by the program or its caching allocator) holds bytes computed from
 * parameter `name` of module `layer` (registered with
 * allocscope_register_param; one never registered is registered here
 * without sizes): a quantized copy, a transpose, a scale. `how` (may be
 * NULL) says how, e.g. "cast to fp8_e4m3 (row-wise)" or
 * "layers.3.fc1.weight -> abs -> amax -> _to_copy". The weight detectors
 * report an allocation declared so as `proven` evidence, whatever its tag
 * and size; without a declaration they can only match sizes, which is
 * never enough for an error. Call it after the allocation, once per
 * allocation; a later allocation at the same address needs its own. */
void allocscope_derived(const void* ptr, const char* layer, const char* name, const char* how);

/* Whether provenance runs, said with allocscope_mark: a program (or the
 * PyTorch shim) marks ALLOCSCOPE_PROVENANCE_ON when it declares the
 * provenance of its weight-derived allocations, or ALLOCSCOPE_PROVENANCE_OFF
 * "<why>" when it cannot; the last such mark of a stream counts. The
 * findings file keeps it per rank, and when provenance did not run the
 * run's summary says what the weight detectors could only match by size. */
#define ALLOCSCOPE_PROVENANCE_MARK "allocscope: provenance "
#define ALLOCSCOPE_PROVENANCE_ON ALLOCSCOPE_PROVENANCE_MARK "on"
#define ALLOCSCOPE_PROVENANCE_OFF ALLOCSCOPE_PROVENANCE_MARK "off: "
/* Provenance that runs in some steps only (the PyTorch bridge's op observer,
 * ALLOCSCOPE_PROVENANCE_STEPS) marks where it stops and starts again; the
 * step of each mark is the first it did not (did) observe. While paused the
 * weight detectors match no sizes, and the findings file's provenance names
 * the steps observed ("on in steps 0-3, 100-101 of 0-240"). */
#define ALLOCSCOPE_PROVENANCE_PAUSED ALLOCSCOPE_PROVENANCE_MARK "paused"
#define ALLOCSCOPE_PROVENANCE_RESUMED ALLOCSCOPE_PROVENANCE_MARK "resumed"

/* NVTX. Under `allocscope run --nvtx` liballocscope.so is also the process's
 * NVTX injection library (NVTX_INJECTION64_PATH), and NVTX ranges and marks
 * with these names tag like the calls above (docs/DESIGN.md, "Tags", has
 * every rule, FSDP2's own range names included):
 *   range  ALLOCSCOPE_NVTX_PREFIX "<layer>/<phase>"  push/pop; the layer ends
 *          at the first '/', an empty layer or phase keeps the enclosing one
 *          (NULL in allocscope_push): "allocscope:layers.3/forward",
 *          "allocscope:/backward/dgrad", "allocscope:layers.3.mlp/"
 *   mark   ALLOCSCOPE_NVTX_STEP "<n>"                 allocscope_step(n)
 *   mark   ALLOCSCOPE_NVTX_PREFIX "<text>"            allocscope_mark(text) */
#define ALLOCSCOPE_NVTX_PREFIX "allocscope:"
#define ALLOCSCOPE_NVTX_STEP "allocscope:step="

/* Caching-allocator hook ABI: a caching allocator reports the blocks it hands
 * out and takes back, so per-tensor memory is visible even when the runtime
 * API only sees whole segments. Recorded at level "block". `stream` is the
 * cudaStream_t the block is associated with (NULL = legacy default). */
void allocscope_block_alloc(void* ptr, size_t size, int device, void* stream);
void allocscope_block_free(void* ptr);

/* A block of a CUDA graph's private memory pool (the allocator's pool of a
 * capture, `pool` its id): recorded as allocscope_block_alloc records a
 * block, marked as the pool's. A graph holds such memory for as long as it
 * can be replayed, by design: reports count it apart ("CUDA graph pools")
 * and the detection plugins never see it. Freed with allocscope_block_free. */
void allocscope_block_alloc_graph_pool(void* ptr, size_t size, int device, void* stream,
                                       uint64_t pool);

/* A block of a memory pool other than the allocator's default, as a caching
 * allocator names its pools (PyTorch: MempoolId_t, the pair (first,
 * second)). Recorded as a CUDA graph pool's block (as
 * allocscope_block_alloc_graph_pool) when the pool is a graph's: `first`
 * != 0 (the pool a capture made for itself), or (0, second) declared with
 * allocscope_graph_pool; else as an ordinary block (a pool the program made
 * for its own tensors, torch.cuda.MemPool). allocscope_graph_pool declares
 * a pool that graphs capture into (torch.cuda.graph_pool_handle(), which
 * inductor's CUDA graph trees use, or a pool passed to a capture), before
 * its blocks are allocated; the first 256 pools declared are kept. */
void allocscope_graph_pool(uint64_t first, uint64_t second);
void allocscope_block_alloc_in_pool(void* ptr, size_t size, int device, void* stream,
                                    uint64_t first, uint64_t second);

/* A request the caching allocator could not serve, after freeing what it had
 * cached and retrying: the program sees an out-of-memory error for it.
 * `size` is the request as the allocator rounded it, `device_free` the
 * device's free memory as the allocator measured it when it gave up (0:
 * not known). Recorded as an `oom` event at level "block" with the calling
 * thread's tag, step and stack (Python frames included, as for blocks);
 * reports open with it. Failed runtime and driver calls (a cudaMalloc that
 * returns cudaErrorMemoryAllocation) are recorded by the interposer itself;
 * the allocator's own verdict is what tells a retried failure from the one
 * that ended in an error. */
void allocscope_block_oom(size_t size, int device, void* stream, uint64_t device_free);

/* The caching allocator's own counters, for the report's self-check: at a
 * step boundary a bridge (the PyTorch shim, the harness) passes what its
 * allocator counts for `device` (allocated: the blocks in use,
 * torch.cuda.memory_allocated; reserved: the segments it holds,
 * torch.cuda.memory_reserved) and the device memory in use by the
 * driver's count (cudaMemGetInfo's total - free; 0 when not known).
 * Recorded as a mark (ALLOCSCOPE_COUNTERS_MARK) whose address, size and
 * stream hold allocated, reserved and device_used. The report sets its own
 * live block and segment bytes against them at each such mark, and the
 * driver's count against what the allocator and the hooks explain. */
#define ALLOCSCOPE_COUNTERS_MARK "allocscope: allocator counters"
void allocscope_allocator_counters(int device, uint64_t allocated, uint64_t reserved,
                                   uint64_t device_used);

/* The parameter a program was working on when it ran out of memory, where
 * the failing request's tag cannot say (an optimizer's step goes through
 * every parameter between module hooks): `layer` and `name` as
 * allocscope_register_param names it ("layers.3.fc1", "weight"). `count`
 * > 1: it was the first of `count` parameters processed together (a
 * foreach optimizer's lists). Call it on the thread that ran out, after the
 * failure was recorded (the allocscope.torch shim does, from the
 * OutOfMemoryError it sees). Recorded as a mark (ALLOCSCOPE_OOM_PARAM_MARK)
 * whose address is the parameter's index in the param table (registered
 * here without sizes where it was not) and whose size is `count`; the
 * report names it in that thread's last out-of-memory moment of the step. */
#define ALLOCSCOPE_OOM_PARAM_MARK "allocscope: out of memory processing a parameter"
void allocscope_oom_parameter(const char* layer, const char* name, uint64_t count);

/* Python frames for block allocations (a bridge into a Python program's
 * caching allocator, e.g. tools/torch_bridge). allocscope_python_frame
 * returns a pseudo-address naming the frame (0 when not recording): call it
 * once per (code object, line) and keep the result.
 * allocscope_block_alloc_frames records a block like allocscope_block_alloc,
 * its captured native stack followed by `outer_count` (at most 32) such
 * frames, innermost first. Reports print them as "function (file:line)". */
uint64_t allocscope_python_frame(const char* function, const char* file, int line);
void allocscope_block_alloc_frames(void* ptr, size_t size, int device, void* stream,
                                   const uint64_t* outer_frames, size_t outer_count);

/* Generated code (torch.compile's inductor writes a Python file per graph)
 * named as the source it was generated from: from now on a frame at
 * (`file`, `line`) is named `function (as_file:as_line)` wherever
 * allocscope_python_frame names it, so that stacks show the user's line
 * instead of the generated one. Register before the line first runs
 * (callers keep the addresses allocscope_python_frame returned). */
void allocscope_python_frame_alias(const char* file, int line, const char* function,
                                   const char* as_file, int as_line);

/* What generated code allocates, per line: an allocation whose innermost
 * Python frame is (`file`, `line`) is tagged with layer
 * "<enclosing layer>.<module>" (`module` alone outside any layer; NULL or
 * "" keeps the enclosing layer), and when `param` is not NULL it is
 * declared derived (as allocscope_derived does) from parameter `param` of
 * module "<enclosing layer>.<param_module>", `how` saying how. This is how
 * allocscope.torch attributes the buffers of torch.compile'd graphs, from
 * each buffer's FX node (its module and the parameters it was computed
 * from). Needs Python frames (ALLOCSCOPE_PYTHON_STACKS, on by default).
 * Register before the line first runs. */
void allocscope_python_frame_scope(const char* file, int line, const char* module,
                                   const char* param_module, const char* param, const char* how);

/* The same frames for every other allocation: `provider` writes the calling
 * thread's Python frames (allocscope_python_frame addresses, at most `max`,
 * innermost first) and returns how many. The interposer calls it, inside its
 * hook, for each allocation it records without frames of its own (runtime
 * and driver calls: caching-allocator segments, cudaMallocAsync tensors,
 * library workspaces), and appends them to the native stack. It must not
 * call CUDA, block or throw; allocscope_python_frame may be called from it.
 * NULL unregisters. */
void allocscope_set_outer_frames(size_t (*provider)(uint64_t* out, size_t max));

/* A listener of what frame scopes declare: `derived` is called after each
 * allocation that allocscope_python_frame_scope declared derived, with the
 * declaration's address, layer, parameter and how; `freed` before every
 * free of an address the interposer records (runtime, driver and caching
 * allocator alike). The PyTorch bridge's op observer uses it to follow a
 * compiled graph's weight copy into the eager code that reads it (a
 * backward pass that transposes a saved FP8 weight). Both run inside the
 * allocation hooks: they must not call CUDA, block on a lock that an
 * allocation can hold, or throw. NULL unregisters either. */
void allocscope_set_scope_listener(void (*derived)(const void* address, const char* layer,
                                                   const char* param, const char* how),
                                   void (*freed)(const void* address));

/* Configuration: the value of environment variable `name` (an
 * ALLOCSCOPE_* variable of docs/ENVIRONMENT.md) as liballocscope.so parsed
 * it, once, when first used: its default when unset or invalid (the
 * interposer warns once about an invalid value). Components that run inside
 * the traced process (the PyTorch bridge, the Python package) ask here
 * instead of reading the environment, so that every variable has one parser
 * and one set of accepted spellings.
 *
 * The text is canonical: switches "1" or "0" (whatever of 1/true/yes,
 * 0/false/no was written), numbers in decimal (ALLOCSCOPE_MAX_TRACE_SIZE in
 * bytes), ALLOCSCOPE_LOG "quiet", "info" or "debug", lists comma-separated
 * (ALLOCSCOPE_PLUGINS "none" when off), ALLOCSCOPE_PROVENANCE_STEPS "all" or
 * "first=F,every=E,window=W", paths as given ("" when unset and found
 * elsewhere). It is copied into `out` (NUL-terminated, cut to `size`; `out`
 * may be NULL when `size` is 0). Returns the text's full length, or -1 when
 * `name` is not such a variable (then `out` holds ""). Variables may be
 * added in later versions, never removed or given another text for the same
 * meaning. */
int64_t allocscope_config_get(const char* name, char* out, size_t size);

/* Checks: detection plugins (plugin_v2.h) run on a stretch of this
 * process's own allocation events, for a program's test suite to assert on
 * (include/allocscope/doctest.h wraps them for doctest).
 *
 * allocscope_check_begin starts a check: the plugins of `plugins` (a comma
 * list of names or paths, as ALLOCSCOPE_PLUGINS; NULL or "" for every
 * plugin of the plugin directory) get instances of their own that see the
 * events recorded from this call until allocscope_check_end, whatever the
 * run's live plugins are. Parameters registered before the call are
 * registered with them too. `options` is a comma list of
 * "<plugin>.<key>=<value>" (NULL: none; the run's ALLOCSCOPE_PLUGIN_OPTIONS
 * do not apply). The plugins load and run on allocscope's own thread; this
 * call waits until they are loaded (milliseconds). Returns the check's id
 * (> 0), or 0 with the reason in `error` (NUL-terminated, cut to
 * error_size; may be NULL): recording is off, a plugin failed to load, an
 * option is malformed or names no loaded plugin. Checks may overlap; events
 * that other threads record while begin or end runs may or may not count. */
uint64_t allocscope_check_begin(const char* plugins, const char* options, char* error,
                                size_t error_size);

typedef struct allocscope_check_finding {
    const char* plugin;
    uint32_t severity; /* 0 info, 1 warning, 2 error (allocscope_severity_v2) */
    int32_t rank;      /* -1: no rank */
    const char* layer; /* "" when not attributed to a layer */
    const char* phase;
    uint64_t bytes;
    uint64_t count;
    const char* summary;
    /* The stack of the finding's first evidence allocation that has one,
     * one frame per line ("" when none), innermost first, trimmed as the
     * text report trims: allocscope's and the allocator's frames on top are
     * dropped, at most about 12 frames are kept (a Python program's own
     * Python frames when there are more), the rest counted in a last line
     * "... N more frames". Native frames read "function (module)" (dladdr:
     * exported and dynamic symbols only, no file:line) or
     * "module+0xoffset"; Python frames "qualname (file.py:line)". */
    const char* stack;
} allocscope_check_finding;

/* Fields may be appended to allocscope_check_finding, never removed or
 * reordered: allocscope fills the struct and the visitor only reads it, so a
 * visitor compiled against an older header reads the fields it knows and
 * no size field is needed. */

/* Called once per finding; the pointers are valid during the call only. */
typedef void (*allocscope_check_visitor)(void* user, const allocscope_check_finding* finding);

/* Ends check `id`: waits until its plugins have seen every event this thread
 * recorded before the call, finishes them and passes each of their findings
 * to `visit` (may be NULL), in the order they were made. Returns 0, or -1
 * with the reason in `error` when the check did not run to its end (an
 * unknown id, a plugin disabled by its own error, the recorder not catching
 * up within 60 s); the findings made before are still visited. */
int allocscope_check_end(uint64_t id, allocscope_check_visitor visit, void* user, char* error,
                         size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* ALLOCSCOPE_ALLOCSCOPE_H */
