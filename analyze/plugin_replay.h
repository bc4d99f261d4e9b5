// Feeding a recorded trace to a plugin host: `allocscope replay`, `run` and
// `check` replaying a process that did not finish its plugins, and tests.
// Offline only: the traced process feeds its events one at a time
// (PluginHost::feed) and never reads a trace.
#pragma once

#include <cstdint>

#include "plugin_host.h"
#include "trace_reader.h"

namespace allocscope {

// Every event of `trace`, in order.
void feed_trace(PluginHost& host, const Trace& trace, uint32_t source = ALLOCSCOPE_SOURCE_RUN);

// Every event of `stream`, in order, in one pass (never all held): each with
// the definitions read so far, which are those it refers to.
void feed_trace(PluginHost& host, TraceStream& stream, uint32_t source = ALLOCSCOPE_SOURCE_RUN);

}  // namespace allocscope
