/* allocscope detection plugin ABI, version 2 (frozen).
 *
 * What changed since version 1 (<allocscope/plugin_v1.h>, included here for
 * the declarations that did not change):
 *   * the event struct carries its size (allocscope_event_v2::struct_size);
 *   * the DERIVED event kind (provenance);
 *   * an OOM event's address is the device's free bytes (0 in version 1);
 *   * a finding has a basis and evidence notes (allocscope_finding_v2);
 *   * the descriptor is exported as `allocscope_plugin_v2`.
 * As in NCCL's plugin headers (tuner_v2.h, net_v9.h, ...), each version is
 * one frozen header, a plugin exports one const struct named with its
 * version, and the host looks for the newest name it knows first:
 * `allocscope_plugin_v2`, then version 1's `allocscope_plugin_v1` and
 * `allocscope_plugin` (through its v1 adapter). A plugin that exports
 * several is loaded by the newest; the others are ignored.
 *
 * A plugin is a shared library that exports exactly one symbol, its
 * descriptor, and nothing else (build it with -fvisibility=hidden and a
 * version script; plugins/README.md):
 *
 *     ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR = {
 *         sizeof(allocscope_plugin_v2), ALLOCSCOPE_PLUGIN_V2_ABI_VERSION, "my-plugin",
 *         "what it finds", ALLOCSCOPE_EVENT_V2_ALL, my_init, my_on_event, my_on_step,
 *         my_finish,
 *     };
 *
 * The host (the interposer, live inside the traced process, or
 * `allocscope replay`, offline on recorded traces) loads it with dlopen,
 * checks struct_size and abi_version, and drives it:
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
 * Tag strings are interned: an event's layer, phase, alloc_layer and
 * alloc_phase, and a live record's layer and phase, point into the host's
 * string table, where the same text is always at the same address and
 * stays valid until finish() returns (both streams of baseline mode
 * included). A plugin may keep these pointers and key its state by them
 * instead of hashing the text of every event.
 *
 * Baseline mode (compare a run against a baseline run, e.g. FP8 against
 * bf16): when host->has_baseline is set, the host first delivers the
 * baseline run's whole stream (the same rank's) with event->source ==
 * ALLOCSCOPE_SOURCE_BASELINE and on_step(..., source
 * ALLOCSCOPE_SOURCE_BASELINE), then the run's own stream with
 * ALLOCSCOPE_SOURCE_RUN. A plugin measures the baseline while its events
 * come and compares afterwards. live_foreach/live_bytes describe the stream
 * being delivered.
 */
#ifndef ALLOCSCOPE_PLUGIN_V2_H
#define ALLOCSCOPE_PLUGIN_V2_H

#include <allocscope/plugin_v1.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ALLOCSCOPE_PLUGIN_V2_ABI_VERSION 2u
#define ALLOCSCOPE_PLUGIN_V2_SYMBOL "allocscope_plugin_v2"

/* Event kinds: version 1's (allocscope_event_kind_v1, ALLOC = 1 to
 * MARK = 10) and these. */
typedef enum allocscope_event_kind_v2 {
    /* Provenance: the allocation at `address` holds bytes computed from the
     * parameter `param_index` (a quantized copy, a transpose, a scale);
     * `text` says how ("layers.3.fc1.weight -> abs -> amax -> _to_copy"),
     * "" when not known. Sources: allocscope_derived() (a program or its
     * framework declares it) and the PyTorch bridge's op observer. Only
     * plugins whose event_mask asks for it get it. */
    ALLOCSCOPE_EVENT_DERIVED = 11
} allocscope_event_kind_v2;

/* Every kind of version 2 (event_mask). */
#define ALLOCSCOPE_EVENT_V2_ALL 0xFFEu

/* Unchanged since version 1. */
typedef allocscope_level_v1 allocscope_level_v2;
typedef allocscope_source_v1 allocscope_source_v2;
typedef allocscope_severity_v1 allocscope_severity_v2;
typedef allocscope_param_v1 allocscope_param_v2;
typedef allocscope_live_v1 allocscope_live_v2;
typedef allocscope_evidence_v1 allocscope_evidence_v2;
typedef allocscope_live_visitor_v1 allocscope_live_visitor_v2;

typedef struct allocscope_event_v2 {
    /* sizeof(allocscope_event_v2) as the host was built: fields appended
     * to a later version 2 host's struct are there only when it covers
     * them. */
    uint32_t struct_size;
    uint32_t kind;    /* allocscope_event_kind_v1 / _v2 */
    uint64_t seq;     /* global order within the stream */
    uint64_t t_ns;    /* monotonic ns since the stream began */
    uint64_t step;    /* the training step current at the event */
    uint64_t address; /* ALLOC/FREE/MAP/UNMAP; OOM: the device's free bytes as the
                       * allocator measured them, 0 when not known */
    uint64_t size;    /* ALLOC/OOM: requested bytes; FREE: the freed allocation's */
    uint32_t level;   /* allocscope_level_v2 */
    uint32_t source;  /* allocscope_source_v2 */
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
    uint32_t param_index; /* PARAM, DERIVED: index for host->param() */
    const char* text;     /* MARK: the note; DERIVED: how; otherwise "" */
} allocscope_event_v2;

typedef struct allocscope_finding_v2 {
    uint32_t struct_size; /* sizeof(allocscope_finding_v2) */
    uint32_t severity;    /* allocscope_severity_v2 */
    const char* layer;    /* where it is attributed ("" for none) */
    const char* phase;
    uint64_t bytes;
    uint64_t count;
    const char* summary; /* one line */
    /* Any order: the host keeps the finding's evidence largest first
     * (equal sizes in the order given), so the first is the allocation
     * that holds the most bytes. */
    const allocscope_evidence_v2* evidence;
    size_t evidence_count;
    /* How the finding's claim was established, for detectors that infer
     * what an allocation is: "proven" (provenance: the bytes were computed
     * from the named parameters), "corroborated" (two independent
     * signals), "size-only" (sizes alone: ambiguous), "baseline" (measured
     * against a baseline run's stream); NULL or "" when not applicable. */
    const char* basis;
    /* NULL, or one string per evidence entry (NULL or "" for none): what
     * that allocation is and why it is alive
     * ("layers.3.fc1.weight -> abs -> amax -> _to_copy"). */
    const char* const* evidence_notes;
} allocscope_finding_v2;

typedef struct allocscope_host_v2 {
    uint32_t struct_size; /* sizeof(allocscope_host_v2) */
    uint32_t abi_version; /* ALLOCSCOPE_PLUGIN_V2_ABI_VERSION */
    void* ctx;            /* pass to every function below */
    int32_t rank;         /* -1: the process had no rank */
    int32_t world_size;   /* 0: unknown */
    int32_t has_baseline;
    /* Parameters registered so far (PARAM events add to them). */
    size_t (*param_count)(void* ctx);
    const allocscope_param_v2* (*param)(void* ctx, size_t index);
    /* Live allocations of `level` (0: every level) of the stream being
     * delivered, in no particular order. Returns how many were visited. */
    size_t (*live_foreach)(void* ctx, uint32_t level, allocscope_live_visitor_v2 visit, void* user);
    uint64_t (*live_bytes)(void* ctx, uint32_t level);
    /* The value of option "<plugin name>.<key>" (ALLOCSCOPE_PLUGIN_OPTIONS,
     * `--plugin-option`), or NULL when unset. */
    const char* (*option)(void* ctx, const char* key);
    /* Records a finding (copied); rank and plugin name are filled in. */
    void (*emit)(void* ctx, const allocscope_finding_v2* finding);
    /* One line for the user (stderr / the log), prefixed with the plugin's
     * name. */
    void (*log)(void* ctx, const char* message);
} allocscope_host_v2;

typedef struct allocscope_plugin_v2 {
    uint32_t struct_size; /* sizeof(allocscope_plugin_v2) */
    uint32_t abi_version; /* ALLOCSCOPE_PLUGIN_V2_ABI_VERSION */
    const char* name;     /* "weight-copy-accumulation": [a-z0-9-]+ */
    const char* description;
    uint32_t event_mask; /* ALLOCSCOPE_EVENT_BIT(kind) | ... */
    allocscope_plugin_status (*init)(const allocscope_host_v2* host, void** state);
    allocscope_plugin_status (*on_event)(void* state, const allocscope_event_v2* event);
    allocscope_plugin_status (*on_step)(void* state, uint64_t step, uint32_t source);
    allocscope_plugin_status (*finish)(void* state);
} allocscope_plugin_v2;

/* Defines the plugin's descriptor under the symbol name
 * ALLOCSCOPE_PLUGIN_V2_SYMBOL, exported with default visibility, in C and
 * C++ (the example at the top). The symbol is named by an asm label: the
 * C identifier allocscope_plugin_v2 is the type. */
#ifdef __cplusplus
#define ALLOCSCOPE_PLUGIN_V2_LINKAGE_ extern "C"
#else
#define ALLOCSCOPE_PLUGIN_V2_LINKAGE_
#endif
#define ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR                                  \
    ALLOCSCOPE_PLUGIN_V2_LINKAGE_ __attribute__((visibility("default"))) \
    const allocscope_plugin_v2 allocscope_plugin_v2_descriptor __asm__("allocscope_plugin_v2")

#ifdef __cplusplus
}
#endif

#endif /* ALLOCSCOPE_PLUGIN_V2_H */
