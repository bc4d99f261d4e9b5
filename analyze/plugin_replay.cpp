#include "plugin_replay.h"

namespace allocscope {

void feed_trace(PluginHost& host, const Trace& trace, uint32_t source) {
    for (const Event& e : trace.events)
        host.feed(e, trace.strings, trace.params, source);
}

void feed_trace(PluginHost& host, TraceStream& stream, uint32_t source) {
    stream.for_each([&](const Event& e) {
        const TraceTables& t = stream.tables();
        host.feed(e, t.strings, t.params, source);
    });
}

}  // namespace allocscope
