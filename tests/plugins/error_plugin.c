/* Test plugin "test-error": emits a finding on its first event, then returns
 * ALLOCSCOPE_PLUGIN_ERROR from the call named by option fail_in (init,
 * event, step, finish; default event) at the fail_at-th such call (default
 * 3). Its state is freed before it fails, as the host makes no further
 * calls. */
#include <allocscope/plugin_v2.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const allocscope_host_v2* host;
    char fail_in[16];
    unsigned long fail_at;
    unsigned long events, steps;
} error_state;

static allocscope_plugin_status fail(error_state* s) {
    free(s);
    return ALLOCSCOPE_PLUGIN_ERROR;
}

static allocscope_plugin_status error_init(const allocscope_host_v2* host, void** state) {
    error_state* s = calloc(1, sizeof *s);
    if (!s) return ALLOCSCOPE_PLUGIN_ERROR;
    s->host = host;
    const char* in = host->option(host->ctx, "fail_in");
    strncpy(s->fail_in, in ? in : "event", sizeof s->fail_in - 1);
    const char* at = host->option(host->ctx, "fail_at");
    s->fail_at = at ? strtoul(at, NULL, 10) : 3;
    if (strcmp(s->fail_in, "init") == 0) return fail(s);
    *state = s;
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status error_on_event(void* state, const allocscope_event_v2* e) {
    error_state* s = state;
    ++s->events;
    if (s->events == 1) {
        allocscope_finding_v2 f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.severity = ALLOCSCOPE_SEVERITY_WARNING;
        f.layer = e->layer;
        f.phase = e->phase;
        f.bytes = e->size;
        f.count = 1;
        f.summary = "emitted before failing";
        s->host->emit(s->host->ctx, &f);
    }
    if (strcmp(s->fail_in, "event") == 0 && s->events == s->fail_at) return fail(s);
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status error_on_step(void* state, uint64_t step, uint32_t source) {
    error_state* s = state;
    (void)step;
    (void)source;
    ++s->steps;
    if (strcmp(s->fail_in, "step") == 0 && s->steps == s->fail_at) return fail(s);
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status error_finish(void* state) {
    error_state* s = state;
    if (strcmp(s->fail_in, "finish") == 0) return fail(s);
    free(s);
    return ALLOCSCOPE_PLUGIN_OK;
}

ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR = {
    sizeof(allocscope_plugin_v2),
    ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
    "test-error",
    "fails on purpose (test plugin)",
    ALLOCSCOPE_EVENT_V2_ALL,
    error_init,
    error_on_event,
    error_on_step,
    error_finish,
};
