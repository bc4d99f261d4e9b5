// The trace reader on arbitrary bytes: what the libFuzzer target
// (trace_reader_fuzz.cpp, tools/fuzz) and the corpus regression test
// (tests/fuzz_corpus_test.cpp, every build) both run.
//
// Each input is read as it is, and once more with its header and record
// checksums recomputed, so mutations reach the decoders behind the CRC
// checks. A malformed input must end in a TraceError (or the open error of
// a file that cannot be read), with a message; anything else (another
// exception, a crash, a sanitizer report, an allocation the size limits
// should have prevented) is a bug.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "trace_format.h"
#include "trace_reader.h"

namespace allocscope::fuzz {

struct Outcome {
    int read = 0;      // inputs read to the end (complete or truncated)
    int rejected = 0;  // inputs rejected with a TraceError, or read up to a corrupt record
};

// The header's and every complete record's CRC-32C recomputed.
inline std::vector<uint8_t> with_checksums_fixed(const uint8_t* data, size_t size) {
    std::vector<uint8_t> out(data, data + size);
    if (size < kTraceHeaderSize) return out;
    const uint32_t header_crc = crc32c({out.data(), kTraceHeaderSize - 4});
    std::memcpy(out.data() + kTraceHeaderSize - 4, &header_crc, 4);  // little-endian hosts
    size_t off = kTraceHeaderSize;
    while (off + kRecordHeaderSize <= size) {
        const uint32_t length = get_u32(out.data() + off + 4);
        if (length > size - off - kRecordHeaderSize) break;
        const uint32_t crc = crc32c({out.data() + off + kRecordHeaderSize, length});
        std::memcpy(out.data() + off + 8, &crc, 4);
        off += kRecordHeaderSize + length;
    }
    return out;
}

// Reads `bytes` as a trace file. Throws std::logic_error when the reader
// misbehaves without crashing (an error without a message, an event that
// breaks the invariants the reader promises).
inline void read_one(const std::vector<uint8_t>& bytes, Outcome& outcome) {
    const int fd = memfd_create("allocscope-fuzz", MFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error("memfd_create failed");
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n <= 0) {
            ::close(fd);
            throw std::runtime_error("write to memfd failed");
        }
        done += static_cast<size_t>(n);
    }
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    try {
        const Trace t = load_trace(path);
        for (const Event& e : t.events) {
            if (e.layer >= t.strings.size() || e.phase >= t.strings.size() ||
                e.stack >= t.stacks.size()) {
                throw std::logic_error("an accepted event refers to an undefined id");
            }
        }
        if (t.truncated == t.footer.has_value()) {
            throw std::logic_error("a trace must be either complete or truncated");
        }
        // A corrupt record ends the trace there: its prefix is kept, and the
        // record is rejected as a TraceError would reject it.
        if (t.corrupt && t.truncation_message.empty())
            throw std::logic_error("a corrupt trace without a message");
        ++(t.corrupt ? outcome.rejected : outcome.read);
    } catch (const TraceError& e) {
        if (std::string(e.what()).empty()) throw std::logic_error("TraceError without a message");
        ++outcome.rejected;
    }
    ::close(fd);
}

inline Outcome read_trace_bytes(const uint8_t* data, size_t size) {
    Outcome outcome;
    const std::vector<uint8_t> raw(data, data + size);
    read_one(raw, outcome);
    const std::vector<uint8_t> fixed = with_checksums_fixed(data, size);
    if (fixed != raw) read_one(fixed, outcome);
    return outcome;
}

}  // namespace allocscope::fuzz
