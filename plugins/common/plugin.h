// C++ side of the plugin ABI (include/allocscope/plugin_v1.h) shared by the
// built-in plugins: the adapter from a C++ class to the C struct, per-thread
// tag tracking, and finding construction. Header-only; each plugin is its
// own shared module, so nothing here is shared at run time.
#pragma once

#include <allocscope/plugin_v1.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flat_map.h"  // core/: header-only

namespace allocscope::plugins {

// `phase` is `base` or one of its sub-phases ("forward/quantize" is within
// "forward").
inline bool phase_within(std::string_view phase, std::string_view base) {
    return phase == base || (phase.size() > base.size() && phase.substr(0, base.size()) == base &&
                             phase[base.size()] == '/');
}

// `layer` is the module `scope` or one of its sub-modules
// ("layers.3.mlp.fc1" is within "layers.3", "layers.30" is not).
inline bool layer_within(std::string_view layer, std::string_view scope) {
    return layer == scope || (layer.size() > scope.size() &&
                              layer.substr(0, scope.size()) == scope && layer[scope.size()] == '.');
}

struct Tag {
    std::string layer;
    std::string phase;
    bool operator==(const Tag&) const = default;
};

// Per-thread tag stacks rebuilt from TAG_PUSH / TAG_POP events, so a plugin
// knows what a pop returns to (the enclosing tag). A pop on an empty stack
// (a stream that starts mid-scope) is ignored.
class TagTracker {
  public:
    void on_event(const allocscope_event_v1& e) {
        std::vector<Tag>& stack = stacks_[e.tid];
        if (e.kind == ALLOCSCOPE_EVENT_TAG_PUSH) {
            stack.push_back({e.layer ? e.layer : "", e.phase ? e.phase : ""});
        } else if (e.kind == ALLOCSCOPE_EVENT_TAG_POP && !stack.empty()) {
            stack.pop_back();
        }
    }
    // The thread's tag after the events seen so far ("" / "" when none).
    Tag current(uint32_t tid) const {
        auto it = stacks_.find(tid);
        if (it == stacks_.end() || it->second.empty()) return {};
        return it->second.back();
    }
    std::size_t depth(uint32_t tid) const {
        auto it = stacks_.find(tid);
        return it == stacks_.end() ? 0 : it->second.size();
    }
    void clear() { stacks_.clear(); }

  private:
    std::unordered_map<uint32_t, std::vector<Tag>> stacks_;
};

// One allocation that proves a finding; strings owned here.
struct Evidence {
    uint64_t size = 0;
    std::string layer;
    std::string phase;
    uint64_t step = 0;
    uint64_t alloc_seq = 0;
    uint64_t free_seq = 0;  // 0: alive when the finding was made
    uint32_t stack_id = 0;
    std::string note;  // what the allocation is, why it is alive; "" for none
};

// An allocation kept as evidence, by ids: cheap to copy while a plugin
// follows the stream; made an Evidence (text) only when a finding is emitted.
struct HeldAlloc {
    uint64_t size = 0;
    uint64_t step = 0;
    uint64_t alloc_seq = 0;
    uint32_t stack_id = 0;
    uint32_t layer = 0;  // Interner ids
    uint32_t phase = 0;
};

struct Finding {
    allocscope_severity_v1 severity = ALLOCSCOPE_SEVERITY_WARNING;
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::vector<Evidence> evidence;
    // How the claim was established (allocscope_finding_v1::basis): "proven",
    // "size-only", "baseline"; "" when not applicable.
    std::string basis;
};

// Hands a Finding to the host (which copies it), with its basis and, when
// any evidence has one, the evidence notes.
inline void emit(const allocscope_host_v1& host, const Finding& f) {
    std::vector<allocscope_evidence_v1> ev;
    std::vector<const char*> notes;
    ev.reserve(f.evidence.size());
    notes.reserve(f.evidence.size());
    bool any_note = false;
    for (const Evidence& e : f.evidence) {
        ev.push_back({e.size, e.layer.c_str(), e.phase.c_str(), e.step, e.alloc_seq, e.free_seq,
                      e.stack_id});
        notes.push_back(e.note.c_str());
        any_note = any_note || !e.note.empty();
    }
    allocscope_finding_v1 out{};
    out.struct_size = sizeof out;
    out.severity = uint32_t(f.severity);
    out.layer = f.layer.c_str();
    out.phase = f.phase.c_str();
    out.bytes = f.bytes;
    out.count = f.count;
    out.summary = f.summary.c_str();
    out.evidence = ev.data();
    out.evidence_count = ev.size();
    out.basis = f.basis.empty() ? nullptr : f.basis.c_str();
    out.evidence_notes = any_note ? notes.data() : nullptr;
    host.emit(host.ctx, &out);
}

// Option `key` of this plugin as a number, or `fallback` when unset. A value
// that is not a non-negative integer (optionally with a K/M/G/KiB/MiB/GiB
// suffix) throws std::invalid_argument naming the option, which disables
// the plugin with that message.
inline uint64_t option_bytes(const allocscope_host_v1& host, const char* key, uint64_t fallback) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    std::string_view v(text);
    uint64_t value = 0;
    std::size_t i = 0;
    for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) {
        if (value > (UINT64_MAX - 9) / 10)
            throw std::invalid_argument(std::string(key) + "=" + text + ": too large");
        value = value * 10 + uint64_t(v[i] - '0');
    }
    const std::string_view suffix = v.substr(i);
    uint64_t unit = 1;
    if (suffix == "K" || suffix == "KiB")
        unit = 1ull << 10;
    else if (suffix == "M" || suffix == "MiB")
        unit = 1ull << 20;
    else if (suffix == "G" || suffix == "GiB")
        unit = 1ull << 30;
    else if (!suffix.empty() && suffix != "B")
        i = 0;
    if (i == 0) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected bytes such as 51200, 50KiB or 1MiB");
    }
    return value * unit;
}

inline double option_number(const allocscope_host_v1& host, const char* key, double fallback) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= 0)) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected a non-negative number");
    }
    return value;
}

// C ABI trampolines for a class T with
//   explicit T(const allocscope_host_v1& host);
//   void on_event(const allocscope_event_v1& event);
//   void on_step(uint64_t step, uint32_t source);
//   void finish();
// An exception becomes ALLOCSCOPE_PLUGIN_ERROR and is logged through the
// host, so the host disables the plugin with the reason.
template <class T>
struct Adapter {
    static void log_exception(const allocscope_host_v1* host, const char* call) noexcept {
        try {
            throw;
        } catch (const std::exception& e) {
            if (host) host->log(host->ctx, (std::string(call) + ": " + e.what()).c_str());
        } catch (...) {
            if (host) host->log(host->ctx, (std::string(call) + ": unknown exception").c_str());
        }
    }
    struct State {
        const allocscope_host_v1* host;
        std::unique_ptr<T> plugin;
    };
    static allocscope_plugin_status init(const allocscope_host_v1* host, void** state) noexcept {
        try {
            auto s = std::make_unique<State>(State{host, std::make_unique<T>(*host)});
            *state = s.release();
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(host, "init");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status on_event(void* state, const allocscope_event_v1* e) noexcept {
        auto* s = static_cast<State*>(state);
        try {
            s->plugin->on_event(*e);
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "on_event");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status on_step(void* state, uint64_t step, uint32_t source) noexcept {
        auto* s = static_cast<State*>(state);
        try {
            s->plugin->on_step(step, source);
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "on_step");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
    static allocscope_plugin_status finish(void* state) noexcept {
        std::unique_ptr<State> s(static_cast<State*>(state));
        try {
            s->plugin->finish();
            return ALLOCSCOPE_PLUGIN_OK;
        } catch (...) {
            log_exception(s->host, "finish");
            return ALLOCSCOPE_PLUGIN_ERROR;
        }
    }
};

// ---- Helpers shared by phase-retention, cross-step-leak and peak-owner ----

// The well-known phase a (sub-)phase belongs to: "forward/quantize" →
// "forward"; a phase without '/' is its own base.
inline std::string_view base_phase(std::string_view phase) {
    return phase.substr(0, phase.find('/'));
}

// Option `key` as a plain integer in [min, max], or `fallback` when unset.
// Anything else throws std::invalid_argument naming the option (the plugin
// is then disabled with that message).
inline uint64_t option_count(const allocscope_host_v1& host, const char* key, uint64_t fallback,
                             uint64_t min, uint64_t max) {
    const char* text = host.option(host.ctx, key);
    if (!text) return fallback;
    std::string_view v(text);
    uint64_t value = 0;
    bool ok = !v.empty() && v.size() <= 19;
    for (char c : v) {
        if (c < '0' || c > '9') {
            ok = false;
            break;
        }
        value = value * 10 + uint64_t(c - '0');
    }
    if (!ok || value < min || value > max) {
        throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                    ": expected an integer from " + std::to_string(min) + " to " +
                                    std::to_string(max));
    }
    return value;
}

// "512 B", "48.0 KiB (49152 B)", "1.50 MiB (1574912 B)": readable, and
// exact for whoever compares numbers.
inline std::string format_bytes(uint64_t bytes) {
    if (bytes < 1024) return std::to_string(bytes) + " B";
    const char* unit = "KiB";
    double value = double(bytes) / 1024.0;
    if (bytes >= (1ull << 30)) {
        unit = "GiB";
        value = double(bytes) / double(1ull << 30);
    } else if (bytes >= (1ull << 20)) {
        unit = "MiB";
        value = double(bytes) / double(1ull << 20);
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f %s (%llu B)", value < 10 ? 2 : 1, value, unit,
                  static_cast<unsigned long long>(bytes));
    return buf;
}

// Dense ids for strings (layers, phases): a plugin keys its maps by id and
// turns ids back into text only when it emits. Id 0 is "".
class Interner {
  public:
    Interner() { intern(""); }
    uint32_t intern(std::string_view text) {
        auto it = ids_.find(text);
        if (it != ids_.end()) return it->second;
        const auto id = uint32_t(texts_.size());
        texts_.emplace_back(text);
        ids_.emplace(texts_.back(), id);
        return id;
    }
    // A tag string of an event or live record. The host interns those
    // (plugin_v1.h): one address per text, valid until finish. So the
    // address is the key, and each distinct one is hashed by text once.
    uint32_t tag(const char* text) {
        if (!text) return 0;
        const auto key = reinterpret_cast<uintptr_t>(text);
        if (const uint32_t* id = tags_.find(key)) return *id;
        const uint32_t id = intern(std::string_view(text));
        tags_[key] = id;
        return id;
    }
    const std::string& text(uint32_t id) const { return texts_.at(id); }
    // The id of the base phase of phase `id` (see base_phase()), cached.
    uint32_t base_phase(uint32_t id) {
        if (id >= bases_.size()) bases_.resize(id + 1, UINT32_MAX);
        if (bases_[id] == UINT32_MAX) {
            // A copy: interning may move the strings a view would point into.
            const std::string base(allocscope::plugins::base_phase(text(id)));
            bases_[id] = intern(base);
        }
        return bases_[id];
    }

  private:
    // Transparent, so a lookup by string_view builds no std::string.
    struct Hash {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const noexcept {
            return std::hash<std::string_view>{}(s);
        }
    };
    std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> ids_;
    std::vector<std::string> texts_;
    FlatMap<uintptr_t, uint32_t> tags_;
    std::vector<uint32_t> bases_;
};

// The allocations a plugin holds as evidence for a finding it emits later
// (at finish): follows their frees, so the emitted evidence says which were
// freed since (free_seq) and which are still alive (0). Held seqs are
// reference counted, so one allocation may prove several findings.
class EvidenceWatch {
  public:
    void hold(uint64_t alloc_seq) { ++watched_[alloc_seq].refs; }
    void release(uint64_t alloc_seq) {
        Watched* w = watched_.find(alloc_seq);
        if (w && --w->refs == 0) watched_.erase(alloc_seq);
    }
    // Every alloc_seq of a list of Evidence or HeldAlloc.
    template <class T>
    void hold(const std::vector<T>& evidence) {
        for (const T& e : evidence)
            hold(e.alloc_seq);
    }
    template <class T>
    void release(const std::vector<T>& evidence) {
        for (const T& e : evidence)
            release(e.alloc_seq);
    }
    // A FREE event of a known allocation.
    void on_free(uint64_t alloc_seq, uint64_t free_seq) {
        if (Watched* w = watched_.find(alloc_seq)) w->free_seq = free_seq;
    }
    // Sets free_seq of each held entry from the frees seen since.
    void fill(std::vector<Evidence>& evidence) const {
        for (Evidence& e : evidence) {
            if (const Watched* w = watched_.find(e.alloc_seq)) e.free_seq = w->free_seq;
        }
    }
    std::size_t size() const { return watched_.size(); }

  private:
    struct Watched {
        uint64_t refs = 0;
        uint64_t free_seq = 0;
    };
    FlatMap<uint64_t, Watched> watched_;
};

// ---- Helpers shared by weight-copy-accumulation and transpose-cache-retention ----

// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, and
// harness/alloc/caching_allocator.h): requests are rounded up to multiples of
// 512 B (at least 512 B); blocks above 1 MiB come from the large pool, where
// a free block is handed out unsplit when the remainder is at most 1 MiB.
inline constexpr uint64_t kCachingMinBlock = 512;
inline constexpr uint64_t kCachingSmallSize = uint64_t{1} << 20;

inline constexpr uint64_t caching_round(uint64_t bytes) {
    return bytes < kCachingMinBlock
               ? kCachingMinBlock
               : kCachingMinBlock * ((bytes + kCachingMinBlock - 1) / kCachingMinBlock);
}

// A set of byte counts, matched the way allocation events report them: the
// raw request (cudaMallocAsync, an allocator that reports requests), the
// caching allocator's rounded block, or a large-pool block handed out
// unsplit (up to 1 MiB above the rounded request).
class SizeSet {
  public:
    void add(uint64_t raw) {
        if (raw == 0) return;
        raw_.push_back(raw);
        rounded_.push_back(caching_round(raw));
        sealed_ = false;
    }
    void seal() {
        if (sealed_) return;
        for (std::vector<uint64_t>* v : {&raw_, &rounded_}) {
            std::sort(v->begin(), v->end());
            v->erase(std::unique(v->begin(), v->end()), v->end());
        }
        sealed_ = true;
    }
    bool contains(uint64_t size) const {
        if (!sealed_) throw std::logic_error("SizeSet used before seal()");
        if (std::binary_search(raw_.begin(), raw_.end(), size)) return true;
        auto it = std::upper_bound(rounded_.begin(), rounded_.end(), size);
        if (it == rounded_.begin()) return false;
        const uint64_t r = *(it - 1);  // the largest rounded size <= size
        return r == size || (r > kCachingSmallSize && size - r <= kCachingSmallSize);
    }
    std::size_t size() const { return raw_.size(); }

  private:
    std::vector<uint64_t> raw_;
    std::vector<uint64_t> rounded_;
    bool sealed_ = true;
};

// Which forms of a weight count as derived from it.
struct WeightSizeRules {
    // A bf16 copy (2·numel bytes). Off where an allocation of that size is
    // as likely to be the weight's gradient (backward).
    bool bf16_copy = true;
    // Shard-sized forms too (a column-wise form built per shard: numel/world
    // bytes and its scales divided by the world size), for the shard count
    // numel / sharded_numel and for `world`.
    bool sharded = false;
    // The host's world size (0: unknown).
    uint64_t world = 0;
    // Parameters' gradients are made where the forms are (backward): a
    // scale-sized allocation that is a registered parameter's gradient size
    // is taken for the gradient (WeightParams::match).
    bool gradients = false;
};

// The byte counts of what a quantized (or copied) weight of `numel` elements
// allocates, per TransformerEngine's quantizers (harness/fp8/layout.h):
//   data   FP8 E4M3/E5M2 data or transpose, MXFP8 row-/column-wise data,
//          Float8BlockScaling data: numel; NVFP4 data: numel/2 (two E2M1 per
//          byte); a bf16 copy: 2·numel (rules.bf16_copy).
//   scales per-tensor scale_inv and NVFP4 amax (4 B); MXFP8 E8M0 scales
//          [round_up(R,128) × round_up(C/32,4)] and [round_up(R/32,4) ×
//          round_up(C,128)]; NVFP4 E4M3 scales [round_up(R,128) ×
//          round_up(C/16,4)] and the transposed form; Float8BlockScaling fp32
//          scales, 2-D 128×128 blocks (weights) and 1-D 1×128 blocks.
// A parameter event has no shape, so the scales are those of every shape
// R × C = numel with R, C >= 16 that the recipe accepts (numels of real
// weights have few divisors; above 2^44 elements only the 4-byte scales are
// listed).
struct WeightSizes {
    SizeSet data;
    SizeSet scales;
};

inline WeightSizes weight_derived_sizes(uint64_t numel, uint64_t sharded_numel,
                                        const WeightSizeRules& rules) {
    auto ceil_div = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
    auto round_up = [&](uint64_t a, uint64_t b) { return ceil_div(a, b) * b; };
    // Shard counts: the registered shard's (HSDP shards over a subgroup) and
    // the host's world size.
    std::vector<uint64_t> shards;
    if (rules.sharded) {
        if (sharded_numel > 0 && sharded_numel < numel)
            shards.push_back(ceil_div(numel, sharded_numel));
        if (rules.world > 1) shards.push_back(rules.world);
    }

    WeightSizes out;
    out.data.add(numel);
    out.data.add(ceil_div(numel, 2));
    if (rules.bf16_copy) out.data.add(2 * numel);
    for (uint64_t w : shards) {
        out.data.add(ceil_div(numel, w));
        out.data.add(ceil_div(ceil_div(numel, 2), w));
    }
    if (!shards.empty() && sharded_numel > 0 && sharded_numel < numel) {
        out.data.add(sharded_numel);
        out.data.add(ceil_div(sharded_numel, 2));
    }

    auto scale = [&](uint64_t bytes) {
        out.scales.add(bytes);
        for (uint64_t w : shards)
            out.scales.add(ceil_div(bytes, w));
    };
    scale(4);
    auto shape = [&](uint64_t r, uint64_t c) {
        // FP8 GEMMs want both dimensions to be multiples of 16; degenerate
        // shapes ([n/2 × 2]) would give 1-D block scales the size of a bf16
        // gradient (2·numel).
        if (r < 16 || c < 16) return;
        if (r % 32 == 0 && c % 32 == 0) {  // MXFP8, 1×32 / 32×1 blocks, E8M0
            scale(round_up(r, 128) * round_up(c / 32, 4));
            scale(round_up(r / 32, 4) * round_up(c, 128));
        }
        if (r % 16 == 0 && c % 16 == 0) {  // NVFP4, 16-element blocks, E4M3
            scale(round_up(r, 128) * round_up(c / 16, 4));
            scale(round_up(c, 128) * round_up(r / 16, 4));
        }
        // Float8BlockScaling, fp32: 2-D weight blocks, then 1-D blocks.
        scale(ceil_div(r, 128) * round_up(ceil_div(c, 128), 4) * 4);
        scale(ceil_div(c, 128) * round_up(ceil_div(r, 128), 4) * 4);
        scale(ceil_div(c, 128) * round_up(r, 4) * 4);
        scale(ceil_div(r, 128) * round_up(c, 4) * 4);
    };
    if (numel > 0 && numel <= (uint64_t{1} << 44)) {
        for (uint64_t d = 1; d * d <= numel; ++d) {
            if (numel % d != 0) continue;
            shape(d, numel / d);
            shape(numel / d, d);
        }
    }
    out.data.seal();
    out.scales.seal();
    return out;
}

// The numbered layer a module belongs to: its shortest prefix whose last
// component is a number ("model.layers.3.mlp.fc1" → "model.layers.3",
// "layers.3" → "layers.3"), or "" when no component is a number.
inline std::string_view numbered_layer(std::string_view module) {
    std::size_t begin = 0;
    while (begin < module.size()) {
        std::size_t end = module.find('.', begin);
        if (end == std::string_view::npos) end = module.size();
        bool digits = end > begin;
        for (std::size_t i = begin; i < end && digits; ++i)
            digits = module[i] >= '0' && module[i] <= '9';
        if (digits) return module.substr(0, end);
        begin = end + 1;
    }
    return {};
}

// The module directly enclosing `module` ("layers.3.fc1" → "layers.3",
// "layers" → "").
inline std::string_view parent_module(std::string_view module) {
    const std::size_t dot = module.rfind('.');
    return dot == std::string_view::npos ? std::string_view{} : module.substr(0, dot);
}

// The innermost module enclosing both (layer_within both), "" when none.
inline std::string_view common_module(std::string_view a, std::string_view b) {
    while (!a.empty() && !layer_within(b, a))
        a = parent_module(a);
    return a;
}

// The registered parameters of at least `min_numel` elements, by module, with
// their weight-derived sizes (computed when first needed).
class WeightParams {
  public:
    WeightParams(Interner& strings, WeightSizeRules rules, uint64_t min_numel)
        : strings_(strings), rules_(rules), min_numel_(min_numel) {}

    // The parameters the host has registered so far.
    void sync(const allocscope_host_v1& host) {
        const std::size_t n = host.param_count(host.ctx);
        for (std::size_t i = 0; i < n; ++i) {
            if (const allocscope_param_v1* p = host.param(host.ctx, i)) add(*p);
        }
    }
    // A PARAM event's parameter; one registered again (the baseline's and
    // the run's streams both register it) replaces the earlier entry.
    void add(const allocscope_param_v1& p) {
        const std::string layer = p.layer ? p.layer : "";
        if (layer.empty()) return;
        add_gradient(layer, p);
        if (p.numel < min_numel_) return;
        const std::string key = layer + '\n' + (p.name ? p.name : "");
        auto [it, inserted] = index_.try_emplace(key, uint32_t(params_.size()));
        if (inserted) {
            params_.push_back({});
            by_module_[layer].push_back(it->second);
        }
        Param& q = params_[it->second];
        q.module = strings_.intern(layer);
        q.name = strings_.intern(p.name ? p.name : "");
        q.numbered = strings_.intern(numbered_layer(layer));
        q.numel = p.numel;
        q.sharded_numel = p.sharded_numel;
        q.sizes.reset();
        containing_.clear();
        memo_.clear();
    }

    struct Match {
        uint32_t param;
        bool data;  // data-sized; false: scale-sized
    };
    // The parameter an allocation of `size` made under module `layer` is
    // derived from, among those whose module is `layer` or encloses it: a
    // data-sized match if any, else a scale-sized one.
    std::optional<Match> match(uint32_t layer, uint64_t size) {
        // Memoized: a training loop allocates the same sizes in the same
        // modules every step.
        const MatchKey key{layer, size};
        if (const Memo* m = memo_.find(key))
            return m->found ? std::optional<Match>(m->match) : std::nullopt;
        if (memo_.size() >= kMaxMemo) memo_.clear();
        const std::optional<Match> found = search(layer, size);
        memo_[key] = found ? Memo{true, *found} : Memo{};
        return found;
    }
    uint32_t module(uint32_t param) const { return params_.at(param).module; }
    // Interned numbered_layer(module); 0 ("") when the module has none.
    uint32_t numbered(uint32_t param) const { return params_.at(param).numbered; }
    uint32_t name(uint32_t param) const { return params_.at(param).name; }
    uint64_t numel(uint32_t param) const { return params_.at(param).numel; }
    std::size_t size() const { return params_.size(); }

  private:
    struct MatchKey {
        uint32_t layer = 0;
        uint64_t size = 0;
        bool operator==(const MatchKey&) const = default;
    };
    struct MatchKeyHash {
        uint64_t operator()(const MatchKey& k) const noexcept {
            return k.size ^ (uint64_t(k.layer) * 0xff51afd7ed558ccdull);
        }
    };
    struct Memo {
        bool found = false;
        Match match{};
    };
    static constexpr std::size_t kMaxMemo = std::size_t{1} << 16;

    std::optional<Match> search(uint32_t layer, uint64_t size) {
        const std::vector<uint32_t>& candidates = containing(layer);
        std::optional<Match> scale;
        for (uint32_t i : candidates) {
            const WeightSizes& s = sizes(i);
            if (s.data.contains(size)) return Match{i, true};
            if (!scale && s.scales.contains(size)) scale = Match{i, false};
        }
        // A scale is a few bytes to a few KiB, the sizes of small parameters'
        // gradients too (a bias's, kept across micro-batches under gradient
        // accumulation). Where the layer has a parameter whose gradient has
        // this size, the gradient is taken for its owner; except for the
        // caching allocator's smallest block, which every scale below 512 B
        // becomes and which therefore stays a scale.
        if (scale && rules_.gradients && size > kCachingMinBlock && gradient_sized(layer, size))
            return std::nullopt;
        return scale;
    }

    // The gradient sizes of every registered parameter (biases and norms
    // too, whatever min_numel), by the parameter's numbered layer (its
    // module when it has none): numel and sharded_numel times the dtype's
    // size and the usual gradient dtypes' (bf16/fp16, fp32). A parameter
    // registered again adds its sizes again (the set keeps them once).
    void add_gradient(const std::string& layer, const allocscope_param_v1& p) {
        const std::string_view numbered = numbered_layer(layer);
        SizeSet& sizes = gradient_sizes_[numbered.empty() ? layer : std::string(numbered)];
        const uint64_t element = dtype_bytes(p.dtype ? p.dtype : "");
        for (uint64_t n : {p.numel, p.sharded_numel}) {
            for (uint64_t bytes : {element, uint64_t{2}, uint64_t{4}})
                sizes.add(n * bytes);  // 0 (unknown dtype, no shard) is not added
        }
        memo_.clear();
    }
    static uint64_t dtype_bytes(std::string_view dtype) {
        if (dtype == "fp64") return 8;
        if (dtype == "fp32") return 4;
        if (dtype == "bf16" || dtype == "fp16") return 2;
        if (dtype.starts_with("fp8")) return 1;
        return 0;
    }
    // Whether `size` is the gradient size of a parameter in the numbered
    // layer of `layer`, or, outside any, of `layer` or a module enclosing it.
    bool gradient_sized(uint32_t layer, uint64_t size) {
        auto in_group = [&](std::string_view group) {
            auto it = gradient_sizes_.find(std::string(group));
            if (it == gradient_sizes_.end()) return false;
            it->second.seal();  // sorts what was added since
            return it->second.contains(size);
        };
        const std::string_view m = strings_.text(layer);
        const std::string_view numbered = numbered_layer(m);
        if (!numbered.empty()) return in_group(numbered);
        for (std::string_view up = m; !up.empty(); up = parent_module(up)) {
            if (in_group(up)) return true;
        }
        return false;
    }

    struct Param {
        uint32_t module = 0;
        uint32_t numbered = 0;
        uint32_t name = 0;
        uint64_t numel = 0;
        uint64_t sharded_numel = 0;
        std::unique_ptr<WeightSizes> sizes;
    };
    const WeightSizes& sizes(uint32_t i) {
        Param& p = params_[i];
        if (!p.sizes)
            p.sizes = std::make_unique<WeightSizes>(
                weight_derived_sizes(p.numel, p.sharded_numel, rules_));
        return *p.sizes;
    }
    // Parameters whose module is the module `layer` or one enclosing it;
    // cached per layer (a run has a few thousand distinct tags).
    const std::vector<uint32_t>& containing(uint32_t layer) {
        auto it = containing_.find(layer);
        if (it != containing_.end()) return it->second;
        std::vector<uint32_t> out;
        std::string_view m = strings_.text(layer);
        for (; !m.empty(); m = parent_module(m)) {
            auto found = by_module_.find(std::string(m));
            if (found != by_module_.end())
                out.insert(out.end(), found->second.begin(), found->second.end());
        }
        return containing_.emplace(layer, std::move(out)).first->second;
    }

    Interner& strings_;
    WeightSizeRules rules_;
    uint64_t min_numel_;
    std::vector<Param> params_;
    std::unordered_map<std::string, uint32_t> index_;
    std::unordered_map<std::string, std::vector<uint32_t>> by_module_;
    std::unordered_map<uint32_t, std::vector<uint32_t>> containing_;
    FlatMap<MatchKey, Memo, MatchKeyHash> memo_;
    std::unordered_map<std::string, SizeSet> gradient_sizes_;  // by numbered layer (add_gradient)
};

// Which allocation level a detector follows. "block": a caching allocator's
// tensors (~ memory_allocated); "segment": runtime-API allocations (under
// PyTorch's cudaMallocAsync backend every tensor is one); "auto": blocks
// once the stream has reported any, segments until then.
enum class LevelMode { automatic, block, segment };

inline LevelMode option_level(const allocscope_host_v1& host, const char* key) {
    const char* text = host.option(host.ctx, key);
    if (!text) return LevelMode::automatic;
    const std::string_view v(text);
    if (v == "auto") return LevelMode::automatic;
    if (v == "block") return LevelMode::block;
    if (v == "segment") return LevelMode::segment;
    throw std::invalid_argument(std::string("option ") + key + "=" + text +
                                ": expected auto, block or segment");
}

class LevelFilter {
  public:
    explicit LevelFilter(LevelMode mode) : mode_(mode) { reset(); }
    // A new stream (the run after the baseline).
    void reset() {
        level_ = mode_ == LevelMode::segment ? ALLOCSCOPE_LEVEL_SEGMENT
                 : mode_ == LevelMode::block ? ALLOCSCOPE_LEVEL_BLOCK
                                             : ALLOCSCOPE_LEVEL_SEGMENT;
    }
    // Whether an ALLOC/FREE event is of the followed level. Returns true
    // and sets *switched when auto mode moves to blocks on this event (the
    // caller drops what it holds of segments).
    bool follow(const allocscope_event_v1& e, bool* switched) {
        *switched = false;
        if (mode_ == LevelMode::automatic && level_ == ALLOCSCOPE_LEVEL_SEGMENT &&
            e.level == ALLOCSCOPE_LEVEL_BLOCK && e.kind == ALLOCSCOPE_EVENT_ALLOC) {
            level_ = ALLOCSCOPE_LEVEL_BLOCK;
            *switched = true;
        }
        return e.level == level_;
    }
    uint32_t level() const { return level_; }

  private:
    LevelMode mode_;
    uint32_t level_ = ALLOCSCOPE_LEVEL_SEGMENT;
};

// A finding's evidence, capped (the count stays exact), in sequence order.
inline constexpr std::size_t kMaxEvidence = 256;
inline std::vector<Evidence> capped_evidence(std::vector<Evidence> evidence) {
    std::sort(evidence.begin(), evidence.end(),
              [](const Evidence& a, const Evidence& b) { return a.alloc_seq < b.alloc_seq; });
    if (evidence.size() > kMaxEvidence) evidence.resize(kMaxEvidence);
    return evidence;
}

// "-1.50 MiB" / "+512 B" for signed differences.
inline std::string format_signed_bytes(double bytes) {
    const double magnitude = bytes < 0 ? -bytes : bytes;
    return std::string(bytes < 0 ? "-" : "+") + format_bytes(uint64_t(magnitude + 0.5));
}

}  // namespace allocscope::plugins

// Defines the one exported symbol of a plugin built from class `Class`.
#define ALLOCSCOPE_DEFINE_PLUGIN(Class, plugin_name, plugin_description, mask) \
    extern "C" __attribute__((visibility("default")))                          \
    const allocscope_plugin_v1 allocscope_plugin = {                           \
        sizeof(allocscope_plugin_v1),                                          \
        ALLOCSCOPE_PLUGIN_ABI_VERSION,                                         \
        plugin_name,                                                           \
        plugin_description,                                                    \
        mask,                                                                  \
        &::allocscope::plugins::Adapter<Class>::init,                          \
        &::allocscope::plugins::Adapter<Class>::on_event,                      \
        &::allocscope::plugins::Adapter<Class>::on_step,                       \
        &::allocscope::plugins::Adapter<Class>::finish,                        \
    }
