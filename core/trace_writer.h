// Serializes records into a trace file. Single-threaded: the interposer owns
// one TraceWriter on its writer thread; tests and tools use it directly.
//
// Events are collected into an event block (see trace_format.h) that is
// written when it is full, on flush() and on close(). Definitions (strings,
// stacks, modules, params) are written at once, so they land in the file
// before the block holding the events handed over around them: every
// definition still precedes the first event that uses it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "trace_format.h"

namespace allocscope {

class TraceWriter {
  public:
    TraceWriter() = default;
    TraceWriter(const TraceWriter&) = delete;
    TraceWriter& operator=(const TraceWriter&) = delete;
    ~TraceWriter();

    // Creates `path` exclusively (O_EXCL | O_NOFOLLOW, mode 0600) so an
    // existing file or a planted symlink is never clobbered, and writes the
    // header. On failure returns false and sets `error` to a message naming
    // the path and the reason; errno is preserved.
    bool open(const std::string& path, const TraceHeader& header, std::string& error);

    // Buffers the event in the open event block (written when full, on
    // flush() and on close()).
    void event(const Event& event);
    void string(uint32_t id, std::string_view text);
    void stack(uint32_t id, std::span<const uint64_t> frames);
    void module(const ModuleRecord& module);
    void param(const ParamRecord& param);
    // Writes the footer and closes the file; nothing may be appended after.
    void close(const FooterRecord& footer);

    // Ends the open event block and hands buffered bytes to the kernel, so a
    // process killed after this returns leaves them in the file.
    void flush();

    bool is_open() const noexcept { return fd_ >= 0; }
    // True once a write failed (disk full, I/O error); later records are
    // counted in dropped_records() instead of being written.
    bool failed() const noexcept { return failed_; }
    const std::string& error() const noexcept { return error_; }
    uint64_t dropped_records() const noexcept { return dropped_; }
    // Events accepted (buffered or written), the footer's `events`.
    uint64_t events_written() const noexcept { return events_; }
    const std::string& path() const noexcept { return path_; }
    // Bytes handed to the file so far (after flush(): all of it).
    uint64_t bytes_written() const noexcept { return bytes_; }

    // After flush(): continues in `replacement`, a complete rewrite of the
    // trace (core/trace_bound.h) of `bytes` bytes holding `events` events,
    // which is renamed over path(). On failure the trace goes on as it was
    // and `error` says why.
    bool adopt(const std::string& replacement, uint64_t bytes, uint64_t events, std::string& error);

  private:
    // False when the record was dropped (not open, closed, or failed).
    bool put(RecordType type, std::string_view payload);
    // Appends the open event block, if any, to the buffer as a record.
    void end_block();
    // Writes the buffer to the file.
    void write_buffer();

    int fd_ = -1;
    bool failed_ = false;
    uint64_t dropped_ = 0;
    uint64_t events_ = 0;
    uint64_t bytes_ = 0;
    std::string path_;
    std::string error_;
    std::string buffer_;
    std::string scratch_;
    EventBlockEncoder block_;
};

}  // namespace allocscope
