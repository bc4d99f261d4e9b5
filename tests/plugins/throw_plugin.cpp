// Test plugin "test-throw": a C++ plugin whose on_event throws on its
// second event (it frees its state first: the host makes no further calls).
// Option `what=bad-finding` makes it emit an invalid finding instead.
#include <allocscope/plugin_v2.h>

#include <cstring>
#include <stdexcept>

namespace {

struct State {
    const allocscope_host_v2* host;
    unsigned events = 0;
    bool bad_finding = false;
};

allocscope_plugin_status throw_init(const allocscope_host_v2* host, void** state) {
    auto* s = new State{host};
    const char* what = host->option(host->ctx, "what");
    s->bad_finding = what && std::strcmp(what, "bad-finding") == 0;
    *state = s;
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status throw_on_event(void* state, const allocscope_event_v2*) {
    auto* s = static_cast<State*>(state);
    if (++s->events < 2) return ALLOCSCOPE_PLUGIN_OK;
    if (s->bad_finding) {
        allocscope_finding_v2 f{};
        f.struct_size = sizeof f;
        f.severity = 7;
        f.summary = "severity out of range";
        s->host->emit(s->host->ctx, &f);
        delete s;
        return ALLOCSCOPE_PLUGIN_OK;
    }
    delete s;
    throw std::runtime_error("boom on event 2");
}

allocscope_plugin_status throw_finish(void* state) {
    delete static_cast<State*>(state);
    return ALLOCSCOPE_PLUGIN_OK;
}

}  // namespace

ALLOCSCOPE_PLUGIN_V2_DESCRIPTOR = {
    sizeof(allocscope_plugin_v2),
    ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
    "test-throw",
    "throws (test plugin)",
    ALLOCSCOPE_EVENT_V2_ALL,
    throw_init,
    throw_on_event,
    nullptr,
    throw_finish,
};
