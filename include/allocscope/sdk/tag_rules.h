// The rules on tag names that the host, the reports, the NVTX tag mapping
// and the plugins all apply: a phase's base phase and sub-phases
// ("forward/quantize" is within "forward"), a module within a scope, the
// numbered layer and parent of a module path. Header-only, no dependency but
// the standard library, so core, the interposer and plugins share it.
#pragma once

#include <cstddef>
#include <string_view>

namespace allocscope {

// The well-known phase a (sub-)phase belongs to: "forward/quantize" →
// "forward"; a phase without '/' is its own base.
inline std::string_view base_phase(std::string_view phase) {
    return phase.substr(0, phase.find('/'));
}

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

}  // namespace allocscope

// The plugin SDK's namespace names them too (they were declared there first).
namespace allocscope::plugins {
using allocscope::base_phase;
using allocscope::common_module;
using allocscope::layer_within;
using allocscope::numbered_layer;
using allocscope::parent_module;
using allocscope::phase_within;
}  // namespace allocscope::plugins
