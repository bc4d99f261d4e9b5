// transpose-cache-retention: column-wise (transposed) forms of weights built
// in a layer's backward that outlive backward (TransformerEngine under
// FSDP2 with quantized parameters, problem 2 of
// docs/TE-FSDP2-FP8-MEMORY.md). Rules and options: plugins/README.md.
//
// Baseline-free: an allocation made in backward under a parameter's module
// (or a sub-module) whose size is one of that parameter's FP8-family
// weight-derived sizes, full or per shard (common/plugin.h,
// weight_derived_sizes; no bf16 2·numel size: in backward that is the
// weight's gradient) is a candidate of the backward it was made in. The
// backward ends at the first push of an optimizer-phase scope after it, the
// next forward-phase push, or the step change; the candidates still alive
// then are retained (a scale-sized one only when its module also keeps a
// data-sized one), per layer: the outermost backward scope on the
// allocating thread that encloses the parameter's module within its
// numbered layer. Per layer the backward that retained the most is
// reported (max over steps).
//
// Baseline mode: the reference test's (allocated after backward) −
// (allocated after forward), run minus baseline, against backward_threshold.
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
    explicit TransposeCacheRetention(const allocscope_host_v1& host)
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
        // A backward the stream ends in is not judged: nothing shows that
        // it was over.
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
        in_backward_ = false;
        level_.reset();
        source_ = source;
    }

    void on_alloc(const allocscope_event_v1& e) override {
        bool switched = false;
        if (!level_.follow(e, &switched)) return;
        if (switched) {
            live_.clear();
            window_.clear();
        }
        if (!analyzing()) return;
        uint32_t module = 0;
        const std::optional<WeightParams::Match> m = match_alloc(e, backward_, &module);
        if (!m) return;
        if (!in_backward_) {  // the stream began inside backward: no push opened it
            in_backward_ = true;
            backward_step_ = e.step;
        }
        window_.push_back({e.address, e.seq, layer_of(e.tid, m->param), module, m->data});
        follow(e, module);
    }

    void on_push(const allocscope_event_v1& e) override {
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

    void on_pop(const allocscope_event_v1& e) override {
        auto it = threads_.find(e.tid);
        if (it == threads_.end() || it->second.frames.empty()) return;
        it->second.open_backward -= it->second.frames.back().backward;
        it->second.frames.pop_back();
    }

    // The layer whose backward made an allocation derived from `param`: the
    // outermost backward scope on the thread that encloses the parameter's
    // module within its numbered layer; without one, the numbered layer (or
    // the module itself).
    uint32_t layer_of(uint32_t tid, uint32_t param) {
        auto it = threads_.find(tid);
        if (it != threads_.end()) {
            const Frame* f = enclosing_scope(it->second.frames, param,
                                             [](const Frame& g) { return g.backward; });
            if (f) return f->layer;
        }
        const uint32_t numbered = params_.numbered(param);
        return text(numbered).empty() ? params_.module(param) : numbered;
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

    // Backward is over: candidates still alive are retained (scale-sized
    // ones only where their module keeps a data-sized one of this backward).
    void end_backward() {
        if (!in_backward_) return;
        in_backward_ = false;
        std::vector<uint32_t> order;  // layers in the order they retained
        std::unordered_map<uint32_t, std::vector<HeldAlloc>> by_layer;
        retain_alive(window_, [&](const Candidate& c, HeldAlloc ev) {
            auto [slot, inserted] = by_layer.try_emplace(c.layer);
            if (inserted) order.push_back(c.layer);
            slot->second.push_back(std::move(ev));
        });
        window_.clear();
        for (uint32_t layer : order)
            retained_.record(layer, backward_step_, std::move(by_layer[layer]));
    }

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
        Finding f = baseline_finding("backward", excess);
        std::vector<uint32_t> layers;
        for (const RetentionByLayer::Entry& e : retained_.entries())
            layers.push_back(e.layer);
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
        for (const RetentionByLayer::Entry& e : retained_.entries()) {
            Finding f = layer_finding(e, "backward");
            f.summary = format_bytes(e.bytes) + " of weight-derived allocations (" +
                        std::to_string(e.count) +
                        ": column-wise/transposed forms or scales) made in " + f.layer +
                        "'s backward are alive after backward ended (step " +
                        std::to_string(e.step) + "; retained after " + std::to_string(e.windows) +
                        (e.windows == 1 ? " backward)" : " backwards)");
            emit(host_, f);
        }
    }

    struct Thread {
        std::vector<Frame> frames;
        uint32_t open_backward = 0;
    };
    std::unordered_map<uint32_t, Thread> threads_;
    std::vector<Candidate> window_;  // candidates of the backward in progress
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
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM));
