// What a report says about one trace, computed in one or two passes over
// its events, streamed (TraceStream), never all held: per (layer, phase) accounting,
// the memory timeline with phase bands and step markers, the pools' peaks,
// and the allocation sites that hold memory at the peak and at exit. The
// renderers (analyze/report.h) turn it into text, JSON and HTML; the CLI's
// `report` and `run` use them.
//
// The "owner" pool is where tensors are: the caching allocator's blocks
// when the trace has any, else device segments (every tensor is a
// cudaMalloc). Per-layer and per-site views are of the owner pool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <allocscope/sdk/tag_rules.h>

#include "replay.h"
#include "trace_reader.h"

namespace allocscope {

// Allocations made at one stack: how many, how many bytes.
struct StackBytes {
    uint32_t stack = 0;  // 0: no stack captured
    uint64_t bytes = 0;
    uint64_t count = 0;

    bool operator==(const StackBytes&) const = default;
};

// One (layer, phase) tag, by the text of its layer and phase.
struct TagStats {
    std::string layer;  // "" untagged
    std::string phase;
    uint64_t allocated_bytes = 0;  // owner pool, over the whole trace
    uint64_t allocations = 0;
    uint64_t scopes = 0;  // times the tag was pushed
    // Bytes allocated inside one scope of the tag (on its thread, directly
    // under it) still alive when that scope ended: the largest over its
    // scopes, and how many scopes ended with anything of theirs alive.
    uint64_t retained_max = 0;
    uint64_t retained_scopes = 0;
    uint64_t at_peak = 0;  // its live bytes at the owner pool's peak
    uint64_t count_at_peak = 0;
    uint64_t at_exit = 0;  // live at the end of the trace
    // Where its bytes were allocated: the stacks with the most, largest
    // first (AnalysisOptions::tag_sites of them).
    std::vector<StackBytes> sites;

    bool operator==(const TagStats&) const = default;
};

struct PoolSummary {
    Pool pool = Pool::device_segment;
    uint64_t allocations = 0;
    uint64_t allocated_bytes = 0;
    uint64_t peak_bytes = 0;
    uint64_t peak_seq = 0;
    uint64_t peak_t_ns = 0;
    uint64_t peak_step = 0;
    std::string peak_layer;  // the tag of the allocation that reached the peak
    std::string peak_phase;
    uint64_t live_bytes_at_exit = 0;
    uint64_t live_count_at_exit = 0;

    bool operator==(const PoolSummary&) const = default;
};

// A base phase ("forward", "backward", "optimizer", ...) on the training
// thread (the one that pushed the most tags) from t_start to t_end.
struct PhaseBand {
    std::string phase;
    uint64_t seq_start = 0, seq_end = 0;
    uint64_t t_start_ns = 0, t_end_ns = 0;

    bool operator==(const PhaseBand&) const = default;
};

struct StepMark {
    uint64_t step = 0;
    uint64_t seq = 0;
    uint64_t t_ns = 0;

    bool operator==(const StepMark&) const = default;
};

struct TimelinePoint {
    uint64_t seq = 0;
    uint64_t t_ns = 0;
    uint64_t segment_bytes = 0;  // device segments
    uint64_t block_bytes = 0;
    std::vector<uint64_t> layer_bytes;  // owner pool, per Timeline::layers
    // Per Timeline::layers: its largest live allocations then, largest
    // first, as indices into Timeline::allocations.
    std::vector<std::vector<uint32_t>> largest;

    bool operator==(const TimelinePoint&) const = default;
};

// An owner-pool allocation the timeline names (one of a layer's largest at
// a sample); each once, however many samples it is live in.
struct TimelineAllocation {
    uint64_t seq = 0;  // of its allocation
    uint64_t size = 0;
    uint64_t step = 0;
    uint32_t stack = 0;
    std::string layer;
    std::string phase;

    bool operator==(const TimelineAllocation&) const = default;
};

// Live bytes over the trace, at most `points` samples: each sample is the
// moment of the largest owner-pool total within its stretch of events, so
// peaks are never sampled away.
struct Timeline {
    // Numbered layers ("layers.3") or whole module names, the largest by
    // their own peak; the last entry is "(other)" when some were folded.
    std::vector<std::string> layers;
    std::vector<TimelinePoint> points;
    std::vector<PhaseBand> bands;
    std::vector<StepMark> steps;
    std::vector<TimelineAllocation> allocations;

    bool operator==(const Timeline&) const = default;
};

struct Site {
    uint32_t stack = 0;  // the trace's stack id, 0: no stack captured
    uint64_t bytes = 0;
    uint64_t count = 0;
    // The tag holding most of its bytes.
    std::string layer;
    std::string phase;

    bool operator==(const Site&) const = default;
};

// Live owner-pool bytes of one (layer, phase) at a moment.
struct TagLive {
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;

    bool operator==(const TagLive&) const = default;
};

// An out-of-memory moment: a request the program saw fail, with what was
// live when it did. Failed requests of one thread that follow each other
// (nothing allocated in between) are one episode: a runtime or driver call
// that failed, the allocator freeing its cache and retrying, then its
// verdict. The episode's moment is the caching allocator's verdict (an oom
// event at level block) when there is one, else its last failed call. An
// episode without a verdict that ends with a successful allocation on the
// thread was recovered from (the allocator retried) and is not a moment.
// Only failures for want of memory count (result 2: cudaErrorMemoryAllocation,
// CUDA_ERROR_OUT_OF_MEMORY), not calls refused as invalid.
struct OomMoment {
    uint64_t seq = 0;
    uint64_t t_ns = 0;
    uint64_t step = 0;
    uint32_t tid = 0;
    std::string layer;  // the failing request's tag
    std::string phase;
    // Where the request has no layer (autograd's and the optimizer's own
    // work between module hooks, FSDP's collectives): the layer of the last
    // event of the same step that had one, on any thread. "" where none.
    std::string last_layer;
    std::string last_phase;
    // The parameter the thread was processing, where the program said
    // (allocscope_oom_parameter, after the failure on the same thread and
    // step): "layers.3.fc1.weight", "" where none; parameter_count > 1: the
    // first of that many processed together.
    std::string parameter;
    uint64_t parameter_count = 0;
    uint32_t stack = 0;  // the failing request's stack, 0: none
    uint64_t requested = 0;
    int32_t device = -1;
    uint64_t device_free = 0;   // as the allocator measured it, 0: not known
    std::string api;            // the failing call (allocscope_block_alloc: the allocator)
    bool by_allocator = false;  // the caching allocator's verdict (level block)
    bool continued = false;     // the thread allocated again afterwards (caught, retried)
    uint64_t failed_calls = 0;  // failed runtime/driver calls of the episode
    // At that moment: the owner pool's live bytes (allocated) and, when the
    // owner is the caching allocator's blocks, the device segments holding
    // them (reserved; reserved - allocated is cached but unallocated).
    uint64_t allocated = 0;
    uint64_t allocated_count = 0;
    // reserved: the segments that have held a block (the caching
    // allocator's); what libraries took for themselves (a workspace through
    // cudaMalloc, plain driver calls such as cuMemAlloc_v2: cuBLAS
    // workspaces, NCCL buffers) is outside_allocator, which PyTorch's own
    // counters and its OOM message leave out too.
    uint64_t reserved = 0;
    // Which of the two allocscope saw: blocks give both; stream-ordered
    // segments (backend:cudaMallocAsync), or a program's own cudaMalloc,
    // are allocated; a caching allocator's plain segments whose blocks were
    // not seen (PyTorch without the bridge) are reserved.
    bool allocated_known = true;
    bool reserved_known = false;
    uint64_t outside_allocator = 0;
    // The segment PyTorch's native allocator asks the device for to place
    // the requested block (its "Tried to allocate" figure): 2 MiB for
    // blocks up to 1 MiB, 20 MiB below 10 MiB, else the request rounded up
    // to 2 MiB (c10/cuda/CUDACachingAllocator.cpp, get_allocation_size).
    // 0 where that rule does not apply: not the allocator's verdict, or its
    // segments are mapped (expandable segments).
    uint64_t segment_asked = 0;
    std::vector<TagLive> by_tag;  // largest first
    std::vector<Site> sites;      // largest first
    // The seqs of the owner-pool allocations live then, ascending: a
    // finding's evidence is part of the moment when its alloc_seq is here.
    std::vector<uint64_t> live_seqs;

    bool operator==(const OomMoment&) const = default;
};

// The program's allocator, as its own counters say and as allocscope
// replays it, at one ALLOCSCOPE_COUNTERS_MARK mark (a step boundary).
struct CounterCheck {
    uint64_t step = 0;
    uint64_t seq = 0;
    int32_t device = -1;
    // The allocator's counters: its blocks in use and the segments it holds
    // (torch.cuda.memory_allocated, memory_reserved), and the device memory
    // in use by the driver's count (0: not known).
    uint64_t allocated = 0;
    uint64_t reserved = 0;
    uint64_t device_used = 0;
    // allocscope's at the mark, by the rules of OomMoment: live blocks (or,
    // without blocks, the segments), the segments that have held a block,
    // and the rest of the device segments (outside the allocator).
    uint64_t seen_allocated = 0;
    uint64_t seen_reserved = 0;
    uint64_t seen_outside = 0;
    // What could be compared: allocated where blocks (or stream-ordered
    // segments) were seen, reserved where segments are the allocator's reserve.
    bool allocated_compared = true;
    bool reserved_compared = false;

    bool agrees() const {
        return (!allocated_compared || seen_allocated == allocated) &&
               (!reserved_compared || seen_reserved == reserved);
    }

    bool operator==(const CounterCheck&) const = default;
};

// What a bounded trace (allocscope run --max-trace-size) dropped: from its
// last kBoundedMark (core/trace_bound.h).
struct BoundedSummary {
    uint64_t gaps = 0;            // marks: 1 in a trace compacted any number of times
    uint64_t events_dropped = 0;  // over the whole run
    uint64_t bytes_dropped = 0;
    uint64_t last_step_before = 0;     // the step of the last event before the gap
    uint64_t first_step_after = 0;     // the step the kept tail starts in
    uint64_t carried_allocations = 0;  // carried allocs (live where the tail starts)
    uint64_t carried_bytes = 0;
    uint64_t carried_scopes = 0;  // carried tag_push events

    bool operator==(const BoundedSummary&) const = default;
};

struct CounterSummary {
    uint64_t checks = 0;  // marks set against the replay
    uint64_t agree = 0;
    // Marks not compared: the process allocated on more than one device
    // (the replay's totals are the process's).
    uint64_t uncompared = 0;
    std::optional<CounterCheck> first_difference;
    std::optional<CounterCheck> last;  // the run's last compared mark

    bool operator==(const CounterSummary&) const = default;
};

struct AnalysisOptions {
    size_t timeline_points = 800;
    size_t timeline_layers = 12;
    // Per layer and sample (TimelinePoint::largest); 0 saves a pass.
    size_t timeline_allocations = 3;
    size_t tag_sites = 3;  // TagStats::sites
    size_t top_sites = 10;
    size_t oom_tags = 12;    // (layer, phase) rows of an OOM moment
    size_t oom_moments = 4;  // the last this many moments are kept in full
};

struct TraceAnalysis {
    std::string path;
    TraceHeader header;
    bool truncated = false;
    std::string truncation_message;
    uint64_t events = 0;
    uint64_t span_ns = 0;
    uint64_t unknown_frees = 0;
    uint64_t double_frees = 0;
    uint64_t failed_frees = 0;
    uint64_t oom_events = 0;
    uint64_t largest_failed_request = 0;
    uint64_t steps = 0;  // distinct steps seen
    struct Count {
        std::string what;
        uint64_t n = 0;
        bool operator==(const Count&) const = default;
    };
    std::vector<Count> events_by_kind;  // "alloc block", "tag_push", ...
    std::vector<Count> calls_by_api;    // allocation calls: "cudaMalloc", ...
    // Frees that found nothing to free, by outcome and api: "unknown
    // cuMemUnmap", "double cuMemRelease", ... (where unknown_frees and
    // double_frees come from).
    std::vector<Count> odd_frees;

    Pool owner = Pool::device_segment;
    uint32_t main_tid = 0;           // the training thread (trace_shape)
    std::vector<PoolSummary> pools;  // those with allocations
    // The blocks of CUDA graphs' private pools, also counted in their pool
    // above; live_bytes and live_count at exit.
    Replay::GraphPoolTotals graph_pools;
    std::vector<TagStats> tags;  // by allocated bytes, largest first
    Timeline timeline;
    std::vector<Site> sites_at_peak;  // by bytes, largest first
    std::vector<Site> sites_at_exit;
    // Out-of-memory moments, in order: the last options.oom_moments of
    // oom_moments_total. recovered_failures counts the failed calls of
    // episodes the allocator recovered from.
    std::vector<OomMoment> ooms;
    uint64_t oom_moments_total = 0;
    uint64_t recovered_failures = 0;
    CounterSummary counters;  // the self-check against the allocator's counters
    BoundedSummary bounded;   // what a bounded trace dropped (gaps 0: nothing)
    // The owner pool's live bytes when each step began (its first step
    // event), in order; and by layer group ("layers.3", layer_group) when
    // the trace's last step began. What ranks are compared at
    // (imbalance_findings).
    std::vector<std::pair<uint64_t, uint64_t>> step_starts;  // step, live bytes
    std::vector<std::pair<std::string, uint64_t>> groups_at_last_step;

    const PoolSummary* pool(Pool p) const;

    bool operator==(const TraceAnalysis&) const = default;
};

struct StepMemory;  // analyze/diff.h

// Two passes over the events (TraceStream; one where the event count is
// known before the first, the samples' largest allocations included):
// memory is the live set, the trace's
// tables and what the analysis keeps, whatever the event count. `steps`,
// when given, gets the trace's step_memory (analyze/diff.h) from the
// accounting's pass, without a pass of its own.
TraceAnalysis analyze(TraceStream& trace, const AnalysisOptions& options = {},
                      std::vector<StepMemory>* steps = nullptr);
TraceAnalysis analyze(const Trace& trace, const AnalysisOptions& options = {});

// Where a trace's tensors are (the owner pool: blocks when the trace has any
// block allocation, else device segments) and which thread trains (the one
// that pushed the most forward-phase tags, then the most tags, the lowest id
// among equals; the first event's thread when none pushed any).
struct TraceShape {
    Pool owner = Pool::device_segment;
    uint32_t main_tid = 0;
};
TraceShape trace_shape(TraceStream& trace);
TraceShape trace_shape(const Trace& trace);

// trace_shape event by event: add() each event in order, with the tables
// (those so far do), then shape().
class ShapeCounter {
  public:
    void add(const Event& e, const TraceTables& tables) {
        // Inline: pushes are few.
        if (!any_event_) first_tid_ = e.tid, any_event_ = true;
        any_block_ |= e.kind == EventKind::alloc && e.level == Level::block;
        if (e.kind == EventKind::tag_push) add_push(e, tables);
    }
    TraceShape shape() const;
    // The tags `tid` pushed.
    uint64_t pushes(uint32_t tid) const;

  private:
    void add_push(const Event& e, const TraceTables& tables);
    bool any_event_ = false;
    bool any_block_ = false;
    uint32_t first_tid_ = 0;
    // Per thread: (forward-phase pushes, all pushes). The training thread
    // is the one that runs forward: PyTorch runs backward on autograd's
    // threads, which may push as many tags as the forward did.
    std::unordered_map<uint32_t, std::pair<uint64_t, uint64_t>> pushes_;
    std::vector<int8_t> forward_phase_;  // by string id, -1: not known yet
};

// base_phase(), the well-known phase a (sub-)phase belongs to, is
// allocscope/sdk/tag_rules.h's.

// The numbered layer of a module path: its shortest prefix whose last
// component is a number ("model.layers.3.mlp" -> "model.layers.3"); the
// whole path when no component is; "(untagged)" for "".
std::string layer_group(const std::string& layer);

}  // namespace allocscope
