// The reference test's comparison of two runs (docs/TE-FSDP2-FP8-MEMORY.md,
// "The reference test"), for any pair of traces of the same rank:
//
//   forward:  live bytes sampled when each numbered layer's forward ends
//             (the pop of a "layers.3" / "forward" scope on the training
//             thread, outside backward: not its sub-phases such as a
//             prefetch's "forward/all_gather", not a recomputation); the per-layer increment is the
//             difference to the previous layer's sample in the same step; the mean of the
//             increments of CAND minus that of BASE must not exceed the forward threshold (50 KiB);
//   backward: live bytes when backward begins (the first push of a backward
//             phase in the step) and when it ends (the first push of the
//             optimizer phase, else the step's end); the mean post-backward
//             minus post-forward delta of CAND minus BASE's must not exceed
//             the backward threshold (256 KiB).
//
// Live bytes are those of the owner pool (caching-allocator blocks, the
// analogue of memory_allocated(); device segments when a trace has no block
// events). The first measured step is dropped as warm-up when there are two
// or more. Besides the two checks, the excess of CAND over BASE per (layer,
// phase) of the bytes its scopes kept alive at their end. A run that ran
// out of memory is measured up to that moment: its last, incomplete step's
// backward is left out, and both renderings say where it stopped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis.h"
#include "trace_reader.h"

namespace allocscope {

struct RunMeasure {
    std::string path;
    int32_t rank = -1;
    // Forward: per layer position (the order layers end in a step), the
    // layer's name and its mean increment over the steps used; position 0
    // (the first layer) has no increment and is not listed.
    std::vector<std::string> layers;       // names by position, from 1
    std::vector<double> layer_increments;  // mean increment by position, from 1
    std::optional<double> forward_mean;    // mean over every increment used
    uint64_t forward_steps = 0;
    // Backward: mean post-backward − post-forward over the steps used.
    std::optional<double> backward_delta;
    uint64_t backward_steps = 0;
    bool warmup_dropped = false;
    // Every numbered layer whose forward ended in some step (first seen
    // first), and the steps the trace has samples in: what tells whether
    // two runs are of the same model and length.
    std::vector<std::string> forward_layers;
    uint64_t steps = 0;
    // Per (layer group, base phase): the most bytes one scope kept alive at
    // its end.
    struct Kept {
        std::string layer;
        std::string phase;
        uint64_t bytes = 0;
        bool operator==(const Kept&) const = default;
    };
    std::vector<Kept> kept;
    // The run ran out of memory (its last out-of-memory moment, analysis.h)
    // and did not go on: the step it happened in is incomplete, so its
    // backward is not measured (the layers whose forward ended still are).
    struct Oom {
        uint64_t step = 0;
        std::string layer;
        std::string phase;
        uint64_t requested = 0;
        bool operator==(const Oom&) const = default;
    };
    std::optional<Oom> oom;

    bool operator==(const RunMeasure&) const = default;
};

// One step's samples of live owner-pool bytes (see above): when each
// numbered layer's forward ended, in the order they ended, and when the
// step's backward began and ended.
struct StepMemory {
    uint64_t step = 0;
    std::vector<std::pair<std::string, uint64_t>> forward_ends;  // layer, live after its forward
    std::optional<uint64_t> after_forward;
    std::optional<uint64_t> after_backward;

    bool operator==(const StepMemory&) const = default;
};
// Every step of the trace that has one sample or more, in step order: one
// pass over its events given its shape (trace_shape), two without.
// analyze() gives the same from its accounting pass.
std::vector<StepMemory> step_memory(TraceStream& trace, std::optional<TraceShape> shape = {});
std::vector<StepMemory> step_memory(const Trace& trace);

// step_memory event by event, given the trace's shape and its complete
// tables (a pass after the first): add() each event in order with the
// owner pool's live bytes before and after it is replayed, then finish()
// with those at the end.
class StepCounter {
  public:
    StepCounter(const TraceTables& tables, TraceShape shape);
    // The training thread, where it was not known when constructed: before
    // any event of that thread's is added.
    void set_main_tid(uint32_t tid) noexcept { main_tid_ = tid; }
    void add(const Event& e, uint64_t live_before, uint64_t live) {
        // Inline: most events neither change the step nor push or pop.
        if (any_event_ && e.step != last_step_) end_step(last_step_, live_before);
        last_step_ = e.step;
        any_event_ = true;
        if (e.kind == EventKind::tag_push || e.kind == EventKind::tag_pop) add_tag(e, live);
    }
    std::vector<StepMemory> finish(uint64_t live);

  private:
    struct Frame {
        uint32_t layer, phase;
        bool backward;
    };
    // The step's entry; the last one is kept at hand (tags come step by step).
    StepMemory& step(uint64_t step);
    void end_step(uint64_t step, uint64_t live);
    // What a phase string is, known once per string id (every push asks):
    // its base phase backward or optimizer, or exactly "forward".
    enum PhaseClass : uint8_t {
        kPhaseOther = 0,
        kPhaseBackward = 1,
        kPhaseOptimizer = 2,
        kPhaseForwardExactly = 4,
        kPhaseUnknown = 0x80,
    };
    uint8_t phase_class(uint32_t phase);
    void add_tag(const Event& e, uint64_t live);
    // Whether the layer string is its own layer group ("layers.3", not
    // "layers.3.mlp").
    bool own_group(uint32_t layer);

    const TraceTables& t_;
    uint32_t main_tid_ = 0;
    std::map<uint64_t, StepMemory> steps_;
    StepMemory* current_ = nullptr;
    uint64_t current_step_ = 0;
    std::vector<Frame> stack_;          // the training thread's tags
    std::vector<int8_t> own_group_;     // by string id: -1 not known yet
    std::vector<uint8_t> phase_class_;  // by string id: kPhaseUnknown not known yet
    int open_backward_ = 0;
    uint64_t last_step_ = 0;  // the step of the last event added
    bool any_event_ = false;
};

// analyze's passes over the events (which give step_memory's too).
RunMeasure measure_run(TraceStream& trace);
RunMeasure measure_run(const Trace& trace);

struct DiffThresholds {
    uint64_t forward = 50 * 1024;
    uint64_t backward = 256 * 1024;
};

struct RankDiff {
    RunMeasure base;
    RunMeasure cand;
    std::optional<double> forward_excess;   // cand mean − base mean
    std::optional<double> backward_excess;  // cand delta − base delta
    bool forward_exceeded = false;
    bool backward_exceeded = false;
    struct Row {
        std::string layer;
        std::string phase;
        uint64_t base = 0;
        uint64_t cand = 0;
        int64_t excess = 0;
        // Whether the run has the layer at all (a scope of it, or its
        // forward): a layer only one run has is not "0 B" in the other.
        bool in_base = true;
        bool in_cand = true;
    };
    std::vector<Row> kept;  // by excess, largest first; only rows that differ
    // Why the two runs' numbers may not compare, one line each: layers only
    // one of them has, different numbers of steps.
    std::vector<std::string> notes;
    // Both runs have numbered layers and none in common: different models.
    bool unrelated = false;
};

RankDiff diff_runs(RunMeasure base, RunMeasure cand, const DiffThresholds& thresholds);

// `notes`: what concerns the runs as a whole (ranks only one of them has),
// printed first.
std::string diff_text(const std::vector<RankDiff>& diffs, const DiffThresholds& thresholds,
                      const std::vector<std::string>& notes = {});
std::string diff_json(const std::vector<RankDiff>& diffs, const DiffThresholds& thresholds,
                      const std::vector<std::string>& notes = {});

}  // namespace allocscope
