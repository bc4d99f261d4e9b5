// weight-copy-accumulation: quantized (or copied) weights made in a layer's
// forward that outlive that forward, so that every layer's copy is alive at
// the end of forward (TransformerEngine under FSDP2, problem 1 of
// docs/TE-FSDP2-FP8-MEMORY.md). Rules and options: plugins/README.md.
//
// Baseline-free: an allocation made in forward under a parameter's module
// (or a sub-module) whose size is one of that parameter's weight-derived
// sizes (common/plugin.h, weight_derived_sizes) is a candidate of the layer
// forward it was made in: the outermost forward scope on the allocating
// thread that encloses the parameter's module and does not enclose its
// numbered layer (so a model-root scope such as "model" is skipped for
// "model.layers.3"). When that scope is popped, the candidates still alive
// are retained, a scale-sized one only when its module also keeps a
// data-sized one of that forward. Per layer the forward that retained the
// most is reported (max over steps); the total alive at the end of forward
// (the first backward scope of the step, or the step change) likewise.
//
// Baseline mode: the reference test's per-layer forward increment of
// memory_allocated, run minus baseline, against forward_threshold.
#include <map>

#include "common/weights.h"

namespace allocscope::plugins {
namespace {

constexpr uint64_t kDefaultForwardThreshold = 51200;  // the reference test's 50 KiB
constexpr uint64_t kDefaultMinNumel = 4096;

class WeightCopyAccumulation final : public WeightDetector {
  public:
    explicit WeightCopyAccumulation(const allocscope_host_v1& host)
        : WeightDetector(
              host, "forward_threshold", kDefaultForwardThreshold,
              WeightSizeRules{.bf16_copy = true, .sharded = false, .world = 0, .gradients = false},
              kDefaultMinNumel) {}

    void on_step(uint64_t /*step*/, uint32_t source) {
        enter(source);
        // A step without backward: its forward ended with the step.
        close_forward_total();
    }

    void finish() {
        close_forward_total();
        if (host_.has_baseline && emit_baseline_comparison()) return;
        emit_per_layer();
    }

  private:
    // An allocation attributed to a layer forward.
    struct Candidate {
        uint64_t address;
        uint64_t seq;
        uint32_t module;  // the allocation's layer tag
        bool data;        // data-sized (else scale-sized)
    };
    struct Frame {
        uint32_t layer = 0;
        bool forward = false;            // a forward scope outside any backward scope
        bool backward = false;           // counted in Thread::open_backward
        bool numbered = false;           // counted in Thread::open_numbered
        bool measured_numbered = false;  // the outermost numbered forward scope
        bool measured_any = false;       // the outermost non-empty forward scope
        std::vector<Candidate> candidates;
    };
    struct Thread {
        std::vector<Frame> frames;
        uint32_t open_numbered = 0;
        uint32_t open_any = 0;
        uint32_t open_backward = 0;
    };
    struct Retained {
        uint64_t address;
        uint32_t layer;
        HeldAlloc evidence;
    };
    // Live bytes at layer-forward boundaries, per step (baseline mode).
    struct StepSeries {
        bool started = false;
        uint64_t start = 0;                               // at the first layer forward's push
        std::vector<std::pair<uint32_t, uint64_t>> ends;  // (layer, live bytes at its pop)
    };
    using Series = std::map<uint64_t, StepSeries>;
    struct Measure {
        Series numbered;  // outermost forward scopes of numbered layers ("layers.3")
        Series any;       // outermost non-empty forward scopes (models without numbered layers)
    };
    struct Mean {
        double bytes = 0;  // mean increment per layer forward
        uint64_t increments = 0;
        uint64_t steps = 0;
        bool warmup_excluded = false;
        std::vector<uint32_t> layers;
    };

    // The baseline's stream ends where the run's begins: nothing carries over.
    void enter(uint32_t source) override {
        if (source == source_) return;
        close_forward_total();
        threads_.clear();
        live_.clear();
        step_retained_.clear();
        level_.reset();
        source_ = source;
    }

    void on_alloc(const allocscope_event_v1& e) override {
        bool switched = false;
        if (!level_.follow(e, &switched)) return;
        if (switched) drop_candidates();
        if (!analyzing()) return;
        uint32_t module = 0;
        const std::optional<WeightParams::Match> m = match_alloc(e, forward_, &module);
        if (!m) return;
        Frame* scope = layer_scope(e.tid, m->param);
        if (!scope) return;
        scope->candidates.push_back({e.address, e.seq, module, m->data});
        follow(e, module);
    }

    void on_push(const allocscope_event_v1& e) override {
        Thread& t = threads_[e.tid];
        Frame f;
        f.layer = strings_.tag(e.layer);
        // A forward scope inside backward is activation recomputation: its
        // copies live until that layer's backward by design.
        const uint32_t phase = base_phase(e.phase);
        f.forward = phase == forward_ && t.open_backward == 0;
        f.backward = phase == backward_;
        t.open_backward += f.backward;
        if (f.forward && f.layer != 0) {
            f.numbered = !numbered_layer(text(f.layer)).empty();
            f.measured_numbered = f.numbered && t.open_numbered == 0;
            f.measured_any = t.open_any == 0;
            t.open_numbered += f.numbered;
            ++t.open_any;
            if (host_.has_baseline) {
                Measure& m = measure_[source_ == ALLOCSCOPE_SOURCE_BASELINE];
                if (f.measured_numbered) start_layer(m.numbered, e.step);
                if (f.measured_any) start_layer(m.any, e.step);
            }
        }
        // Backward begins: the end of forward for the accumulated total.
        if (f.backward) close_forward_total();
        t.frames.push_back(std::move(f));
    }

    void on_pop(const allocscope_event_v1& e) override {
        auto it = threads_.find(e.tid);
        if (it == threads_.end() || it->second.frames.empty()) return;
        Thread& t = it->second;
        Frame f = std::move(t.frames.back());
        t.frames.pop_back();
        t.open_backward -= f.backward;
        if (f.forward && f.layer != 0) {
            t.open_numbered -= f.numbered;
            --t.open_any;
            if (host_.has_baseline) {
                Measure& m = measure_[source_ == ALLOCSCOPE_SOURCE_BASELINE];
                if (f.measured_numbered) end_layer(m.numbered, e.step, f.layer);
                if (f.measured_any) end_layer(m.any, e.step, f.layer);
            }
        }
        if (!f.candidates.empty()) end_layer_forward(f, e.step);
    }

    // The layer forward an allocation derived from parameter `param` belongs
    // to: the outermost forward scope on the thread that encloses the
    // parameter's module and lies within its numbered layer (when it has
    // one). nullptr when the thread is in no such scope.
    Frame* layer_scope(uint32_t tid, uint32_t param) {
        auto it = threads_.find(tid);
        if (it == threads_.end()) return nullptr;
        return enclosing_scope(it->second.frames, param, [](const Frame& f) { return f.forward; });
    }

    // Auto level moved from segments to blocks: segment candidates are void.
    void drop_candidates() {
        live_.clear();
        step_retained_.clear();
        for (auto& [tid, t] : threads_) {
            for (Frame& f : t.frames)
                f.candidates.clear();
        }
    }

    // Layer L's forward scope was popped: its candidates still alive are
    // retained; scale-sized ones only in a module that made a data-sized one.
    void end_layer_forward(const Frame& f, uint64_t step) {
        std::vector<HeldAlloc> retained;
        retain_alive(f.candidates, [&](const Candidate& c, HeldAlloc ev) {
            step_retained_.push_back({c.address, f.layer, ev});
            retained.push_back(std::move(ev));
        });
        if (!retained.empty()) retained_.record(f.layer, step, std::move(retained));
    }

    // The end of forward (backward begins, or the step ends): the retained
    // copies of all layers that are still alive together.
    void close_forward_total() {
        if (step_retained_.empty()) return;
        std::vector<HeldAlloc> alive_now;
        std::vector<uint32_t> layers;
        uint64_t bytes = 0;
        uint64_t step = 0;
        for (const Retained& r : step_retained_) {
            const Record* alive = live_.find(r.address);
            if (!alive || alive->seq != r.evidence.alloc_seq) continue;
            bytes += r.evidence.size;
            step = std::max(step, r.evidence.step);
            layers.push_back(r.layer);
            alive_now.push_back(r.evidence);
        }
        step_retained_.clear();
        if (bytes <= total_bytes_) return;  // ties keep the earliest step
        std::sort(layers.begin(), layers.end());
        layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
        watch_.release(total_evidence_);
        total_bytes_ = bytes;
        total_step_ = step;
        total_layers_ = std::move(layers);
        total_evidence_ = std::move(alive_now);
        watch_.hold(total_evidence_);
    }

    static void start_layer(Series& s, uint64_t step, uint64_t live) {
        StepSeries& st = s[step];
        if (!st.started) {
            st.started = true;
            st.start = live;
        }
    }
    void start_layer(Series& s, uint64_t step) { start_layer(s, step, live_bytes()); }
    void end_layer(Series& s, uint64_t step, uint32_t layer) {
        StepSeries& st = s[step];
        if (!st.started) start_layer(s, step, live_bytes());
        st.ends.emplace_back(layer, live_bytes());
    }

    // The reference test's statistic: per layer forward, live bytes at its
    // end minus at the previous layer's end (the first layer: minus at its
    // start), averaged over layers and over the steps after the first.
    static std::optional<Mean> mean_increment(const Series& series) {
        std::vector<const StepSeries*> steps;
        for (const auto& [step, s] : series) {
            if (!s.ends.empty()) steps.push_back(&s);
        }
        if (steps.empty()) return std::nullopt;
        Mean m;
        m.warmup_excluded = drop_warmup(steps);
        double sum = 0;
        for (const StepSeries* s : steps) {
            int64_t previous = int64_t(s->start);
            for (const auto& [layer, end] : s->ends) {
                sum += double(int64_t(end) - previous);
                previous = int64_t(end);
                ++m.increments;
                m.layers.push_back(layer);
            }
        }
        m.steps = steps.size();
        m.bytes = sum / double(m.increments);
        std::sort(m.layers.begin(), m.layers.end());
        m.layers.erase(std::unique(m.layers.begin(), m.layers.end()), m.layers.end());
        return m;
    }

    // Baseline mode. False when either stream has no layer forward scopes
    // (then the baseline-free findings are emitted instead).
    bool emit_baseline_comparison() {
        const Measure& base = measure_[1];
        const Measure& run = measure_[0];
        const bool numbered = !base.numbered.empty() && !run.numbered.empty();
        const std::optional<Mean> b = mean_increment(numbered ? base.numbered : base.any);
        const std::optional<Mean> r = mean_increment(numbered ? run.numbered : run.any);
        if (!b || !r) {
            log_no_baseline(b.has_value(), "no layer forward scopes");
            return false;
        }
        const double excess = r->bytes - b->bytes;
        if (!(excess > double(threshold_))) return true;
        Finding f = baseline_finding("forward", excess);
        f.layer = common_layer(r->layers);
        auto describe = [](const Mean& m, const char* what) {
            return format_signed_bytes(m.bytes) + " (" + what + ", " +
                   std::to_string(m.increments) + " layer forwards in " +
                   steps_basis(m.steps, m.warmup_excluded);
        };
        f.summary = "memory_allocated grows per layer forward by " + describe(*r, "run") +
                    " against " + describe(*b, "baseline") + ": " + format_signed_bytes(excess) +
                    " per layer, over the threshold of " + format_bytes(threshold_);
        if (f.count > 0) {
            f.summary += "; weight-derived allocations alive after their layer's forward: " +
                         std::to_string(f.count) + " in " +
                         std::to_string(retained_.entries().size()) + " layers";
        }
        emit(host_, f);
        return true;
    }

    void emit_per_layer() {
        for (const RetentionByLayer::Entry& e : retained_.entries()) {
            Finding f = layer_finding(e, "forward");
            std::vector<std::string_view> modules;
            for (const HeldAlloc& ev : e.evidence)
                modules.push_back(text(ev.layer));
            std::sort(modules.begin(), modules.end());
            modules.erase(std::unique(modules.begin(), modules.end()), modules.end());
            f.summary = format_bytes(e.bytes) + " of weight-derived allocations (" +
                        std::to_string(e.count) + ", from " + std::to_string(modules.size()) +
                        (modules.size() == 1 ? " module" : " modules") + ") made in " + f.layer +
                        "'s forward outlive it (step " + std::to_string(e.step) + "; retained in " +
                        std::to_string(e.windows) + (e.windows == 1 ? " forward)" : " forwards)");
            emit(host_, f);
        }
        if (total_bytes_ == 0) return;
        Finding f;
        f.severity = ALLOCSCOPE_SEVERITY_ERROR;
        f.layer = common_layer(total_layers_);
        f.phase = "forward";
        f.bytes = total_bytes_;
        f.count = total_evidence_.size();
        f.evidence = evidence(total_evidence_);
        finish_evidence(f);
        f.summary = format_bytes(total_bytes_) + " of weight-derived copies of " +
                    std::to_string(total_layers_.size()) +
                    (total_layers_.size() == 1 ? " layer" : " layers") +
                    " alive together at the end of forward (step " + std::to_string(total_step_) +
                    ", " + std::to_string(f.count) + " allocations)";
        emit(host_, f);
    }

    std::unordered_map<uint32_t, Thread> threads_;
    std::vector<Retained> step_retained_;  // retained since the last end of forward
    Measure measure_[2];                   // [0] run, [1] baseline

    uint64_t total_bytes_ = 0;
    uint64_t total_step_ = 0;
    std::vector<uint32_t> total_layers_;
    std::vector<HeldAlloc> total_evidence_;
};

}  // namespace
}  // namespace allocscope::plugins

ALLOCSCOPE_DEFINE_PLUGIN(
    allocscope::plugins::WeightCopyAccumulation, "weight-copy-accumulation",
    "weight-derived allocations (quantized/transposed copies, scales) made in a layer's forward "
    "that outlive it and accumulate across layers until backward",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_PUSH) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_POP) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM));
