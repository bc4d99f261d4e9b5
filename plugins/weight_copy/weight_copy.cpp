// weight-copy-accumulation: quantized (or copied) weights made in a layer's
// forward that outlive that forward, so that every layer's copy is alive at
// the end of forward (TransformerEngine under FSDP2, problem 1 of
// docs/TE-FSDP2-FP8-MEMORY.md). Rules and options: plugins/README.md.
//
// Baseline-free, two kinds of evidence (common/weights.h):
// * proven: an allocation made in forward (its tag's phase, or an untagged
//   thread while a forward scope is open) that a DERIVED event declares
//   derived from a registered parameter, whatever its tag and size. It is
//   judged at the next pop, on any thread, of a "forward" scope of its
//   parameter's layer (enclosing the parameter's module within its numbered
//   layer) that leaves no such scope open on that thread; still waiting at
//   the end of forward, it is judged then, for the parameter's numbered
//   layer. Alive when judged: retained. Errors come from these only.
// * size-only: an allocation made in forward under a parameter's module (or
//   a sub-module) whose size is one of that parameter's weight-derived sizes
//   (allocscope/sdk/weight_sizes.h), with no provenance, is a
//   candidate of the layer forward it was made in: the outermost forward
//   scope on the allocating thread that encloses the parameter's module and
//   does not enclose its numbered layer (so a model-root scope such as
//   "model" is skipped for "model.layers.3"). When that scope is popped, the
//   candidates still alive are retained, a scale-sized one only when its
//   module also keeps a data-sized one of that forward. Sizes alone are
//   ambiguous (a saved [T, 4H] activation is a [4H, H] weight's bf16 copy in
//   bytes when T == H): info findings only.
// Per layer and kind the forward that retained the most is reported (max
// over steps); the total alive at the end of forward (the first backward
// scope of the step, or the step change) likewise.
//
// Baseline mode: the reference test's per-layer forward increment of
// memory_allocated, run minus baseline, against forward_threshold.
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

constexpr uint64_t kDefaultForwardThreshold = 51200;  // the reference test's 50 KiB
constexpr uint64_t kDefaultMinNumel = 4096;

class WeightCopyAccumulation final : public WeightDetector {
  public:
    explicit WeightCopyAccumulation(const allocscope_host_v2& host)
        : WeightDetector(
              host, "forward_threshold", kDefaultForwardThreshold,
              WeightSizeRules{.bf16_copy = true, .sharded = false, .world = 0, .gradients = false},
              kDefaultMinNumel) {}

    void on_step(uint64_t /*step*/, uint32_t source) {
        enter(source);
        // A step without backward: its forward ended with the step.
        end_forward(true);
    }

    void finish() {
        end_forward(false);
        log_if_no_params();
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
        bool whole = false;              // ... of phase "forward" itself, not a sub-phase
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
        WeightHeld evidence;
    };
    // The most retained copies alive together at the end of forward, over
    // the steps, of one kind of evidence.
    struct Total {
        uint64_t bytes = 0;
        uint64_t step = 0;
        std::vector<uint32_t> layers;
        std::vector<WeightHeld> evidence;
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
        end_forward(false);
        threads_.clear();
        live_.clear();
        step_retained_.clear();
        waiting_.clear();
        open_forward_ = 0;
        level_.reset();
        source_ = source;
    }

    void on_alloc(const allocscope_event_v2& e) override {
        bool switched = false;
        if (!level_.follow(e, &switched)) return;
        if (switched) drop_candidates();
        if (!analyzing()) return;
        live_.erase(e.address);  // a record left at this address is stale (missed free)
        if (!in_forward(e)) return;
        const uint32_t module = strings_.tag(e.layer);
        std::optional<WeightParams::Match> m;
        if (module != 0 && base_phase(e.phase) == forward_ && matching_sizes())
            m = params_.match(module, e.size);
        if (m) {
            if (Frame* scope = layer_scope(e.tid, m->param))
                scope->candidates.push_back({e.address, e.seq, module, m->data});
            else
                m.reset();
        }
        record(e, module, m);
        forward_active_ = true;
    }

    // Whether an allocation is made in forward: tagged with a forward phase
    // on a thread outside backward, or untagged while a forward scope is
    // open on some thread.
    bool in_forward(const allocscope_event_v2& e) {
        if (base_phase(e.phase) == forward_) {
            auto it = threads_.find(e.tid);
            return it == threads_.end() || it->second.open_backward == 0;
        }
        return strings_.tag(e.phase) == 0 && open_forward_ > 0;
    }

    void on_proven(const Proven& p) override { waiting_.push_back(p); }

    void on_push(const allocscope_event_v2& e) override {
        Thread& t = threads_[e.tid];
        Frame f;
        f.layer = strings_.tag(e.layer);
        // A forward scope inside backward is activation recomputation: its
        // copies live until that layer's backward by design.
        const uint32_t phase = base_phase(e.phase);
        f.forward = phase == forward_ && t.open_backward == 0;
        f.whole = f.forward && strings_.tag(e.phase) == forward_;
        f.backward = phase == backward_;
        t.open_backward += f.backward;
        open_forward_ += f.forward;
        forward_active_ = forward_active_ || f.forward;
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
        // Backward begins: the end of forward.
        if (f.backward) end_forward(true);
        t.frames.push_back(std::move(f));
    }

    void on_pop(const allocscope_event_v2& e) override {
        auto it = threads_.find(e.tid);
        if (it == threads_.end() || it->second.frames.empty()) return;
        Thread& t = it->second;
        Frame f = std::move(t.frames.back());
        t.frames.pop_back();
        t.open_backward -= f.backward;
        open_forward_ -= f.forward;
        if (f.forward && f.layer != 0) {
            t.open_numbered -= f.numbered;
            --t.open_any;
            if (host_.has_baseline) {
                Measure& m = measure_[source_ == ALLOCSCOPE_SOURCE_BASELINE];
                if (f.measured_numbered) end_layer(m.numbered, e.step, f.layer);
                if (f.measured_any) end_layer(m.any, e.step, f.layer);
            }
        }
        if (f.whole && !waiting_.empty()) judge_waiting(f, t, e.step);
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

    // Forward scope `f` (phase "forward" itself) was popped from thread `t`:
    // the proven allocations whose parameter's layer forward it ends (no
    // such scope is left on the thread) are judged; alive, they are
    // retained. Sub-phase scopes do not judge: a range such as FSDP's
    // "layers.4/forward/all_gather" may run inside layers.3's forward, and
    // what it makes is for layers.4's forward to use.
    void judge_waiting(const Frame& f, Thread& t, uint64_t step) {
        std::vector<WeightHeld> kept;
        std::size_t out = 0;
        for (std::size_t i = 0; i < waiting_.size(); ++i) {
            const Proven p = waiting_[i];
            Record* r = alive(p.address, p.seq);
            if (!r) continue;  // freed: not retained
            const bool ends = scope_of(f.layer, p.module, p.numbered) &&
                              !enclosing_scope(t.frames, p.module, p.numbered,
                                               [](const Frame& g) { return g.whole; });
            if (!ends) {
                waiting_[out++] = p;
                continue;
            }
            r->state = State::kept;
            kept.push_back(held(*r));
            step_retained_.push_back({p.address, f.layer, kept.back()});
        }
        waiting_.resize(out);
        if (!kept.empty()) proven_.record(f.layer, step, std::move(kept));
    }

    // Auto level moved from segments to blocks: segment candidates are void.
    void drop_candidates() {
        live_.clear();
        step_retained_.clear();
        waiting_.clear();
        for (auto& [tid, t] : threads_) {
            for (Frame& f : t.frames)
                f.candidates.clear();
        }
    }

    // Layer L's forward scope was popped: its candidates still alive are
    // retained; scale-sized ones only in a module that made a data-sized one.
    void end_layer_forward(const Frame& f, uint64_t step) {
        std::vector<WeightHeld> retained;
        retain_alive(f.candidates, [&](const Candidate& c, WeightHeld ev) {
            step_retained_.push_back({c.address, f.layer, ev});
            retained.push_back(std::move(ev));
        });
        if (!retained.empty()) sized_.record(f.layer, step, std::move(retained));
    }

    // The end of forward (backward begins, or the step ends; at the end of
    // the stream `judge` is false: nothing shows that forward was over).
    // Proven allocations still waiting are judged for their parameter's
    // layer, records of forward nothing was learnt about are dropped, and
    // the retained copies still alive together are totalled.
    void end_forward(bool judge) {
        if (forward_active_) {
            forward_active_ = false;
            if (judge) judge_rest();
            waiting_.clear();
            dismiss_pending();
        }
        close_total(true, totals_[0]);
        close_total(false, totals_[1]);
        step_retained_.clear();
    }

    // Proven allocations no forward scope of their parameter's layer ended:
    // alive at the end of forward, retained, per parameter layer.
    void judge_rest() {
        std::vector<uint32_t> order;
        std::unordered_map<uint32_t, std::vector<WeightHeld>> by_layer;
        for (const Proven& p : waiting_) {
            Record* r = alive(p.address, p.seq);
            if (!r) continue;
            r->state = State::kept;
            const uint32_t layer = param_layer(p);
            auto [slot, inserted] = by_layer.try_emplace(layer);
            if (inserted) order.push_back(layer);
            slot->second.push_back(held(*r));
            step_retained_.push_back({p.address, layer, slot->second.back()});
        }
        for (uint32_t layer : order) {
            std::vector<WeightHeld>& kept = by_layer[layer];
            const uint64_t step = kept.front().step;
            proven_.record(layer, step, std::move(kept));
        }
    }

    // Of the copies retained since the last end of forward with evidence of
    // kind `proven`, those still alive together.
    void close_total(bool proven, Total& total) {
        std::vector<WeightHeld> alive_now;
        std::vector<uint32_t> layers;
        uint64_t bytes = 0;
        uint64_t step = 0;
        for (const Retained& r : step_retained_) {
            if (r.evidence.origin.proven != proven || !alive(r.address, r.evidence.alloc_seq))
                continue;
            bytes += r.evidence.size;
            step = std::max(step, r.evidence.step);
            layers.push_back(r.layer);
            alive_now.push_back(r.evidence);
        }
        if (bytes <= total.bytes) return;  // ties keep the earliest step
        std::sort(layers.begin(), layers.end());
        layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
        watch_.release(total.evidence);
        total.bytes = bytes;
        total.step = step;
        total.layers = std::move(layers);
        total.evidence = std::move(alive_now);
        watch_.hold(total.evidence);
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
        Finding f = baseline_finding("forward", excess, [&](uint32_t layer) {
            return "alive after " + text(layer) + "'s forward";
        });
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
            const std::vector<uint32_t> layers = retained_layers();
            f.summary += "; weight-derived allocations alive after their layer's forward: " +
                         std::to_string(f.count) + " in " + std::to_string(layers.size()) +
                         " layers";
        }
        emit(host_, f);
        return true;
    }

    void emit_per_layer() {
        for (const RetentionByLayer::Entry& e : proven_.entries()) {
            const std::string layer = text(e.layer);
            Finding f = layer_finding(e, true, "forward", "alive after " + layer + "'s forward");
            std::vector<uint32_t> params;
            for (const WeightHeld& h : e.evidence)
                params.push_back(h.origin.param);
            std::sort(params.begin(), params.end());
            params.erase(std::unique(params.begin(), params.end()), params.end());
            f.summary = format_bytes(e.bytes) + " of allocations derived from " + layer +
                        "'s weights (" + std::to_string(e.count) + ", from " +
                        std::to_string(params.size()) +
                        (params.size() == 1 ? " parameter" : " parameters") + ") outlive " + layer +
                        "'s forward (step " + std::to_string(e.step) + "; " + retained_in(e) + ")";
            note_statistics_only(f);
            emit(host_, f);
        }
        for (const RetentionByLayer::Entry& e : sized_.entries()) {
            const std::string layer = text(e.layer);
            Finding f = layer_finding(e, false, "forward", "alive after " + layer + "'s forward");
            std::vector<std::string_view> modules;
            for (const WeightHeld& h : e.evidence)
                modules.push_back(text(h.layer));
            std::sort(modules.begin(), modules.end());
            modules.erase(std::unique(modules.begin(), modules.end()), modules.end());
            f.summary =
                format_bytes(e.bytes) + " in " + std::to_string(e.count) + " allocations (from " +
                std::to_string(modules.size()) + (modules.size() == 1 ? " module" : " modules") +
                ") whose sizes match weight-derived forms of " + layer + " outlive " + layer +
                "'s forward (step " + std::to_string(e.step) + "; " + retained_in(e) +
                "); size alone does not show they are weight copies: " + how_to_settle();
            emit(host_, f);
        }
        emit_total(totals_[0], true);
        emit_total(totals_[1], false);
    }

    static std::string retained_in(const RetentionByLayer::Entry& e) {
        return "retained in " + std::to_string(e.windows) +
               (e.windows == 1 ? " forward" : " forwards");
    }

    // The most copies alive together at the end of forward: an error over
    // proven evidence, an info over size-only evidence.
    void emit_total(const Total& t, bool proven) {
        if (t.bytes == 0) return;
        Finding f;
        f.severity =
            proven && holds_copy(t.evidence) ? ALLOCSCOPE_SEVERITY_ERROR : ALLOCSCOPE_SEVERITY_INFO;
        f.basis = proven ? kProven : kSizeOnly;
        f.layer = common_layer(t.layers);
        f.phase = "forward";
        f.bytes = t.bytes;
        f.count = t.evidence.size();
        f.evidence = evidence(t.evidence, "alive at the end of forward");
        finish_evidence(f);
        const std::string layers =
            std::to_string(t.layers.size()) + (t.layers.size() == 1 ? " layer" : " layers");
        const std::string when = " alive together at the end of forward (step " +
                                 std::to_string(t.step) + ", " + std::to_string(f.count) +
                                 " allocations)";
        f.summary =
            proven
                ? format_bytes(t.bytes) + " of weight-derived copies of " + layers + when
                : format_bytes(t.bytes) +
                      " of allocations whose sizes match weight-derived forms of " + layers + when +
                      "; size alone does not show they are weight copies: " + how_to_settle();
        note_statistics_only(f);
        emit(host_, f);
    }

    std::unordered_map<uint32_t, Thread> threads_;
    std::vector<Retained> step_retained_;  // retained since the last end of forward
    std::vector<Proven> waiting_;          // proven, not judged yet
    uint32_t open_forward_ = 0;            // forward scopes open, all threads
    bool forward_active_ = false;          // forward since the last end of forward
    Measure measure_[2];                   // [0] run, [1] baseline
    Total totals_[2];                      // [0] proven, [1] size-only
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
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_MARK) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_DERIVED));
