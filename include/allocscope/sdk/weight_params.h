// Plugin SDK: WeightParams, the registered parameters by module, matching an
// allocation's size against the forms derived from them.
#pragma once

#include <allocscope/plugin_v2.h>
#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/interner.h>
#include <allocscope/sdk/size_set.h>
#include <allocscope/sdk/tag_rules.h>
#include <allocscope/sdk/weight_sizes.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {

// The registered parameters of at least `min_numel` elements, by module, with
// their weight-derived sizes (computed when first needed).
class WeightParams {
  public:
    WeightParams(Interner& strings, WeightSizeRules rules, uint64_t min_numel)
        : strings_(strings), rules_(rules), min_numel_(min_numel) {}

    // The parameters the host has registered so far.
    void sync(const allocscope_host_v2& host) {
        const std::size_t n = host.param_count(host.ctx);
        for (std::size_t i = 0; i < n; ++i) {
            if (const allocscope_param_v2* p = host.param(host.ctx, i)) add(*p);
        }
    }
    // A PARAM event's parameter; one registered again (the baseline's and
    // the run's streams both register it) replaces the earlier entry.
    void add(const allocscope_param_v2& p) {
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
    void add_gradient(const std::string& layer, const allocscope_param_v2& p) {
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

}  // namespace allocscope::plugins
