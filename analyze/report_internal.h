// What the text, JSON and model parts of the report (report_model.cpp,
// report_text.cpp, report_json.cpp) share: small formatting helpers. Not
// part of the report's interface (report.h).
#pragma once

#include <cstdint>
#include <string>

#include "report.h"

namespace allocscope::report_detail {

// "1.234 s".
std::string seconds(uint64_t ns);
// "layers.0 forward", "(untagged)"; printable.
std::string tag_text(const std::string& layer, const std::string& phase);
// "rank 3", else "pid 1234".
std::string rank_name(const TraceAnalysis& a);
// `s` padded on the right / on the left to `width`.
std::string pad(std::string s, size_t width);
std::string rpad(const std::string& s, size_t width);
// A number in decimal.
std::string u(uint64_t v);
// One finding's share of an out-of-memory moment, in one line.
std::string share_line(const OomShare& s, const OomMoment& m);
// "+1.00 MiB" / "-1.00 MiB": `ours` against `theirs`.
std::string signed_bytes(uint64_t ours, uint64_t theirs);

}  // namespace allocscope::report_detail

namespace allocscope {

// What a bounded trace dropped, in one line; "" for a whole trace.
std::string bounded_line(const TraceAnalysis& a);
// The blocks of CUDA graphs' private pools, in one line; "" when none.
std::string graph_pool_line(const TraceAnalysis& a);

}  // namespace allocscope
