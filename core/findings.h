// Findings: what detection plugins report, and the findings JSON files
// (docs/FINDINGS.md is the schema). The writer escapes every string so a
// layer name taken from the traced program can never break the JSON or an
// HTML page that embeds it. The reader is offline code:
// analyze/findings_reader.h.
#pragma once

#include <allocscope/sdk/evidence.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace allocscope {

// Values match allocscope_severity_v2.
enum class Severity : uint8_t { info = 0, warning = 1, error = 2 };

std::string_view to_string(Severity severity) noexcept;
std::optional<Severity> parse_severity(std::string_view text) noexcept;

// Evidence, one allocation that proves a finding, is
// allocscope/sdk/evidence.h's (the plugins build the same).

struct Finding {
    std::string plugin;
    Severity severity = Severity::info;
    int32_t rank = -1;  // -1: the process had no rank
    uint32_t pid = 0;   // the process, when it had no rank (0 otherwise, or unknown)
    std::string layer;  // "" when not attributed to a layer
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::vector<Evidence> evidence;
    // How the claim was established: "proven", "corroborated", "size-only";
    // "" when the plugin does not say (plugin_v2.h, allocscope_finding_v2)
    // or is a version 1 plugin (plugin_v1.h has no basis).
    std::string basis;

    bool operator==(const Finding&) const = default;
};

struct DisabledPlugin {
    std::string plugin;  // the plugin's name, or the requested entry when it never loaded
    std::string reason;

    bool operator==(const DisabledPlugin&) const = default;
};

// What ran on one rank's (or process's) stream.
struct RankRun {
    int32_t rank = -1;
    std::string trace;                 // the trace file the stream is recorded in
    std::vector<std::string> plugins;  // ran to the end
    std::vector<DisabledPlugin> disabled;
    // Whether the stream declared provenance (its last
    // ALLOCSCOPE_PROVENANCE_MARK): "on", "off: <why>", "" when it said
    // nothing (a program that declares none, or an older one).
    std::string provenance;

    bool operator==(const RankRun&) const = default;
};

struct FindingsFile {
    std::vector<Finding> findings;
    std::vector<RankRun> ranks;

    bool operator==(const FindingsFile&) const = default;
};

inline constexpr int kFindingsFormatVersion = 1;

// A JSON string literal (quotes included). Control characters, quotes,
// backslashes, '<', '>', '&', U+2028 and U+2029 are escaped; bytes that are
// not valid UTF-8 become U+FFFD, so the output is always valid UTF-8 JSON.
std::string json_quote(std::string_view text);

// The whole file, pretty-printed (one finding per block), ending in '\n'.
std::string to_json(const FindingsFile& file);

class FindingsError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Writes `path` through a temporary file in the same directory and a rename,
// so a reader never sees half a file; mode 0600. Throws FindingsError naming
// the path and the reason.
void write_findings_file(const std::string& path, const FindingsFile& file);

// One line for a terminal: severity, plugin, rank, layer/phase, bytes,
// summary. Control characters in strings taken from the trace are replaced
// so they cannot drive the terminal.
std::string summary_line(const Finding& finding);
// The same with `who` in place of "rank R" (the text report's "ranks 0–1").
std::string summary_line(const Finding& finding, std::string_view who);
// Who a finding or trace is about, for people: "rank 3", else "pid 4242" (a
// process without a rank), else "no rank" (the pid is unknown).
std::string process_label(int32_t rank, uint32_t pid);

// "1.5 MiB" style sizes.
std::string human_bytes(uint64_t bytes);

// `s` with control characters replaced by '?': text from a trace printed to
// a terminal cannot drive it.
std::string printable(std::string_view s);

}  // namespace allocscope
