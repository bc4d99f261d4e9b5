/* Test plugin "test-derived": one info finding per DERIVED event, so that a
 * test reads a trace's provenance declarations back through
 * `allocscope replay --plugins <this> -o -` (the trace writer, reader and
 * plugin host on the way). The finding's layer and phase are the event's
 * tag; its summary is
 *
 *     derived <param layer>|<param name>|<how>|0x<address>
 *
 * (tests/python/torch_provenance_test.py). */
#include <allocscope/plugin_v2.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static allocscope_plugin_status derived_init(const allocscope_host_v2* host, void** state) {
    *state = (void*)host;
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status derived_on_event(void* state, const allocscope_event_v2* e) {
    const allocscope_host_v2* host = state;
    if (e->kind != ALLOCSCOPE_EVENT_DERIVED) return ALLOCSCOPE_PLUGIN_OK;
    const allocscope_param_v2* p = host->param(host->ctx, e->param_index);
    char summary[1024];
    snprintf(summary, sizeof summary, "derived %s|%s|%s|0x%" PRIx64, p ? p->layer : "?",
             p ? p->name : "?", e->text ? e->text : "", e->address);
    allocscope_finding_v2 f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.severity = ALLOCSCOPE_SEVERITY_INFO;
    f.layer = e->layer;
    f.phase = e->phase;
    f.count = 1;
    f.summary = summary;
    host->emit(host->ctx, &f);
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status derived_on_step(void* state, uint64_t step, uint32_t source) {
    (void)state;
    (void)step;
    (void)source;
    return ALLOCSCOPE_PLUGIN_OK;
}

static allocscope_plugin_status derived_finish(void* state) {
    (void)state;
    return ALLOCSCOPE_PLUGIN_OK;
}

ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR = {
    sizeof(allocscope_plugin_v2),
    ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
    "test-derived",
    "one finding per provenance declaration (test plugin)",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_DERIVED),
    derived_init,
    derived_on_event,
    derived_on_step,
    derived_finish,
};
