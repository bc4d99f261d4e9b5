/* allocscope detection plugin ABI, version 1 (frozen).
 *
 * Frozen: these are the declarations as version 1 was released, and they
 * never change. New plugins are written against version 2,
 * <allocscope/plugin_v2.h> (the event struct carries its size, the DERIVED
 * event kind, a finding's basis and evidence notes, an OOM event's address
 * is the device's free bytes). allocscope keeps loading version 1 plugins
 * through its v1 adapter: they get the events version 1 had (no DERIVED;
 * an OOM event's address is 0), and their findings get no basis and no
 * evidence notes. The host looks for `allocscope_plugin_v2` first, then
 * `allocscope_plugin_v1`, then `allocscope_plugin` (this header's name);
 * a plugin that exports several is loaded by the newest.
 *
 * A plugin is a shared library that exports exactly one symbol,
 *
 *     const allocscope_plugin_v1 allocscope_plugin = { ... };
 *
 * (ALLOCSCOPE_PLUGIN_SYMBOL), and nothing else. The host (the interposer,
 * live inside the traced process, or `allocscope replay`, offline on
 * recorded traces) loads it with dlopen, checks struct_size and abi_version,
 * and drives it:
 *
 *     init(host, &state)            once, before any event
 *     on_event(state, event)        every event whose kind is in event_mask,
 *                                   in sequence order (per process / rank)
 *     on_step(state, step)          when the training step changes, before
 *                                   the STEP event of the new step
 *     finish(state)                 once, at the end of the stream; the
 *                                   plugin emits what it still holds and
 *                                   frees its state
 *
 * One plugin instance sees one rank's stream. Calls into one instance never
 * overlap (the host serializes them) and never come from the traced
 * program's own threads, so a plugin may take its time (within reason) and
 * may allocate host memory. A plugin must not call CUDA.
 *
 * Every function returns ALLOCSCOPE_PLUGIN_OK or ALLOCSCOPE_PLUGIN_ERROR. A
 * plugin that returns an error (or throws, in C++) is disabled with one
 * message naming it and the call; the others go on, the traced program
 * never notices. Findings it emitted before that are kept.
 *
 * Pointers the host passes (events, strings, the host table, params, live
 * records) are valid only during the call that passes them, except `host`
 * itself and what it returns from param(), which live until finish()
 * returns. Strings are UTF-8, NUL-terminated; an untagged allocation has
 * layer "" and phase "".
 *
 * Baseline mode (the reference test's method: compare a run against a
 * baseline run, e.g. FP8 against bf16): when host->has_baseline is set, the
 * host first delivers the baseline run's whole stream (the same rank's)
 * with event->source == ALLOCSCOPE_SOURCE_BASELINE and on_step(..., source
 * ALLOCSCOPE_SOURCE_BASELINE), then the run's own stream with
 * ALLOCSCOPE_SOURCE_RUN. A plugin measures the baseline while its events
 * come and compares afterwards. live_foreach/live_bytes describe the stream
 * being delivered.
 */
#ifndef ALLOCSCOPE_PLUGIN_V1_H
#define ALLOCSCOPE_PLUGIN_V1_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ALLOCSCOPE_PLUGIN_ABI_VERSION 1u
#define ALLOCSCOPE_PLUGIN_SYMBOL "allocscope_plugin"

typedef enum allocscope_plugin_status {
    ALLOCSCOPE_PLUGIN_OK = 0,
    ALLOCSCOPE_PLUGIN_ERROR = 1
} allocscope_plugin_status;

/* Event kinds: the trace format's values. */
typedef enum allocscope_event_kind_v1 {
    ALLOCSCOPE_EVENT_ALLOC = 1,
    ALLOCSCOPE_EVENT_FREE = 2,
    ALLOCSCOPE_EVENT_MAP = 3,
    ALLOCSCOPE_EVENT_UNMAP = 4,
    ALLOCSCOPE_EVENT_OOM = 5,
    ALLOCSCOPE_EVENT_TAG_PUSH = 6,
    ALLOCSCOPE_EVENT_TAG_POP = 7,
    ALLOCSCOPE_EVENT_STEP = 8,
    ALLOCSCOPE_EVENT_PARAM = 9,
    ALLOCSCOPE_EVENT_MARK = 10
} allocscope_event_kind_v1;

/* event_mask bit of a kind. */
#define ALLOCSCOPE_EVENT_BIT(kind) (1u << (unsigned)(kind))
#define ALLOCSCOPE_EVENT_ALL 0x7FEu

typedef enum allocscope_level_v1 {
    ALLOCSCOPE_LEVEL_NONE = 0,    /* tag, step, param, mark events */
    ALLOCSCOPE_LEVEL_SEGMENT = 1, /* memory from the driver: ~ reserved */
    ALLOCSCOPE_LEVEL_BLOCK = 2    /* a caching allocator's tensor: ~ allocated */
} allocscope_level_v1;

typedef enum allocscope_source_v1 {
    ALLOCSCOPE_SOURCE_RUN = 0,
    ALLOCSCOPE_SOURCE_BASELINE = 1
} allocscope_source_v1;

typedef enum allocscope_severity_v1 {
    ALLOCSCOPE_SEVERITY_INFO = 0,
    ALLOCSCOPE_SEVERITY_WARNING = 1,
    ALLOCSCOPE_SEVERITY_ERROR = 2
} allocscope_severity_v1;

typedef struct allocscope_event_v1 {
    uint64_t seq;     /* global order within the stream */
    uint64_t t_ns;    /* monotonic ns since the stream began */
    uint64_t step;    /* the training step current at the event */
    uint64_t address; /* ALLOC/FREE/MAP/UNMAP */
    uint64_t size;    /* ALLOC/OOM: requested bytes; FREE: the freed allocation's */
    uint32_t kind;    /* allocscope_event_kind_v1 */
    uint32_t level;   /* allocscope_level_v1 */
    uint32_t source;  /* allocscope_source_v1 */
    int32_t device;
    uint32_t tid;
    uint32_t stack_id; /* 0: no stack */
    /* The tag current on the event's thread (TAG_PUSH: the new tag; TAG_POP:
     * the tag being left). */
    const char* layer;
    const char* phase;
    /* FREE of a known allocation: that allocation's seq, step, tag and
     * stack; alloc_seq 0 for a free of an unknown address. */
    uint64_t alloc_seq;
    uint64_t alloc_step;
    const char* alloc_layer;
    const char* alloc_phase;
    uint32_t alloc_stack_id;
    uint32_t param_index; /* PARAM: index for host->param() */
    const char* text;     /* MARK: the note; otherwise "" */
} allocscope_event_v1;

typedef struct allocscope_param_v1 {
    const char* layer; /* module path, "layers.3.attn.qkv" */
    const char* name;  /* "weight" */
    uint64_t numel;    /* unsharded elements */
    uint64_t sharded_numel;
    const char* dtype; /* "bf16", "fp32", a recipe name for quantized params */
} allocscope_param_v1;

/* One live allocation, as the host's live table holds it. */
typedef struct allocscope_live_v1 {
    uint64_t address;
    uint64_t size;
    uint64_t alloc_seq;
    uint64_t step;
    uint32_t level;
    uint32_t stack_id;
    const char* layer;
    const char* phase;
} allocscope_live_v1;

/* One allocation that proves a finding. free_seq 0: still alive. */
typedef struct allocscope_evidence_v1 {
    uint64_t size;
    const char* layer;
    const char* phase;
    uint64_t step;
    uint64_t alloc_seq;
    uint64_t free_seq;
    uint32_t stack_id;
} allocscope_evidence_v1;

typedef struct allocscope_finding_v1 {
    uint32_t struct_size; /* sizeof(allocscope_finding_v1) */
    uint32_t severity;    /* allocscope_severity_v1 */
    const char* layer;    /* where it is attributed ("" for none) */
    const char* phase;
    uint64_t bytes;
    uint64_t count;
    const char* summary; /* one line */
    const allocscope_evidence_v1* evidence;
    size_t evidence_count;
} allocscope_finding_v1;

/* Return non-zero to stop the iteration. */
typedef int (*allocscope_live_visitor_v1)(void* user, const allocscope_live_v1* live);

typedef struct allocscope_host_v1 {
    uint32_t struct_size;
    uint32_t abi_version;
    void* ctx;          /* pass to every function below */
    int32_t rank;       /* -1: the process had no rank */
    int32_t world_size; /* 0: unknown */
    int32_t has_baseline;
    /* Parameters registered so far (PARAM events add to them). */
    size_t (*param_count)(void* ctx);
    const allocscope_param_v1* (*param)(void* ctx, size_t index);
    /* Live allocations of `level` (0: every level) of the stream being
     * delivered, in no particular order. Returns how many were visited. */
    size_t (*live_foreach)(void* ctx, uint32_t level, allocscope_live_visitor_v1 visit, void* user);
    uint64_t (*live_bytes)(void* ctx, uint32_t level);
    /* The value of option "<plugin name>.<key>" (ALLOCSCOPE_PLUGIN_OPTIONS,
     * `--plugin-option`), or NULL when unset. */
    const char* (*option)(void* ctx, const char* key);
    /* Records a finding (copied); rank and plugin name are filled in. */
    void (*emit)(void* ctx, const allocscope_finding_v1* finding);
    /* One line for the user (stderr / the log), prefixed with the plugin's
     * name. */
    void (*log)(void* ctx, const char* message);
} allocscope_host_v1;

typedef struct allocscope_plugin_v1 {
    uint32_t struct_size; /* sizeof(allocscope_plugin_v1) */
    uint32_t abi_version; /* ALLOCSCOPE_PLUGIN_ABI_VERSION */
    const char* name;     /* "weight-copy-accumulation": [a-z0-9-]+ */
    const char* description;
    uint32_t event_mask; /* ALLOCSCOPE_EVENT_BIT(kind) | ... */
    allocscope_plugin_status (*init)(const allocscope_host_v1* host, void** state);
    allocscope_plugin_status (*on_event)(void* state, const allocscope_event_v1* event);
    allocscope_plugin_status (*on_step)(void* state, uint64_t step, uint32_t source);
    allocscope_plugin_status (*finish)(void* state);
} allocscope_plugin_v1;

#ifdef __cplusplus
}
#endif

#endif /* ALLOCSCOPE_PLUGIN_V1_H */
