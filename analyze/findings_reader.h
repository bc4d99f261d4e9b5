// The findings file reader: a strict parser for the schema in
// docs/FINDINGS.md that reports the first problem with file, line and column.
// Offline only (the CLI, tests): the traced process writes findings files
// (core/findings.h) but never reads them.
#pragma once

#include <string>
#include <string_view>

#include "findings.h"

namespace allocscope {

// Parses a findings document. `origin` names it in error messages
// ("<origin>: line L, column C: <problem>"). Throws FindingsError.
FindingsFile parse_findings(std::string_view text, const std::string& origin);
FindingsFile read_findings_file(const std::string& path);  // throws FindingsError

}  // namespace allocscope
