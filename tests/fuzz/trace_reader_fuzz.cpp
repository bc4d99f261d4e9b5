// libFuzzer target for the trace reader (tools/fuzz builds and runs it).
#include <cstddef>
#include <cstdint>

#include "trace_reader_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    allocscope::fuzz::read_trace_bytes(data, size);
    return 0;
}
