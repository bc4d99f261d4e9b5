// Exports of recorded traces for other tools (`allocscope export`):
//
//   * Perfetto / Chrome trace-event JSON: per rank a process ("rank R") with
//     counter tracks of live bytes per pool and per layer group (of the
//     owner pool, see analyze/analysis.h), the tag scopes of every thread as
//     nested slices, step markers, and the findings as instant events;
//   * collapsed stacks (flamegraph.pl, speedscope): the owner pool's live
//     allocations at its peak, "layer;phase;outermost;...;innermost BYTES";
//   * a PyTorch memory snapshot pickle (torch.cuda.memory._snapshot()'s
//     dictionary) for torch.cuda._memory_viz and pytorch.org/memory_viz;
//   * a Hive-partitioned Parquet dataset of the events, stacks, live bytes
//     at the peak, ranks and findings of many runs, written through DuckDB
//     (ParquetExport).
//
// Every export replays the events through Replay (core/replay.h), so live
// and peak bytes are the ones the reports show. Every export streams its
// traces (TraceStream, a few passes each) and holds the live set, the
// tables and what it writes, never the events. Each takes a `const Trace&`
// too (tests), read through the same code.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "findings.h"
#include "live_table.h"
#include "replay.h"
#include "trace_reader.h"

namespace allocscope {

class Symbolizer;

// `progress(done, total)` as an export goes through a trace's events.
using ExportProgress = std::function<void(size_t, size_t)>;

// Where an export goes: a file, written in chunks as the buffer fills, or
// memory (file nullptr; str() is the whole output). Write errors throw
// std::runtime_error naming `name` and the reason.
class ExportWriter {
  public:
    explicit ExportWriter(std::FILE* file = nullptr, std::string name = "output");
    ExportWriter(const ExportWriter&) = delete;
    ExportWriter& operator=(const ExportWriter&) = delete;

    void put(std::string_view text) {
        buffer_.append(text);
        if (file_ && buffer_.size() >= kChunk) drain();
    }
    void put(char c) {
        buffer_ += c;
        if (file_ && buffer_.size() >= kChunk) drain();
    }
    // Writes what is buffered to the file (and fflush()es it).
    void flush();
    uint64_t bytes() const noexcept { return written_ + buffer_.size(); }
    const std::string& str() const noexcept { return buffer_; }

  private:
    static constexpr size_t kChunk = size_t{1} << 20;
    void drain();

    std::FILE* file_;
    std::string name_;
    std::string buffer_;
    uint64_t written_ = 0;
};

// One frame of an exported stack.
struct ExportFrame {
    std::string name;  // the function; the raw text ("module+0x1a2b", "0x7f...") when unknown
    std::string file;  // the source file; the module path when unknown; "" when neither
    uint32_t line = 0;
    std::string text;  // SymbolizedFrame::text(): "function (file:line)", ...
};

// Frames by stack id (index = the trace's stack id), innermost first; empty
// for stack 0 and for stacks that were not asked for.
using StackFrames = std::vector<std::vector<ExportFrame>>;

// Symbolizes the stacks `ids` of `trace` (each address once; `progress` as
// it goes).
StackFrames symbolize_stacks(const TraceTables& trace, Symbolizer& symbolizer,
                             std::span<const uint32_t> ids, const ExportProgress& progress = {});
// The same without module files: every frame is its raw address text.
StackFrames raw_stacks(const TraceTables& trace, std::span<const uint32_t> ids);

// --- Perfetto / Chrome trace-event JSON ----------------------------------------

// {"displayTimeUnit": "ms", "traceEvents": [...]}: ts in microseconds since
// `base_wall_ns` (the earliest start of the traces exported together, so
// ranks line up), pid = rank (the process id for a trace without a rank),
// tid = the recording thread. Per trace:
//   * "M" process_name "rank R" (and process_sort_index), thread_name;
//   * "C" counters "pool: <segment|block|host-pinned>" and "layer: <group>"
//     (layer_group() of the owner pool's allocations), args {"bytes": N}: a
//     sample at the trace start (0) and one at every change;
//   * "B"/"E" slices of tag scopes (push/pop) per thread, named
//     "layer (phase)", args {layer, phase, step}; scopes still open when the
//     trace ends are closed there, innermost first;
//   * "i" instants (thread scope): "step N" at step changes (cat "step"), and
//     one per finding (cat "finding", "<severity>: <plugin>", args with the
//     finding) at its first evidence's allocation, else at the trace end;
//     one per failed request (cat "oom"): "out of memory" for a caching
//     allocator's verdict, "failed allocation" for a runtime or driver call,
//     with the requested size, device free bytes, api, tag and step.
class PerfettoExport {
  public:
    PerfettoExport(ExportWriter& out, uint64_t base_wall_ns);
    // `findings`: this trace's (the caller picks them by rank). Two passes
    // over the events.
    void add(TraceStream& trace, std::span<const Finding* const> findings,
             const ExportProgress& progress = {});
    void add(const Trace& trace, std::span<const Finding* const> findings,
             const ExportProgress& progress = {});
    // Closes the document; nothing may be added after.
    void finish();

  private:
    ExportWriter& out_;
    uint64_t base_wall_ns_;
    bool first_ = true;
    bool finished_ = false;
};

// --- Collapsed stacks ------------------------------------------------------------

// The owner pool's live allocations at the moment of its peak (the first
// event that reached it): Replay's peak, so the sizes add up to peak_bytes.
struct PeakSnapshot {
    Pool owner = Pool::device_segment;
    uint64_t peak_bytes = 0;
    uint64_t peak_seq = 0;
    std::vector<LiveRecord> live;  // by address
};
// Two passes: the second ends at the peak.
PeakSnapshot live_at_peak(TraceStream& trace);
PeakSnapshot live_at_peak(const Trace& trace);

// The stack ids of `snapshot`'s allocations (sorted, without 0).
std::vector<uint32_t> stack_ids(std::span<const LiveRecord> records);

// Folded stacks, one line per (layer, phase, stack): "layer;phase;frame;...
// ;frame BYTES", frames outermost first. An empty layer is "(untagged)", an
// empty phase "(no phase)"; a missing stack leaves only layer;phase. ';' in
// a name becomes ',' and control characters become ' '. Traces added
// together are summed line by line (each at its own peak).
class CollapsedExport {
  public:
    void add(const TraceTables& trace, const PeakSnapshot& snapshot, const StackFrames& frames);
    void write(ExportWriter& out) const;  // sorted by line
    const std::map<std::string, uint64_t>& lines() const noexcept { return lines_; }

  private:
    std::map<std::string, uint64_t> lines_;
};

// --- PyTorch memory snapshot -------------------------------------------------------

// Stack ids of the device-memory events a memory-viz export shows (one pass).
std::vector<uint32_t> memory_viz_stacks(TraceStream& trace);
std::vector<uint32_t> memory_viz_stacks(const Trace& trace);

// A pickle (protocol 4) of torch.cuda.memory._snapshot()'s dictionary:
//   {"segments": [Segment], "device_traces": [[TraceEntry] per device]}
// Segments are the device segments live at the end of the trace, each with
// its blocks tiling it ("active_allocated" for live caching-allocator
// blocks inside it, "inactive" for the gaps); without block events each
// segment is one block. device_traces lists, in event order: block
// alloc -> "alloc", block free -> "free_requested" + "free_completed",
// segment alloc/free -> "segment_alloc"/"segment_free", failed allocations
// -> "oom" (device_free 0: not recorded). A block outside every live
// segment gets a segment of its own (segment_alloc before its alloc,
// segment_free after its free). Without block events every segment is also
// the block in it (segment_alloc + alloc, free_requested + free_completed +
// segment_free). Pinned host memory and frees that freed nothing are left
// out. Tagged entries carry "user_metadata" = "layer L, phase P, step S".
// One pass over the events, then one per device; what it holds is the live
// set (the segments at the end are what the last pass leaves live).
void export_memory_viz(TraceStream& trace, const StackFrames& frames, ExportWriter& out,
                       const ExportProgress& progress = {});
void export_memory_viz(const Trace& trace, const StackFrames& frames, ExportWriter& out,
                       const ExportProgress& progress = {});

// --- Parquet (through DuckDB) -----------------------------------------------------

struct TraceAnalysis;

// A Hive-partitioned Parquet dataset, DIR/<table>/run=<run>/rank=<rank>/
// part<N>_<i>.parquet, of the tables events, stacks, peak_live, ranks and
// findings (columns: docs/USAGE.md), for DuckDB, Spark, Polars, pyarrow and
// the like. Written by DuckDB's library, opened
// at run time (export_parquet.cpp): ALLOCSCOPE_DUCKDB names libduckdb.so,
// else the dynamic loader looks for it.
//
// Each add() goes into in-memory DuckDB tables and is written out at once
// (one trace in memory at a time); everything is written into a fresh 0700
// sibling of DIR that commit() renames to DIR, so a failed export leaves
// nothing at DIR. Errors throw std::runtime_error with one message (DuckDB
// not found and how to get it, DIR exists, DuckDB's own message).
class ParquetExport {
  public:
    // Loads DuckDB (first), then checks DIR: it must not exist, or be an
    // empty directory (which is replaced); its missing parents are created
    // (0700).
    explicit ParquetExport(std::string dir);
    ~ParquetExport();  // removes what was written unless committed
    ParquetExport(const ParquetExport&) = delete;
    ParquetExport& operator=(const ParquetExport&) = delete;

    // One trace of run `run`: its events, its stacks (`frames`: symbolized,
    // by stack id; a stack missing there is written as raw addresses), its
    // owner pool's live bytes at the peak by (layer, phase) and its row of
    // the ranks table, from `analysis` (analyze(trace)). One pass over the
    // events, which go into DuckDB's table as they come; each allocation's
    // free_seq is filled in there from the frees' alloc_seq.
    void add(const std::string& run, TraceStream& trace, const TraceAnalysis& analysis,
             const StackFrames& frames, const ExportProgress& progress = {});
    void add(const std::string& run, const Trace& trace, const TraceAnalysis& analysis,
             const StackFrames& frames, const ExportProgress& progress = {});
    // A run's findings, each in its own rank's partition.
    void add_findings(const std::string& run, std::span<const Finding> findings);
    // Renames the dataset to DIR.
    void commit();

    struct Rows {
        uint64_t events = 0, stack_frames = 0, peak_live = 0, traces = 0, findings = 0;
    };
    const Rows& rows() const noexcept;
    // "<path> <version>" of the DuckDB library in use.
    std::string library() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace allocscope
