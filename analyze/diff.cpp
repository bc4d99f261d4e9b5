#include "diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "analysis.h"
#include "findings.h"
#include "replay.h"

namespace allocscope {

namespace {

std::string signed_bytes(double bytes) {
    const double magnitude = std::fabs(bytes);
    const std::string text = human_bytes(uint64_t(std::llround(magnitude)));
    return (bytes < 0 ? "-" : "+") + text;
}

std::string plain_bytes(double bytes) {
    return bytes < 0 ? "-" + human_bytes(uint64_t(std::llround(-bytes)))
                     : human_bytes(uint64_t(std::llround(bytes)));
}

std::string number(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

std::string optional_number(const std::optional<double>& v) {
    return v ? number(*v) : "null";
}

}  // namespace

std::vector<StepMemory> step_memory(const Trace& trace) {
    TraceStream stream(trace);
    return step_memory(stream);
}

StepCounter::StepCounter(const TraceTables& tables, TraceShape shape)
    : t_(tables), main_tid_(shape.main_tid) {}

StepMemory& StepCounter::step(uint64_t step) {
    if (!current_ || current_step_ != step) {
        current_ = &steps_[step];
        current_step_ = step;
    }
    return *current_;
}

void StepCounter::end_step(uint64_t step, uint64_t live) {
    auto it = steps_.find(step);
    if (it != steps_.end() && it->second.after_forward && !it->second.after_backward)
        it->second.after_backward = live;
}

// A phase id not (yet) defined is the empty phase, as the reader's checks
// leave it.
uint8_t StepCounter::phase_class(uint32_t phase) {
    if (phase >= t_.strings.size()) return kPhaseOther;  // as the empty phase
    if (phase >= phase_class_.size()) phase_class_.resize(t_.strings.size(), kPhaseUnknown);
    uint8_t& c = phase_class_[phase];
    if (c == kPhaseUnknown) {
        const std::string& text = t_.str(phase);
        const std::string_view base = base_phase(text);
        c = base == "backward"    ? kPhaseBackward
            : base == "optimizer" ? kPhaseOptimizer
                                  : kPhaseOther;
        if (text == "forward") c |= kPhaseForwardExactly;
    }
    return c;
}

void StepCounter::add_tag(const Event& e, uint64_t live) {
    if (e.kind == EventKind::tag_push) {
        // Forward ends where backward begins and backward where the
        // optimizer does, on whichever thread: PyTorch runs backward on
        // autograd's threads, whose tags the training thread never sees.
        const uint8_t phase = phase_class(e.phase);
        StepMemory& s = step(e.step);
        if ((phase & kPhaseBackward) && !s.after_forward) s.after_forward = live;
        if ((phase & kPhaseOptimizer) && s.after_forward && !s.after_backward)
            s.after_backward = live;
    }
    if (e.tid != main_tid_) return;
    if (e.kind == EventKind::tag_push) {
        const bool backward = (phase_class(e.phase) & kPhaseBackward) != 0;
        stack_.push_back({e.layer, e.phase, backward});
        open_backward_ += backward;
    } else if (e.kind == EventKind::tag_pop && !stack_.empty()) {
        const Frame f = stack_.back();
        stack_.pop_back();
        open_backward_ -= f.backward;
        if (f.layer >= t_.strings.size() || f.phase >= t_.strings.size()) return;
        const std::string& layer = t_.str(f.layer);
        // The layer's own forward scope: exactly "forward" (its
        // sub-phases, e.g. FSDP's all-gather prefetch, are not its end).
        if (open_backward_ == 0 && (phase_class(f.phase) & kPhaseForwardExactly) &&
            !layer.empty() && own_group(f.layer)) {
            step(e.step).forward_ends.emplace_back(layer, live);
        }
    }
}

bool StepCounter::own_group(uint32_t layer) {
    // Known once per layer string: a pop of every layer's forward scope asks.
    if (layer >= own_group_.size()) own_group_.resize(t_.strings.size(), -1);
    int8_t& own = own_group_[layer];
    if (own < 0) own = layer_group(t_.str(layer)) == t_.str(layer);
    return own != 0;
}

std::vector<StepMemory> StepCounter::finish(uint64_t live) {
    if (any_event_) end_step(last_step_, live);
    std::vector<StepMemory> out;
    for (auto& [step, s] : steps_) {
        s.step = step;
        out.push_back(std::move(s));
    }
    steps_.clear();
    current_ = nullptr;
    return out;
}

std::vector<StepMemory> step_memory(TraceStream& stream, std::optional<TraceShape> known) {
    const TraceShape shape = known ? *known : trace_shape(stream);
    Replay replay;
    StepCounter counter(stream.tables(), shape);
    auto live = [&] { return replay.totals(shape.owner).live_bytes; };
    stream.for_each([&](const Event& e) {
        const uint64_t before = live();
        replay.apply(e);
        counter.add(e, before, live());
    });
    return counter.finish(live());
}

RunMeasure measure_run(const Trace& trace) {
    TraceStream stream(trace);
    return measure_run(stream);
}

RunMeasure measure_run(TraceStream& stream) {
    RunMeasure m;
    m.path = stream.path();
    m.rank = stream.header().rank;

    // What scopes kept alive, and whether the run ended out of memory.
    AnalysisOptions options;
    options.timeline_points = 1;
    options.timeline_allocations = 0;  // no samples' largest allocations
    options.top_sites = 0;
    options.oom_tags = 0;
    std::vector<StepMemory> steps;
    const TraceAnalysis analysis = analyze(stream, options, &steps);
    if (!analysis.ooms.empty() && !analysis.ooms.back().continued) {
        const OomMoment& o = analysis.ooms.back();
        m.oom = RunMeasure::Oom{o.step, o.layer, o.phase, o.requested};
        for (StepMemory& s : steps) {
            if (s.step == o.step) s.after_backward.reset();
        }
    }

    // Forward: steps with at least two layer ends.
    std::vector<const StepMemory*> forward;
    std::vector<const StepMemory*> backward;
    for (const StepMemory& s : steps) {
        if (s.forward_ends.size() >= 2) forward.push_back(&s);
        if (s.after_forward && s.after_backward) backward.push_back(&s);
    }
    if (forward.size() >= 2) {
        forward.erase(forward.begin());
        m.warmup_dropped = true;
    }
    if (backward.size() >= 2) {
        backward.erase(backward.begin());
        m.warmup_dropped = true;
    }
    std::vector<double> sum;
    std::vector<uint64_t> count;
    double total = 0;
    uint64_t increments = 0;
    for (const StepMemory* s : forward) {
        for (size_t k = 1; k < s->forward_ends.size(); ++k) {
            if (sum.size() < k) {
                sum.resize(k, 0);
                count.resize(k, 0);
                m.layers.push_back(s->forward_ends[k].first);
            }
            const double inc =
                double(s->forward_ends[k].second) - double(s->forward_ends[k - 1].second);
            sum[k - 1] += inc;
            ++count[k - 1];
            total += inc;
            ++increments;
        }
    }
    for (size_t k = 0; k < sum.size(); ++k)
        m.layer_increments.push_back(sum[k] / double(count[k]));
    m.steps = steps.size();
    for (const StepMemory& s : steps) {
        for (const auto& [layer, live] : s.forward_ends) {
            if (std::find(m.forward_layers.begin(), m.forward_layers.end(), layer) ==
                m.forward_layers.end())
                m.forward_layers.push_back(layer);
        }
    }
    if (increments > 0) m.forward_mean = total / double(increments);
    m.forward_steps = forward.size();
    if (!backward.empty()) {
        double d = 0;
        for (const StepMemory* s : backward)
            d += double(*s->after_backward) - double(*s->after_forward);
        m.backward_delta = d / double(backward.size());
    }
    m.backward_steps = backward.size();

    // What scopes kept alive at their end, by layer group and base phase.
    std::map<std::pair<std::string, std::string>, uint64_t> kept;
    for (const TagStats& s : analysis.tags) {
        if (s.retained_max == 0) continue;
        uint64_t& k = kept[{layer_group(s.layer), std::string(base_phase(s.phase))}];
        k = std::max(k, s.retained_max);
    }
    for (const auto& [key, bytes] : kept)
        m.kept.push_back({key.first, key.second, bytes});
    return m;
}

namespace {

// "layers.2, layers.3, ... (6)": at most four names, then the count.
std::string some_names(const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 4; ++i)
        out += (i ? ", " : "") + printable(names[i]);
    if (names.size() > 4) out += ", ... (" + std::to_string(names.size()) + ")";
    return out;
}

std::vector<std::string> missing_from(const std::vector<std::string>& names,
                                      const std::vector<std::string>& other) {
    std::vector<std::string> out;
    for (const std::string& n : names) {
        if (std::find(other.begin(), other.end(), n) == other.end()) out.push_back(n);
    }
    return out;
}

void compare_shapes(RankDiff& d, const RunMeasure& base, const RunMeasure& cand) {
    const std::vector<std::string> only_base =
        missing_from(base.forward_layers, cand.forward_layers);
    const std::vector<std::string> only_cand =
        missing_from(cand.forward_layers, base.forward_layers);
    if (!base.forward_layers.empty() && !cand.forward_layers.empty() &&
        (!only_base.empty() || !only_cand.empty())) {
        d.unrelated = only_base.size() == base.forward_layers.size();
        std::string line = "the runs' forwards have different layers: BASE " +
                           std::to_string(base.forward_layers.size()) + " numbered, CAND " +
                           std::to_string(cand.forward_layers.size());
        if (!only_base.empty()) line += "; only in BASE: " + some_names(only_base);
        if (!only_cand.empty()) line += "; only in CAND: " + some_names(only_cand);
        line += d.unrelated ? " (no layer in common: runs of different models)"
                            : ". Layer rows compare the layers both have; the means are "
                              "over different layers";
        d.notes.push_back(line);
    }
    if (base.steps != cand.steps && base.steps > 0 && cand.steps > 0) {
        std::string line = "the runs have different numbers of steps: BASE " +
                           std::to_string(base.steps) + ", CAND " + std::to_string(cand.steps);
        if (std::min(base.steps, cand.steps) == 1)
            line +=
                "; a run of one step has no step after warm-up, so its numbers include "
                "warm-up allocations";
        d.notes.push_back(line);
    }
}

}  // namespace

RankDiff diff_runs(RunMeasure base, RunMeasure cand, const DiffThresholds& thresholds) {
    RankDiff d;
    compare_shapes(d, base, cand);
    if (base.forward_mean && cand.forward_mean) {
        d.forward_excess = *cand.forward_mean - *base.forward_mean;
        d.forward_exceeded = *d.forward_excess > double(thresholds.forward);
    }
    if (base.backward_delta && cand.backward_delta) {
        d.backward_excess = *cand.backward_delta - *base.backward_delta;
        d.backward_exceeded = *d.backward_excess > double(thresholds.backward);
    }
    std::map<std::pair<std::string, std::string>, RankDiff::Row> rows;
    for (const RunMeasure::Kept& k : base.kept) {
        RankDiff::Row& r = rows[{k.layer, k.phase}];
        r.layer = k.layer;
        r.phase = k.phase;
        r.base = k.bytes;
    }
    for (const RunMeasure::Kept& k : cand.kept) {
        RankDiff::Row& r = rows[{k.layer, k.phase}];
        r.layer = k.layer;
        r.phase = k.phase;
        r.cand = k.bytes;
    }
    auto has_layer = [](const RunMeasure& m, const std::string& layer) {
        for (const RunMeasure::Kept& k : m.kept) {
            if (k.layer == layer) return true;
        }
        return std::find(m.forward_layers.begin(), m.forward_layers.end(), layer) !=
               m.forward_layers.end();
    };
    for (auto& [key, r] : rows) {
        r.excess = int64_t(r.cand) - int64_t(r.base);
        r.in_base = has_layer(base, r.layer);
        r.in_cand = has_layer(cand, r.layer);
        if (r.excess != 0) d.kept.push_back(r);
    }
    std::stable_sort(
        d.kept.begin(), d.kept.end(),
        [](const RankDiff::Row& a, const RankDiff::Row& b) { return a.excess > b.excess; });
    d.base = std::move(base);
    d.cand = std::move(cand);
    return d;
}

std::string diff_text(const std::vector<RankDiff>& diffs, const DiffThresholds& thresholds,
                      const std::vector<std::string>& notes) {
    std::string out;
    for (const std::string& n : notes)
        out += "note: " + printable(n) + "\n";
    if (!notes.empty()) out += "\n";
    bool exceeded = false;
    for (const RankDiff& d : diffs) {
        const int32_t rank = d.cand.rank >= 0 ? d.cand.rank : d.base.rank;
        std::string title = rank >= 0 ? "rank " + std::to_string(rank) : std::string("no rank");
        if (rank >= 0 && (d.cand.rank < 0 || d.base.rank < 0))
            title +=
                std::string(d.cand.rank < 0 ? " (CAND" : " (BASE") + ": a process without a rank)";
        out += "== " + title + " ==\n  base: " + printable(d.base.path) +
               "\n  cand: " + printable(d.cand.path) + "\n";
        for (const std::string& n : d.notes)
            out += "  note: " + printable(n) + "\n";
        for (const auto* m : {&d.base, &d.cand}) {
            if (!m->oom) continue;
            out += "  " + std::string(m == &d.base ? "BASE" : "CAND") +
                   " ran out of memory at step " + std::to_string(m->oom->step) + ", " +
                   printable(m->oom->layer.empty() ? "(untagged)" : m->oom->layer) + " " +
                   printable(m->oom->phase) + " (" + human_bytes(m->oom->requested) +
                   " requested): measured up to there, that step's backward left out\n";
        }
        out += "\nforward, mean increment per layer (live " +
               std::string(d.cand.layers.empty() ? "bytes" : "bytes after each layer's forward") +
               "):\n";
        if (!d.forward_excess) {
            out += "  not measurable: " + std::string(!d.base.forward_mean ? "BASE" : "CAND") +
                   " has no step with two numbered layers' forward scopes (tags like "
                   "layers.N / forward)\n";
        } else {
            out += "  base " + plain_bytes(*d.base.forward_mean) + "  cand " +
                   plain_bytes(*d.cand.forward_mean) + "  excess " +
                   signed_bytes(*d.forward_excess) + " (threshold " +
                   human_bytes(thresholds.forward) +
                   "): " + (d.forward_exceeded ? "EXCEEDED" : "ok") + "\n";
            out += "    " + std::string("layer") + std::string(22, ' ') +
                   "base         cand       excess\n";
            // By name: a layer only one run has shows "-" on the other side.
            std::vector<std::string> names = d.cand.layers;
            for (const std::string& n : d.base.layers) {
                if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
            }
            auto increment = [](const RunMeasure& m,
                                const std::string& n) -> std::optional<double> {
                for (size_t k = 0; k < m.layers.size() && k < m.layer_increments.size(); ++k) {
                    if (m.layers[k] == n) return m.layer_increments[k];
                }
                return std::nullopt;
            };
            for (const std::string& name : names) {
                const std::optional<double> b = increment(d.base, name);
                const std::optional<double> c = increment(d.cand, name);
                char line[200];
                std::snprintf(line, sizeof line, "    %-24s %12s %12s %12s\n",
                              printable(name).c_str(), b ? plain_bytes(*b).c_str() : "-",
                              c ? plain_bytes(*c).c_str() : "-",
                              b && c ? signed_bytes(*c - *b).c_str() : "-");
                out += line;
            }
        }
        out += "\nbackward, post-backward minus post-forward:\n";
        if (!d.backward_excess) {
            out += "  not measurable: " + std::string(!d.base.backward_delta ? "BASE" : "CAND") +
                   " has no step with a backward phase\n";
        } else {
            out += "  base " + signed_bytes(*d.base.backward_delta) + "  cand " +
                   signed_bytes(*d.cand.backward_delta) + "  excess " +
                   signed_bytes(*d.backward_excess) + " (threshold " +
                   human_bytes(thresholds.backward) +
                   "): " + (d.backward_exceeded ? "EXCEEDED" : "ok") + "\n";
        }
        out += "  steps used: forward " + std::to_string(d.cand.forward_steps) + ", backward " +
               std::to_string(d.cand.backward_steps) +
               (d.cand.warmup_dropped ? " (first step dropped as warm-up)" : "") + "\n";
        if (!d.kept.empty()) {
            out +=
                "\nkept alive at the end of their scopes, CAND minus BASE (by layer and phase):\n";
            for (size_t k = 0; k < d.kept.size() && k < 20; ++k) {
                const RankDiff::Row& r = d.kept[k];
                char line[240];
                std::snprintf(line, sizeof line, "    %-24s %-12s %12s %12s %12s\n",
                              printable(r.layer).c_str(), printable(r.phase).c_str(),
                              r.in_base ? human_bytes(r.base).c_str() : "-",
                              r.in_cand ? human_bytes(r.cand).c_str() : "-",
                              r.in_base && r.in_cand ? signed_bytes(double(r.excess)).c_str()
                                                     : (r.in_base ? "only BASE" : "only CAND"));
                out += line;
            }
        }
        out += "\n";
        exceeded |= d.forward_exceeded || d.backward_exceeded;
    }
    out += exceeded ? "result: a threshold is exceeded\n" : "result: within the thresholds\n";
    return out;
}

namespace {

std::string json_strings(const std::vector<std::string>& lines) {
    std::string out = "[";
    for (size_t i = 0; i < lines.size(); ++i)
        out += (i ? ", " : "") + json_quote(lines[i]);
    return out + "]";
}

}  // namespace

std::string diff_json(const std::vector<RankDiff>& diffs, const DiffThresholds& thresholds,
                      const std::vector<std::string>& notes) {
    std::string out = "{\"thresholds\": {\"forward\": " + std::to_string(thresholds.forward) +
                      ", \"backward\": " + std::to_string(thresholds.backward) +
                      "},\n \"notes\": " + json_strings(notes) + ",\n \"ranks\": [";
    bool exceeded = false;
    for (size_t i = 0; i < diffs.size(); ++i) {
        const RankDiff& d = diffs[i];
        exceeded |= d.forward_exceeded || d.backward_exceeded;
        auto measure = [&](const RunMeasure& m) {
            std::string s =
                "{\"trace\": " + json_quote(m.path) + ", \"rank\": " + std::to_string(m.rank) +
                ", \"forward_mean\": " + optional_number(m.forward_mean) +
                ", \"forward_steps\": " + std::to_string(m.forward_steps) +
                ", \"backward_delta\": " + optional_number(m.backward_delta) +
                ", \"backward_steps\": " + std::to_string(m.backward_steps) + ", \"oom\": ";
            if (m.oom) {
                s += "{\"step\": " + std::to_string(m.oom->step) +
                     ", \"layer\": " + json_quote(m.oom->layer) +
                     ", \"phase\": " + json_quote(m.oom->phase) +
                     ", \"requested\": " + std::to_string(m.oom->requested) + "}";
            } else {
                s += "null";
            }
            s += ", \"layers\": [";
            for (size_t k = 0; k < m.layers.size(); ++k) {
                s += (k ? ", " : "") + std::string("{\"layer\": ") + json_quote(m.layers[k]) +
                     ", \"increment\": " + number(m.layer_increments[k]) + "}";
            }
            return s + "]}";
        };
        out += i ? ",\n  " : "\n  ";
        out += "{\"base\": " + measure(d.base) + ",\n   \"cand\": " + measure(d.cand) +
               ",\n   \"forward_excess\": " + optional_number(d.forward_excess) +
               ", \"forward_exceeded\": " + (d.forward_exceeded ? "true" : "false") +
               ", \"backward_excess\": " + optional_number(d.backward_excess) +
               ", \"backward_exceeded\": " + (d.backward_exceeded ? "true" : "false") +
               ",\n   \"notes\": " + json_strings(d.notes) + ",\n   \"kept\": [";
        for (size_t k = 0; k < d.kept.size(); ++k) {
            const RankDiff::Row& r = d.kept[k];
            out += (k ? ", " : "") + std::string("{\"layer\": ") + json_quote(r.layer) +
                   ", \"phase\": " + json_quote(r.phase) + ", \"base\": " + std::to_string(r.base) +
                   ", \"cand\": " + std::to_string(r.cand) +
                   ", \"excess\": " + std::to_string(r.excess) +
                   ", \"in_base\": " + (r.in_base ? "true" : "false") +
                   ", \"in_cand\": " + (r.in_cand ? "true" : "false") + "}";
        }
        out += "]}";
    }
    out += "],\n \"exceeded\": " + std::string(exceeded ? "true" : "false") + "}\n";
    return out;
}

}  // namespace allocscope
