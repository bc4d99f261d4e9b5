// Cross-rank imbalance: a rank that holds far more than the others. No
// plugin sees it, since each runs on one rank's stream; the report sets the
// ranks' analyses side by side.
#pragma once

#include <vector>

#include "analysis.h"
#include "findings.h"

namespace allocscope {

inline constexpr const char* kImbalancePlugin = "cross-rank-imbalance";

// Each rank's owner-pool bytes set against the median of the other
// ranks': live when the last step every rank began began (a warning: what
// a rank keeps from step to step), and at its peak (an info). One finding
// per rank and figure whose excess is at least kImbalanceShare of that
// median and kImbalanceMinBytes, and more than twice the others' own spread
// (ranks that differ by design, e.g. uneven shards, do not stand out). Its
// summary names what the rank holds extra against the others' medians (by
// layer group, or by (layer, phase) at the peak); its layer is the largest
// such part. Processes without a rank, and runs of fewer than 2 ranks, give
// none.
std::vector<Finding> imbalance_findings(const std::vector<const TraceAnalysis*>& ranks);

inline constexpr double kImbalanceShare = 0.02;
inline constexpr uint64_t kImbalanceMinBytes = 64 * 1024;

}  // namespace allocscope
