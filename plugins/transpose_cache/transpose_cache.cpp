// transpose-cache-retention: column-wise (transposed) forms of weights built
// in a layer's backward that outlive backward (TransformerEngine under
// FSDP2 with quantized parameters, problem 2 of
// docs/TE-FSDP2-FP8-MEMORY.md). Rules and options: plugins/README.md.
//
// Baseline-free, two kinds of evidence (common/weights.h). The backward
// ends at the first push of an optimizer-phase scope after it, the next
// forward-phase push, or the step change; what is still alive then is
// retained, per layer: the outermost backward scope on the allocating
// thread that encloses the parameter's module within its numbered layer,
// else the numbered layer.
// * proven: an allocation made in backward (any backward sub-phase, e.g.
//   backward/all_gather, or an untagged thread during backward) that a
//   DERIVED event declares derived from a registered parameter, whatever
//   its tag and size; it belongs to its parameter's layer (the scope above
//   on the allocating thread when the declaration comes). Errors come from
//   these only.
// * size-only: an allocation made in backward under a parameter's module
//   (or a sub-module) whose size is one of that parameter's FP8-family
//   weight-derived sizes, full or per shard
//   (allocscope/sdk/weight_sizes.h; no bf16 2·numel size: in backward that is the
//   weight's gradient), with no provenance; a scale-sized one only when its
//   module also keeps a data-sized one. Sizes alone are ambiguous (a
//   sharded bf16 gradient is an FP8 transpose in bytes): info findings
//   only.
// Per layer and kind the backward that retained the most is reported (max
// over steps).
//
// Baseline mode: the reference test's (allocated after backward) −
// (allocated after forward), run minus baseline, against backward_threshold.
#include <allocscope/sdk/adapter.h>
#include <allocscope/sdk/finding.h>
#include <allocscope/sdk/format.h>
#include <allocscope/sdk/tag_rules.h>
#include <allocscope/sdk/weight_params.h>
#include <allocscope/sdk/weight_sizes.h>

#include <map>

#include "common/weights.h"

namespace allocscope::plugins {
namespace {

// The reference test's limit after the fix (256 KiB before it): a
// quantized-init run's last all-gather buffer, alive after forward and
// smaller in FP8 than in bf16, makes a healthy run's delta exceed a bf16
// baseline's by ~770 KiB (plugins/README.md).
constexpr uint64_t kDefaultBackwardThreshold = 1048576;
constexpr uint64_t kDefaultMinNumel = 4096;

class TransposeCacheRetention final : public WeightDetector {
  public:
    explicit TransposeCacheRetention(const allocscope_host_v2& host)
        : WeightDetector(
              host, "backward_threshold", kDefaultBackwardThreshold,
              WeightSizeRules{.bf16_copy = false,
                              .sharded = true,
                              .world = host.world_size > 0 ? uint64_t(host.world_size) : 0,
                              .gradients = true},
              kDefaultMinNumel) {}

    void on_step(uint64_t /*step*/, uint32_t source) {
        enter(source);
        // The step change ends a backward that no optimizer scope ended.
        end_backward_measure();
        end_backward();
    }

    void finish() {
        // The stream's last backward, when every backward scope was left
        // (the run ended after it, with no optimizer step or forward to
        // end it). A backward scope still open (a process killed in
        // backward) shows nothing was over: not judged.
        if (source_ == ALLOCSCOPE_SOURCE_RUN && !backward_open()) end_backward();
        log_if_no_params();
        if (host_.has_baseline && emit_baseline_comparison()) return;
        emit_per_layer();
    }

  private:
    struct Frame {
        uint32_t layer = 0;
        bool backward = false;
    };
    struct Candidate {
        uint64_t address;
        uint64_t seq;
        uint32_t layer;   // the layer whose backward made it
        uint32_t module;  // the allocation's layer tag
        bool data;
    };
    // Live bytes at the end of forward and of backward, per step.
    struct StepDelta {
        bool has_forward_end = false;
        bool has_backward_end = false;
        uint64_t after_forward = 0;
        uint64_t after_backward = 0;
    };
    struct Mean {
        double bytes = 0;
        uint64_t steps = 0;
        bool warmup_excluded = false;
    };

    std::map<uint64_t, StepDelta>& deltas() {
        return deltas_[source_ == ALLOCSCOPE_SOURCE_BASELINE];
    }

    void enter(uint32_t source) override {
        if (source == source_) return;
        // Like finish: a backward the baseline's stream ends in is not
        // measured (no optimizer scope or step change showed it was over).
        measuring_ = false;
        threads_.clear();
        live_.clear();
        window_.clear();
        proven_window_.clear();
        in_backward_ = false;
        level_.reset();
        source_ = source;
    }

    void on_alloc(const allocscope_event_v2& e) override {
        bool switched = false;
        if (!level_.follow(e, &switched)) return;
        if (switched) {
            live_.clear();
            window_.clear();
            proven_window_.clear();
        }
        if (!analyzing()) return;
        live_.erase(e.address);  // a record left at this address is stale (missed free)
        const bool tagged = base_phase(e.phase) == backward_;
        // Untagged: another thread's work while backward runs.
        if (!tagged && !(in_backward_ && strings_.tag(e.phase) == 0)) return;
        if (!in_backward_) {  // the stream began inside backward: no push opened it
            in_backward_ = true;
            backward_step_ = e.step;
        }
        const uint32_t module = strings_.tag(e.layer);
        std::optional<WeightParams::Match> m;
        if (tagged && module != 0 && matching_sizes()) m = params_.match(module, e.size);
        if (m) {
            window_.push_back(
                {e.address, e.seq,
                 layer_of(e.tid, params_.module(m->param), params_.numbered(m->param)), module,
                 m->data});
        }
        record(e, module, m);
    }

    // Attributed now: the allocating thread's scopes are those it was made
    // under (the declaration follows the allocation).
    void on_proven(const Proven& p) override {
        proven_window_.push_back({p.address, p.seq, layer_of(p.tid, p.module, p.numbered)});
    }

    void on_push(const allocscope_event_v2& e) override {
        Thread& t = threads_[e.tid];
        const uint32_t phase = base_phase(e.phase);
        if (phase == backward_) {
            if (!in_backward_) {
                in_backward_ = true;
                backward_step_ = e.step;
                // The first backward scope of the step: forward is over.
                StepDelta& d = deltas()[e.step];
                if (!d.has_forward_end) {
                    d.has_forward_end = true;
                    d.after_forward = live_bytes();
                    measuring_step_ = e.step;
                    measuring_ = true;
                }
            }
        } else if (phase == optimizer_) {
            end_backward_measure();
            end_backward();
        } else if (phase == forward_ && t.open_backward == 0) {
            // The next forward (same step: gradient accumulation); a forward
            // scope inside a backward scope is activation recomputation.
            end_backward();
        }
        const bool backward = phase == backward_;
        t.open_backward += backward;
        t.frames.push_back({strings_.tag(e.layer), backward});
    }

    void on_pop(const allocscope_event_v2& e) override {
        auto it = threads_.find(e.tid);
        if (it == threads_.end() || it->second.frames.empty()) return;
        it->second.open_backward -= it->second.frames.back().backward;
        it->second.frames.pop_back();
    }

    // Whether any thread is inside a backward scope.
    bool backward_open() const {
        for (const auto& [tid, t] : threads_) {
            if (t.open_backward > 0) return true;
        }
        return false;
    }

    // The layer whose backward made an allocation derived from a parameter
    // of `module` (numbered layer `numbered`): the outermost backward scope
    // on the thread that encloses the module within its numbered layer;
    // without one, the numbered layer (or the module itself).
    uint32_t layer_of(uint32_t tid, uint32_t module, uint32_t numbered) {
        auto it = threads_.find(tid);
        if (it != threads_.end()) {
            const Frame* f = enclosing_scope(it->second.frames, module, numbered,
                                             [](const Frame& g) { return g.backward; });
            if (f) return f->layer;
        }
        return numbered != 0 ? numbered : module;
    }

    // The end of backward for the baseline comparison: the first optimizer
    // scope after it, or the step change.
    void end_backward_measure() {
        if (!measuring_) return;
        StepDelta& d = deltas()[measuring_step_];
        d.has_backward_end = true;
        d.after_backward = live_bytes();
        measuring_ = false;
    }

    // Backward is over: proven allocations still alive are retained, and
    // size-matched candidates (scale-sized ones only where their module
    // keeps a data-sized one of this backward); records of backward nothing
    // was learnt about are dropped.
    void end_backward() {
        if (!in_backward_) return;
        in_backward_ = false;
        Grouped proven;
        for (const ProvenCandidate& p : proven_window_) {
            Record* r = alive(p.address, p.seq);
            if (!r) continue;
            r->state = State::kept;
            proven.add(p.layer, held(*r));
        }
        proven_window_.clear();
        Grouped sized;
        retain_alive(window_, [&](const Candidate& c, WeightHeld ev) { sized.add(c.layer, ev); });
        window_.clear();
        dismiss_pending();
        proven.record(proven_, backward_step_);
        sized.record(sized_, backward_step_);
    }

    // One backward's retained allocations by layer, layers in the order
    // they retained.
    struct Grouped {
        std::vector<uint32_t> order;
        std::unordered_map<uint32_t, std::vector<WeightHeld>> by_layer;
        void add(uint32_t layer, WeightHeld h) {
            auto [slot, inserted] = by_layer.try_emplace(layer);
            if (inserted) order.push_back(layer);
            slot->second.push_back(std::move(h));
        }
        void record(RetentionByLayer& table, uint64_t step) {
            for (uint32_t layer : order)
                table.record(layer, step, std::move(by_layer[layer]));
        }
    };

    // Mean over the steps after the first (the warm-up) of after_backward −
    // after_forward.
    static std::optional<Mean> mean_delta(const std::map<uint64_t, StepDelta>& steps) {
        std::vector<const StepDelta*> complete;
        for (const auto& [step, d] : steps) {
            if (d.has_forward_end && d.has_backward_end) complete.push_back(&d);
        }
        if (complete.empty()) return std::nullopt;
        Mean m;
        m.warmup_excluded = drop_warmup(complete);
        double sum = 0;
        for (const StepDelta* d : complete)
            sum += double(int64_t(d->after_backward) - int64_t(d->after_forward));
        m.steps = complete.size();
        m.bytes = sum / double(m.steps);
        return m;
    }

    bool emit_baseline_comparison() {
        const std::optional<Mean> b = mean_delta(deltas_[1]);
        const std::optional<Mean> r = mean_delta(deltas_[0]);
        if (!b || !r) {
            log_no_baseline(b.has_value(),
                            "no complete backward (a backward scope, then an optimizer scope or a "
                            "step change)");
            return false;
        }
        const double excess = r->bytes - b->bytes;
        if (!(excess > double(threshold_))) return true;
        Finding f = baseline_finding("backward", excess,
                                     [](uint32_t) { return std::string("alive after backward"); });
        const std::vector<uint32_t> layers = retained_layers();
        f.layer = common_layer(layers);
        auto describe = [](const Mean& m, const char* what) {
            return format_signed_bytes(m.bytes) + " (" + what + ", " +
                   steps_basis(m.steps, m.warmup_excluded);
        };
        f.summary = "memory_allocated after backward minus after forward is " +
                    describe(*r, "run") + " against " + describe(*b, "baseline") + ": " +
                    format_signed_bytes(excess) + ", over the threshold of " +
                    format_bytes(threshold_);
        if (f.count > 0) {
            f.summary +=
                "; weight-derived allocations alive after backward: " + std::to_string(f.count) +
                " in " + std::to_string(layers.size()) +
                (layers.size() == 1 ? " layer" : " layers");
        }
        emit(host_, f);
        return true;
    }

    void emit_per_layer() {
        for (const RetentionByLayer::Entry& e : proven_.entries()) {
            Finding f = layer_finding(e, true, "backward", "alive after backward");
            f.summary = format_bytes(e.bytes) + " of allocations derived from " + f.layer +
                        "'s weights (" + std::to_string(e.count) + ") made in " + f.layer +
                        "'s backward are alive after backward ended (step " +
                        std::to_string(e.step) + "; " + retained_after(e) + ")";
            note_statistics_only(f);
            emit(host_, f);
        }
        for (const RetentionByLayer::Entry& e : sized_.entries()) {
            Finding f = layer_finding(e, false, "backward", "alive after backward");
            f.summary =
                format_bytes(e.bytes) + " in " + std::to_string(e.count) +
                " allocations whose sizes match column-wise/transposed forms or scales of " +
                f.layer + "'s weights are alive after backward ended (step " +
                std::to_string(e.step) + "; " + retained_after(e) +
                "); size alone does not show they are weight-derived (a sharded bf16 "
                "gradient has an FP8 transpose's size): " +
                how_to_settle();
            emit(host_, f);
        }
    }

    static std::string retained_after(const RetentionByLayer::Entry& e) {
        return "retained after " + std::to_string(e.windows) +
               (e.windows == 1 ? " backward" : " backwards");
    }

    struct Thread {
        std::vector<Frame> frames;
        uint32_t open_backward = 0;
    };
    std::unordered_map<uint32_t, Thread> threads_;
    // A proven allocation of the backward in progress and its layer.
    struct ProvenCandidate {
        uint64_t address;
        uint64_t seq;
        uint32_t layer;
    };
    std::vector<Candidate> window_;  // size-matched candidates of the backward in progress
    std::vector<ProvenCandidate> proven_window_;
    bool in_backward_ = false;
    uint64_t backward_step_ = 0;

    std::map<uint64_t, StepDelta> deltas_[2];  // [0] run, [1] baseline
    bool measuring_ = false;                   // after_forward taken, after_backward not yet
    uint64_t measuring_step_ = 0;
};

}  // namespace
}  // namespace allocscope::plugins

ALLOCSCOPE_DEFINE_PLUGIN(
    allocscope::plugins::TransposeCacheRetention, "transpose-cache-retention",
    "weight-derived allocations (column-wise/transposed forms, scales) made in a layer's backward "
    "that are still alive after backward (at the optimizer step or the next forward)",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_PUSH) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_POP) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_MARK) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_DERIVED));
