// Plugin SDK: a finding as a plugin builds it (Finding, with its Evidence)
// and emit(), which hands it to the host through the C ABI; the evidence
// cap.
#pragma once

#include <allocscope/plugin_v2.h>
#include <allocscope/sdk/evidence.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace allocscope::plugins {

struct Finding {
    allocscope_severity_v2 severity = ALLOCSCOPE_SEVERITY_WARNING;
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::vector<Evidence> evidence;
    // How the claim was established (allocscope_finding_v2::basis): "proven",
    // "size-only", "baseline"; "" when not applicable.
    std::string basis;
};

// Hands a Finding to the host (which copies it), with its basis and, when
// any evidence has one, the evidence notes.
inline void emit(const allocscope_host_v2& host, const Finding& f) {
    std::vector<allocscope_evidence_v2> ev;
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
    allocscope_finding_v2 out{};
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

// A finding's evidence, capped (the count stays exact): the largest
// allocations first, equal sizes in sequence order, so that the cap keeps
// the largest and the first evidence (whose stack the report shows) is the
// one that holds the most bytes (the host orders every finding so too).
inline constexpr std::size_t kMaxEvidence = 256;
inline std::vector<Evidence> capped_evidence(std::vector<Evidence> evidence) {
    std::sort(evidence.begin(), evidence.end(), [](const Evidence& a, const Evidence& b) {
        return a.size != b.size ? a.size > b.size : a.alloc_seq < b.alloc_seq;
    });
    if (evidence.size() > kMaxEvidence) evidence.resize(kMaxEvidence);
    return evidence;
}

}  // namespace allocscope::plugins
