/* Test plugin "test-count": counts what it is given and reports it in one
 * finding at finish, so tests can compare numbers (and live against
 * offline). With option transcript=1 a second finding's summary lists every
 * call in order, for tests of delivery order.
 *
 * A version 2 plugin (allocscope_plugin_v2), or with TEST_V1 a version 1
 * plugin built against plugin_v1.h as version 1 was released
 * (tests/plugins/v1_frozen, the only allocscope header on its include
 * path), exported as that header says, `allocscope_plugin`, or with
 * TEST_V1_VERSIONED as `allocscope_plugin_v1`.
 *
 * Built several times with other TEST_* macros for the host's rejection
 * tests: TEST_ABI_VERSION (wrong ABI version), TEST_STRUCT_SIZE (wrong
 * struct size), TEST_NAME (another name); TEST_BOTH_SYMBOLS (version 2)
 * also exports a good version 1 descriptor, "test-both-v1", as
 * `allocscope_plugin_v1`, so that the host must pick the newest. */
#ifdef TEST_V1
#include <allocscope/plugin_v1.h>
#define V_(type) type##_v1
#define TEST_DEFAULT_ABI 1u
#define TEST_ALL ALLOCSCOPE_EVENT_ALL
#ifdef TEST_V1_VERSIONED
#define TEST_SYMBOL "allocscope_plugin_v1"
#else
#define TEST_SYMBOL ALLOCSCOPE_PLUGIN_SYMBOL
#endif
#else
#include <allocscope/plugin_v2.h>
#define V_(type) type##_v2
#define TEST_DEFAULT_ABI ALLOCSCOPE_PLUGIN_V2_ABI_VERSION
#define TEST_ALL ALLOCSCOPE_EVENT_V2_ALL
#define TEST_SYMBOL ALLOCSCOPE_PLUGIN_V2_SYMBOL
#endif
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TEST_ABI_VERSION
#define TEST_ABI_VERSION TEST_DEFAULT_ABI
#endif
#ifndef TEST_STRUCT_SIZE
#define TEST_STRUCT_SIZE sizeof(V_(allocscope_plugin))
#endif
#ifndef TEST_NAME
#define TEST_NAME "test-count"
#endif

typedef struct {
    char* data;
    size_t size, cap;
} buffer;

static int buf_append(buffer* b, const char* text) {
    size_t n = strlen(text);
    if (b->size + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->size + n + 1)
            cap *= 2;
        char* grown = realloc(b->data, cap);
        if (!grown) return 0;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->size, text, n + 1);
    b->size += n;
    return 1;
}

typedef struct {
    const V_(allocscope_host) * host;
    uint64_t events;
    uint64_t by_kind[12];
    uint64_t oom_address_sum; /* an OOM event's address: 0 for version 1 */
    uint64_t baseline_events, run_events;
    int order_violated; /* a baseline call after a run call */
    uint64_t alloc_bytes, freed_bytes, freed_alloc_seq_sum, unknown_frees;
    uint64_t steps, step_sum, last_step;
    uint64_t hash; /* FNV-1a over the strings of every event */
    uint64_t max_seq;
    uint32_t stacks_seen;
    int transcript_on;
    buffer transcript;
    uint32_t severity;
    size_t max_evidence;
} count_state;

static void hash_str(count_state* s, const char* text) {
    const unsigned char* p = (const unsigned char*)(text ? text : "(null)");
    for (; *p; ++p) {
        s->hash ^= *p;
        s->hash *= 1099511628211ull;
    }
    s->hash ^= 0xff;
    s->hash *= 1099511628211ull;
}

static void note_source(count_state* s, uint32_t source) {
    if (source == ALLOCSCOPE_SOURCE_BASELINE) {
        if (s->run_events) s->order_violated = 1;
    }
}

static allocscope_plugin_status count_init(const V_(allocscope_host) * host, void** state) {
    count_state* s = calloc(1, sizeof *s);
    if (!s) return ALLOCSCOPE_PLUGIN_ERROR;
    s->host = host;
    s->hash = 1469598103934665603ull;
    s->max_evidence = 4;
    const char* sev = host->option(host->ctx, "severity");
    if (sev && strcmp(sev, "warning") == 0) s->severity = ALLOCSCOPE_SEVERITY_WARNING;
    if (sev && strcmp(sev, "error") == 0) s->severity = ALLOCSCOPE_SEVERITY_ERROR;
    if (sev && strcmp(sev, "info") && strcmp(sev, "warning") && strcmp(sev, "error")) {
        host->log(host->ctx, "option severity must be info, warning or error");
        free(s);
        return ALLOCSCOPE_PLUGIN_ERROR;
    }
    const char* ev = host->option(host->ctx, "evidence");
    if (ev) s->max_evidence = (size_t)strtoul(ev, NULL, 10);
    const char* tr = host->option(host->ctx, "transcript");
    s->transcript_on = tr && strcmp(tr, "1") == 0;
    char line[128];
    snprintf(line, sizeof line, "init rank %d world %d baseline %d", host->rank, host->world_size,
             host->has_baseline);
    host->log(host->ctx, line);
    *state = s;
    return ALLOCSCOPE_PLUGIN_OK;
}

static const char kKindLetter[] = "?AFMUOPpSRKD";

static allocscope_plugin_status count_on_event(void* state, const V_(allocscope_event) * e) {
    count_state* s = state;
    note_source(s, e->source);
    ++s->events;
    if (e->source == ALLOCSCOPE_SOURCE_BASELINE) {
        ++s->baseline_events;
    } else {
        ++s->run_events;
    }
    if (e->kind < 12) ++s->by_kind[e->kind];
    if (e->kind == ALLOCSCOPE_EVENT_OOM) s->oom_address_sum += e->address;
#ifndef TEST_V1
    /* The host's event is at least as large as this plugin's. */
    if (e->struct_size < sizeof *e) return ALLOCSCOPE_PLUGIN_ERROR;
#endif
    if (e->seq > s->max_seq) s->max_seq = e->seq;
    if (e->stack_id) ++s->stacks_seen;
    hash_str(s, e->layer);
    hash_str(s, e->phase);
    hash_str(s, e->text);
    char token[256];
    token[0] = '\0';
    switch (e->kind) {
        case ALLOCSCOPE_EVENT_ALLOC:
            s->alloc_bytes += e->size;
            snprintf(token, sizeof token, "%c%c%" PRIu64 "@%s/%s:%" PRIu64 "L%" PRIu64,
                     e->source ? 'b' : 'r', kKindLetter[e->kind], e->seq, e->layer, e->phase,
                     e->size, s->host->live_bytes(s->host->ctx, 0));
            break;
        case ALLOCSCOPE_EVENT_FREE:
            s->freed_bytes += e->size;
            s->freed_alloc_seq_sum += e->alloc_seq;
            if (e->alloc_seq == 0) ++s->unknown_frees;
            hash_str(s, e->alloc_layer);
            hash_str(s, e->alloc_phase);
            snprintf(token, sizeof token, "%c%c%" PRIu64 ":%" PRIu64 "@%s/%s",
                     e->source ? 'b' : 'r', kKindLetter[e->kind], e->seq, e->alloc_seq,
                     e->alloc_layer, e->alloc_phase);
            break;
        case ALLOCSCOPE_EVENT_PARAM: {
            const V_(allocscope_param)* p = s->host->param(s->host->ctx, e->param_index);
            if (p) {
                hash_str(s, p->layer);
                hash_str(s, p->name);
                hash_str(s, p->dtype);
            }
            snprintf(token, sizeof token, "%c%c%" PRIu64 ":%u=%s.%s/%s/%" PRIu64 "/%" PRIu64,
                     e->source ? 'b' : 'r', kKindLetter[e->kind], e->seq, e->param_index,
                     p ? p->layer : "?", p ? p->name : "?", p ? p->dtype : "?", p ? p->numel : 0,
                     p ? p->sharded_numel : 0);
            break;
        }
        case ALLOCSCOPE_EVENT_MARK:
            snprintf(token, sizeof token, "%c%c%" PRIu64 ":%s", e->source ? 'b' : 'r',
                     kKindLetter[e->kind], e->seq, e->text);
            break;
#ifndef TEST_V1
        case ALLOCSCOPE_EVENT_DERIVED: {
            const V_(allocscope_param)* p = s->host->param(s->host->ctx, e->param_index);
            snprintf(token, sizeof token, "%c%c%" PRIu64 ":%" PRIx64 "<%u=%s.%s:%s",
                     e->source ? 'b' : 'r', kKindLetter[e->kind], e->seq, e->address,
                     e->param_index, p ? p->layer : "?", p ? p->name : "?", e->text);
            break;
        }
#endif
        default:
            snprintf(token, sizeof token, "%c%c%" PRIu64, e->source ? 'b' : 'r',
                     e->kind < 12 ? kKindLetter[e->kind] : '?', e->seq);
    }
    if (s->transcript_on) {
        if (s->transcript.size) buf_append(&s->transcript, " ");
        buf_append(&s->transcript, token);
    }
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status count_on_step(void* state, uint64_t step, uint32_t source) {
    count_state* s = state;
    note_source(s, source);
    ++s->steps;
    s->step_sum += step;
    s->last_step = step;
    if (s->transcript_on) {
        char token[64];
        snprintf(token, sizeof token, "%ss%" PRIu64, s->transcript.size ? " " : "", step);
        if (source == ALLOCSCOPE_SOURCE_BASELINE) token[s->transcript.size ? 1 : 0] = 'S';
        buf_append(&s->transcript, token);
    }
    return ALLOCSCOPE_PLUGIN_OK;
}

typedef struct {
    V_(allocscope_evidence) * items;
    char (*strings)[2][64];
    size_t n, cap;
} live_list;

static int collect(void* user, const V_(allocscope_live) * live) {
    live_list* l = user;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        V_(allocscope_evidence)* items = realloc(l->items, cap * sizeof *items);
        if (!items) return 1;
        l->items = items;
        char(*strings)[2][64] = realloc(l->strings, cap * sizeof *strings);
        if (!strings) return 1;
        l->strings = strings;
        l->cap = cap;
    }
    V_(allocscope_evidence)* e = &l->items[l->n];
    snprintf(l->strings[l->n][0], 64, "%s", live->layer);
    snprintf(l->strings[l->n][1], 64, "%s", live->phase);
    e->size = live->size;
    e->step = live->step;
    e->alloc_seq = live->alloc_seq;
    e->free_seq = 0;
    e->stack_id = live->stack_id;
    ++l->n;
    return 0;
}

static int by_seq(const void* a, const void* b) {
    const V_(allocscope_evidence)* x = a;
    const V_(allocscope_evidence)* y = b;
    return x->alloc_seq < y->alloc_seq ? -1 : x->alloc_seq > y->alloc_seq;
}

static allocscope_plugin_status count_finish(void* state) {
    count_state* s = state;
    const V_(allocscope_host)* h = s->host;
    live_list live = {0};
    size_t visited = h->live_foreach(h->ctx, 0, collect, &live);
    /* The strings travel with their entries through the sort. */
    for (size_t i = 0; i < live.n; ++i) {
        live.items[i].layer = (const char*)(uintptr_t)i;
    }
    /* Nothing live: items is NULL, which qsort may not be given. */
    if (live.n > 1) qsort(live.items, live.n, sizeof *live.items, by_seq);
    for (size_t i = 0; i < live.n; ++i) {
        size_t k = (size_t)(uintptr_t)live.items[i].layer;
        live.items[i].layer = live.strings[k][0];
        live.items[i].phase = live.strings[k][1];
    }
    char summary[1024];
    snprintf(summary, sizeof summary,
             "events=%" PRIu64 " alloc=%" PRIu64 " free=%" PRIu64 " oom=%" PRIu64 " push=%" PRIu64
             " pop=%" PRIu64 " step=%" PRIu64 " param=%" PRIu64 " mark=%" PRIu64 " derived=%" PRIu64
             " alloc_bytes=%" PRIu64 " freed_bytes=%" PRIu64 " freed_alloc_seq_sum=%" PRIu64
             " unknown_frees=%" PRIu64 " on_step=%" PRIu64 " step_sum=%" PRIu64
             " last_step=%" PRIu64 " baseline=%" PRIu64 " run=%" PRIu64
             " order=%s params=%zu"
             " live=%zu live_bytes=%" PRIu64 " segment_bytes=%" PRIu64 " block_bytes=%" PRIu64
             " stacks=%u max_seq=%" PRIu64 " hash=%016" PRIx64 " oom_address_sum=%" PRIu64,
             s->events, s->by_kind[1], s->by_kind[2], s->by_kind[5], s->by_kind[6], s->by_kind[7],
             s->by_kind[8], s->by_kind[9], s->by_kind[10], s->by_kind[11], s->alloc_bytes,
             s->freed_bytes, s->freed_alloc_seq_sum, s->unknown_frees, s->steps, s->step_sum,
             s->last_step, s->baseline_events, s->run_events, s->order_violated ? "violated" : "ok",
             h->param_count(h->ctx), visited, h->live_bytes(h->ctx, 0),
             h->live_bytes(h->ctx, ALLOCSCOPE_LEVEL_SEGMENT),
             h->live_bytes(h->ctx, ALLOCSCOPE_LEVEL_BLOCK), s->stacks_seen, s->max_seq, s->hash,
             s->oom_address_sum);
    V_(allocscope_finding) f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.severity = s->severity;
    f.layer = live.n ? live.items[live.n - 1].layer : "";
    f.phase = live.n ? live.items[live.n - 1].phase : "";
    f.bytes = h->live_bytes(h->ctx, 0);
    f.count = s->events;
    f.summary = summary;
    f.evidence = live.items;
    f.evidence_count = live.n < s->max_evidence ? live.n : s->max_evidence;
    h->emit(h->ctx, &f);
    if (s->transcript_on) {
        V_(allocscope_finding) t;
        memset(&t, 0, sizeof t);
        t.struct_size = sizeof t;
        t.severity = ALLOCSCOPE_SEVERITY_INFO;
        t.layer = "transcript";
        t.summary = s->transcript.data ? s->transcript.data : "";
        h->emit(h->ctx, &t);
    }
    free(live.items);
    free(live.strings);
    free(s->transcript.data);
    free(s);
    return ALLOCSCOPE_PLUGIN_OK;
}

/* The one exported symbol (an asm label: TEST_SYMBOL). */
__attribute__((visibility("default"))) const V_(allocscope_plugin) test_descriptor
    __asm__(TEST_SYMBOL) = {
        TEST_STRUCT_SIZE, TEST_ABI_VERSION, TEST_NAME,      "counts events (test plugin)",
        TEST_ALL,         count_init,       count_on_event, count_on_step,
        count_finish,
};

#ifdef TEST_BOTH_SYMBOLS
/* A good version 1 descriptor too, under its versioned name: the host
 * takes allocscope_plugin_v2, the newest, and ignores this one. */
static allocscope_plugin_status v1_init(const allocscope_host_v1* host, void** state) {
    (void)host;
    *state = NULL;
    return ALLOCSCOPE_PLUGIN_OK;
}
__attribute__((visibility("default")))
const allocscope_plugin_v1 test_descriptor_v1 __asm__("allocscope_plugin_v1") = {
    sizeof(allocscope_plugin_v1),
    1,
    "test-both-v1",
    "the version 1 descriptor (test plugin)",
    ALLOCSCOPE_EVENT_ALL,
    v1_init,
    NULL,
    NULL,
    NULL,
};
#endif
