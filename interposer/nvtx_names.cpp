#include "nvtx_names.h"

#include <allocscope/allocscope.h>
#include <allocscope/sdk/tag_rules.h>

#include <charconv>

namespace allocscope::nvtx {

namespace {

constexpr std::string_view kPrefix = ALLOCSCOPE_NVTX_PREFIX;
constexpr std::string_view kStep = "step=";
constexpr std::string_view kFsdp = "FSDP::";

// Control characters never reach a tag: they would garble reports.
bool printable(std::string_view s) {
    for (unsigned char c : s) {
        if (c < 0x20 || c == 0x7f) return false;
    }
    return true;
}

std::optional<uint64_t> parse_step(std::string_view digits) {
    uint64_t n = 0;
    if (digits.empty() || digits.front() < '0' || digits.front() > '9') return std::nullopt;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return n;
}

bool label_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// `allocscope:<layer>/<phase>`: the layer ends at the first '/', so module
// paths keep their dots and phases their sub-phase slashes. An empty part
// keeps the enclosing tag's value, like NULL in allocscope_push.
RangeTag map_allocscope(std::string_view rest) {
    RangeTag t;
    if (!printable(rest)) return t;
    if (rest.starts_with(kStep)) {
        t.step = parse_step(rest.substr(kStep.size()));
        return t;
    }
    const size_t slash = rest.find('/');
    const std::string_view layer = rest.substr(0, slash);
    const std::string_view phase =
        slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    t.mapped = true;
    t.keep_layer = layer.empty();
    t.keep_phase = phase.empty();
    t.layer = layer;
    t.phase = phase;
    return t;
}

// The phase a label names by itself: [root_](pre|post)_<pass>[_<what>] is
// <pass>[/<what>], <pass>_prefetch is <pass>/prefetch.
std::optional<std::string> phase_of_label(std::string_view label) {
    std::string_view l = label;
    if (l.starts_with("root_")) l.remove_prefix(5);
    for (std::string_view pass : {std::string_view("forward"), std::string_view("backward")}) {
        for (std::string_view edge : {std::string_view("pre_"), std::string_view("post_")}) {
            if (!l.starts_with(edge) || !l.substr(edge.size()).starts_with(pass)) continue;
            const std::string_view what = l.substr(edge.size() + pass.size());
            if (what.empty()) return std::string(pass);
            if (what.size() > 1 && what.front() == '_') {
                return std::string(pass) + "/" + std::string(what.substr(1));
            }
        }
        if (l.size() == pass.size() + 9 && l.starts_with(pass) &&
            l.substr(pass.size()) == "_prefetch") {
            return std::string(pass) + "/prefetch";
        }
    }
    return std::nullopt;
}

// FSDP2 (torch.distributed.fsdp._fully_shard): `FSDP::<label>`, with
// ` (<fqn>)` from FSDPParamGroup._with_fqn (nothing for the root module,
// whose fqn is empty) or ` for <fqn>` from _prefetch_unshard.
RangeTag map_fsdp(std::string_view rest) {
    RangeTag t;
    size_t n = 0;
    while (n < rest.size() && label_char(rest[n]))
        ++n;
    if (n == 0) return t;
    const std::string_view label = rest.substr(0, n);
    const std::string_view tail = rest.substr(n);
    std::string_view fqn;
    if (tail.starts_with(" (") && tail.ends_with(")")) {
        fqn = tail.substr(2, tail.size() - 3);
    } else if (tail.starts_with(" for ")) {
        fqn = tail.substr(5);
    } else if (!tail.empty()) {
        return t;
    }
    if (!printable(fqn)) return t;
    if (fqn == "None") fqn = {};  // _prefetch_unshard of a group without fqn
    t.mapped = true;
    t.keep_layer = fqn.empty();
    t.layer = fqn;
    t.keep_phase = false;
    if (std::optional<std::string> phase = phase_of_label(label)) {
        t.phase = std::move(*phase);
    } else {
        t.sub_phase = true;
        t.phase = label;
    }
    return t;
}

}  // namespace

std::string_view strip_profiler_suffix(std::string_view name) {
    for (size_t at = name.find(", "); at != std::string_view::npos; at = name.find(", ", at + 1)) {
        size_t k = at + 2;
        while (k < name.size() &&
               ((name[k] >= 'a' && name[k] <= 'z') || name[k] == '_' || name[k] == ' ')) {
            ++k;
        }
        // ", <words> = ": at least one word character, then " = ".
        if (k > at + 3 && k + 1 < name.size() && name[k] == '=' && name[k - 1] == ' ' &&
            name[k + 1] == ' ' && name[at + 2] != ' ') {
            return name.substr(0, at);
        }
    }
    return name;
}

RangeTag map_range(std::string_view name) {
    if (name.size() > kMaxNameBytes) return {};
    name = strip_profiler_suffix(name);
    if (name.starts_with(kPrefix)) return map_allocscope(name.substr(kPrefix.size()));
    if (name.starts_with(kFsdp)) return map_fsdp(name.substr(kFsdp.size()));
    return {};
}

MarkAction map_mark(std::string_view name) {
    MarkAction m;
    if (name.size() > kMaxNameBytes) return m;
    name = strip_profiler_suffix(name);
    if (!name.starts_with(kPrefix)) return m;
    const std::string_view rest = name.substr(kPrefix.size());
    if (rest.empty() || !printable(rest)) return m;
    if (rest.starts_with(kStep)) {
        if (std::optional<uint64_t> step = parse_step(rest.substr(kStep.size()))) {
            m.kind = MarkAction::Kind::step;
            m.step = *step;
        }
        return m;
    }
    m.kind = MarkAction::Kind::note;
    m.note = rest;
    return m;
}

std::string sub_phase_of(std::string_view current_phase, std::string_view sub) {
    const std::string_view base = base_phase(current_phase);
    if (base.empty()) return std::string(sub);
    return std::string(base) + "/" + std::string(sub);
}

}  // namespace allocscope::nvtx
