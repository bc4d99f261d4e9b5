// Reads trace files written by TraceWriter. Every problem is reported with
// the file name and the byte offset of the record that shows it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "trace_format.h"

namespace allocscope {

class TraceError : public std::runtime_error {
  public:
    TraceError(std::string file, uint64_t offset, const std::string& problem);
    const std::string& file() const noexcept { return file_; }
    uint64_t offset() const noexcept { return offset_; }

  private:
    std::string file_;
    uint64_t offset_;
};

struct TraceRecord {
    // Events come one by one as `event` records, whichever the file holds
    // (version 2 event blocks are decoded transparently).
    RecordType type = RecordType::event;
    uint64_t offset = 0;  // byte offset of the record header in the file (an
                          // event's: that of its block)
    Event event;
    uint32_t id = 0;  // string / stack id
    std::string text;
    std::vector<uint64_t> frames;
    ModuleRecord module;
    ParamRecord param;
    FooterRecord footer;
};

// Streams records one by one, checking framing, CRCs and the format's
// invariants (see trace_format.h). Corruption throws TraceError. A trace that
// ends early is not an error for the reader: next() returns false and
// truncated() says where and why, so the complete prefix stays usable.
class TraceReader {
  public:
    explicit TraceReader(const std::string& path);  // throws TraceError
    ~TraceReader();
    TraceReader(const TraceReader&) = delete;
    TraceReader& operator=(const TraceReader&) = delete;

    const TraceHeader& header() const noexcept { return header_; }
    const std::string& path() const noexcept { return path_; }

    bool next(TraceRecord& record);
    // The next event of the current event block, checked, without a copy
    // (valid until the next call), or null: the block has no more, or its
    // next event is invalid (next() then throws its error).
    const Event* next_block_event() noexcept {
        return block_next_ < block_valid_ ? &block_[block_next_++] : nullptr;
    }
    // The current event block's next checked events, `most` of them at
    // most, without a copy (valid until the next call): empty where
    // next_block_event() would give none.
    std::span<const Event> next_block_events(uint64_t most) noexcept {
        const size_t n = size_t(std::min<uint64_t>(block_valid_ - block_next_, most));
        const Event* first = block_.get() + block_next_;
        block_next_ += n;
        return {first, n};
    }

    bool complete() const noexcept { return footer_seen_; }
    bool truncated() const noexcept { return truncated_; }
    uint64_t truncation_offset() const noexcept { return truncation_offset_; }
    // "<file>: trace ends ... at byte N" when truncated(), else empty.
    std::string truncation_message() const;

  private:
    void read_host();  // version 4: the host record after the header, if any
    [[noreturn]] void fail(uint64_t offset, const std::string& problem) const;
    bool read_exact(void* dst, size_t n);
    void decode(TraceRecord& record, const std::string& payload);
    // Checks an event against seq order and the definitions read so far,
    // one set of rules: event_problem names what is wrong with one that
    // follows `last_seq` (none: nothing; `ordered` false: the first event,
    // no order to keep), check_event throws where something is.
    enum class EventProblem { none, backwards, bad_enum, derived_too_old, undefined };
    inline EventProblem event_problem(const Event& e, bool ordered,
                                      uint64_t last_seq) const noexcept;
    void check_event(const Event& event, uint64_t offset);
    // Checks the current block's events at once, after the first, which is
    // checked here (it throws where that one is invalid); the others' error
    // waits until next() reaches them, the events before yielded.
    void check_block();

    std::string path_;
    std::FILE* file_ = nullptr;
    uint64_t offset_ = 0;
    TraceHeader header_;
    bool footer_seen_ = false;
    bool truncated_ = false;
    bool mid_record_ = false;
    uint64_t truncation_offset_ = 0;
    uint64_t last_seq_ = 0;
    bool any_event_ = false;
    uint32_t strings_defined_ = 1;  // id 0 is the implicit empty string
    uint32_t stacks_defined_ = 1;   // id 0 is "no stack"
    uint32_t params_defined_ = 0;
    std::string payload_;
    // The current event block, decoded into room for any block (allocated
    // with the first one): each block overwrites what it holds.
    std::unique_ptr<Event[]> block_;
    size_t block_size_ = 0;
    size_t block_next_ = 0;   // index of the next event of block_ to yield
    size_t block_valid_ = 0;  // the events before this index passed the checks
    uint64_t block_offset_ = 0;
    std::string block_problem_;
};

// Everything of a trace but its events: its header, its tables (strings,
// stacks, modules, params) and how it ended.
struct TraceTables {
    std::string path;
    TraceHeader header;
    std::vector<std::string> strings{std::string()};  // index = string id
    std::vector<std::vector<uint64_t>> stacks{{}};    // index = stack id
    std::vector<ModuleRecord> modules;
    std::vector<ParamRecord> params;  // index = param index
    std::optional<FooterRecord> footer;
    bool truncated = false;  // cut short or corrupt: the events are a prefix
    bool corrupt = false;    // a record after the header failed its checks
    std::string truncation_message;

    const std::string& str(uint32_t id) const { return strings.at(id); }
};

// A whole trace in memory, for tests and the exports.
struct Trace : TraceTables {
    std::vector<Event> events;
};

// A trace's events, in order, pass after pass, never all held: a Trace's
// in memory, or a file's read again for each pass (memory: the tables and
// one event block). A file's first pass also reads its tables and counts its
// events; a corrupt record ends the trace there, as in load_trace, and one
// before any event throws its TraceError (the trace is unreadable). Later
// passes give the same events: those the first one counted, even where the
// file has grown since. tables() is complete once a pass has ended; during
// the first it holds what the events so far refer to.
class TraceStream {
  public:
    explicit TraceStream(const Trace& trace) : memory_(&trace) {}
    // Reads the header: throws TraceError when it cannot be read.
    explicit TraceStream(const std::string& path);
    ~TraceStream();
    TraceStream(const TraceStream&) = delete;
    TraceStream& operator=(const TraceStream&) = delete;

    const TraceTables& tables() const noexcept { return memory_ ? *memory_ : tables_; }
    const std::string& path() const noexcept { return tables().path; }
    const TraceHeader& header() const noexcept { return tables().header; }
    // How many events a pass gives: known once a pass has ended.
    uint64_t size() const noexcept { return memory_ ? memory_->events.size() : count_; }
    bool counted() const noexcept { return memory_ != nullptr || counted_; }
    // How many events a pass is expected to give before one has ended: the
    // count once known, else the events the file's footer says its writer
    // wrote (a pass may find fewer, or more where events were dropped and
    // accounted for differently); none for a file without a footer.
    std::optional<uint64_t> expected_size() const;

    // Calls f(const Event&, const TraceTables&) for the first events while
    // it returns true, as for_each_until does (the tables: those the events
    // so far refer to), from a reader of its own: this stream's passes and
    // tables are untouched. A trace that cannot be read gives none.
    template <class F>
    void peek_until(F&& f) {
        if (memory_) {
            for (const Event& e : memory_->events)
                if (!f(e, static_cast<const TraceTables&>(*memory_))) return;
            return;
        }
        try {
            TraceStream other(tables_.path);
            other.for_each_until([&](const Event& e) { return f(e, other.tables()); });
        } catch (const std::exception&) {
        }
    }

    // Calls f(const Event&) for each event. The first pass throws TraceError
    // where a corrupt record comes before any event; a later pass where the
    // file no longer holds what the first one read.
    template <class F>
    void for_each(F&& f) {
        for_each_until([&f](const Event& e) {
            f(e);
            return true;
        });
    }

    // The same a run of events at a time: f(std::span<const Event>), in
    // order (a pass whose body is large runs its loop inside f, so that it
    // is entered once a block, not once an event).
    template <class F>
    void for_each_run(F&& f) {
        runs_until([&f](std::span<const Event> events) {
            f(events);
            return true;
        });
    }

    // The same while f(const Event&) returns true: a pass that stops there
    // (after a first one has counted the events) leaves the next to start
    // from the beginning again.
    template <class F>
    void for_each_until(F&& f) {
        runs_until([&f](std::span<const Event> events) {
            for (const Event& e : events)
                if (!f(e)) return false;
            return true;
        });
    }

  private:
    // The events a run at a time while f(std::span<const Event>) returns
    // true: the one loop of every pass above.
    template <class F>
    void runs_until(F&& f) {
        if (memory_) {
            f(std::span<const Event>(memory_->events));
            return;
        }
        start_pass();
        for (;;) {
            const std::span<const Event> events = next_events();
            if (events.empty() || !f(events)) return;
        }
    }
    void start_pass();
    // The next events, counted as given: the rest of the current block's
    // (inline, the common case) or else next()'s one; empty at the end.
    std::span<const Event> next_events() {
        if (reader_) {
            const std::span<const Event> events =
                reader_->next_block_events(counted_ ? count_ - given_ : UINT64_MAX);
            if (!events.empty()) {
                (counted_ ? given_ : count_) += events.size();
                return events;
            }
        }
        const Event* e = next();
        return e ? std::span<const Event>(e, 1) : std::span<const Event>();
    }
    const Event* next();
    // The first pass's end: how the trace ended, from the reader.
    void finish_first_pass();

    const Trace* memory_ = nullptr;
    TraceTables tables_;
    std::unique_ptr<TraceReader> reader_;
    bool reader_fresh_ = false;  // reader_ has read nothing past the header
    TraceRecord record_;
    bool counted_ = false;
    uint64_t count_ = 0;  // events: the first pass's count
    uint64_t given_ = 0;  // events given in this pass
};

// Throws TraceError when the file or its header cannot be read, or its
// first event cannot; a later corrupt record ends the trace there
// (truncated and corrupt set, the events before it kept).
Trace load_trace(const std::string& path);

// Whether the file at `path` ends in a footer record whose checksum holds:
// the process that wrote it closed it at its exit. Reads the header and the
// last record only; false for a file that cannot be read or is no trace.
bool ends_with_footer(const std::string& path) noexcept;
// That footer, where the file ends in one.
std::optional<FooterRecord> read_footer(const std::string& path) noexcept;

}  // namespace allocscope
