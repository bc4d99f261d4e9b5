// The findings file reader: a strict parser for the schema in
// docs/FINDINGS.md that reports the first problem with file, line and column,
// and the merging of several processes' files. Offline only (the CLI,
// tests): the traced process writes findings files (core/findings.h) but
// never reads or merges them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "findings.h"

namespace allocscope {

// Parses a findings document. `origin` names it in error messages
// ("<origin>: line L, column C: <problem>"). Throws FindingsError.
FindingsFile parse_findings(std::string_view text, const std::string& origin);
FindingsFile read_findings_file(const std::string& path);  // throws FindingsError

// Concatenates the files ordered by their (first) ranks entry: by rank,
// processes without a rank last, then by trace name; the order within a file
// is kept. A run's merged findings.json and a replay of its traces therefore
// list the same findings in the same order.
FindingsFile merge_findings(std::vector<FindingsFile> files);

// Findings whose severity is at least `threshold`.
size_t count_at_least(const FindingsFile& file, Severity threshold) noexcept;

}  // namespace allocscope
