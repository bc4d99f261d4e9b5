// Subcommands of the allocscope CLI. Each returns the process exit status:
// 0 success, 2 usage or input error (one message on stderr), otherwise as
// documented per command.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "build_report.h"
#include "config.h"
#include "findings.h"
#include "findings_reader.h"
#include "report.h"
#include "run_inputs.h"

namespace allocscope::cli {

inline constexpr int kExitUsage = 2;
// check, run --check: a finding at or above the --fail-on severity.
inline constexpr int kExitFindings = 3;
// check, run --check, replay: something was not checked (a plugin did not
// load or was disabled, no process wrote a trace or ran plugins). A gate
// that cannot see fails closed.
inline constexpr int kExitUnchecked = 4;

int run_command(const std::vector<std::string>& args);
int report_command(const std::vector<std::string>& args);
int replay_command(const std::vector<std::string>& args);
int check_command(const std::vector<std::string>& args);
int diff_command(const std::vector<std::string>& args);
int export_command(const std::vector<std::string>& args);
int config_command(const std::vector<std::string>& args);

// The ALLOCSCOPE_* variables of this process's environment, parsed once
// (core/config_table.h) as liballocscope.so parses them: the CLI reads its
// own variables (ALLOCSCOPE_LIB, ALLOCSCOPE_PLUGIN_DIR, ...) from here.
const Config& environment_config();

// --- reports (cmd_report.cpp) ---

// Writes `text` to `path`; throws runtime_error naming the file and why.
void write_text_file(const std::string& path, const std::string& text);
// report.txt (concise) and report.html into a run's output directory; the
// report, or nothing (after one message on stderr) when they could not be
// made.
std::optional<Report> write_run_reports(const std::string& out_dir);
// Each rank's last out-of-memory moment, for the end of a run's output.
void print_oom_moments(const Report& report);

// --- findings helpers (findings_cli.cpp) ---

// The directory the CLI looks for plugins in: $ALLOCSCOPE_PLUGIN_DIR, else
// next to the executable (build tree: <build>/plugins; installed:
// <prefix>/<libdir>/allocscope/plugins); "" when none exists.
std::string cli_plugin_dir();

// Why writing `output` (-o) would destroy something an allocscope command
// reads: it is one of `inputs` (files), or a trace or findings file of one of
// them (run directories). "" when it is safe, or when output is "" or "-".
std::string overwrite_problem(const std::string& output, const std::vector<std::string>& inputs);

// The one-line-per-finding summary, then a totals line (check --full).
void print_findings(const FindingsFile& file, std::FILE* out);
// What a run, check and replay print of findings: errors and warnings (and
// infos when `lowest` is info), one line each for what several ranks found
// alike (report.h, collapse_findings); the plugins that were disabled, one
// line for each reason with the ranks it applies to; then "N errors, N
// warnings, N infos on R ranks" and `where` (the report's path).
void print_run_findings(const FindingsFile& file, const std::string& where, std::FILE* out,
                        Severity lowest = Severity::warning);
// What `file` shows was not checked: one line per plugin that did not run
// to the end of a process's stream ("plugin X on rank 1: <reason>"), and one
// when no process's stream is in it. Empty when everything ran.
std::vector<std::string> unchecked(const FindingsFile& file);
// unchecked()'s first line, and how many more there are ("" for none).
std::string unchecked_line(const std::vector<std::string>& missing);
// A gate's verdict on `file`, printed on `out`: kExitFindings when a
// finding is at or above `threshold`, else kExitUnchecked when something
// was not checked (unchecked()), else 0.
int gate(const FindingsFile& file, Severity threshold, std::FILE* out);

// Parses a --fail-on value; false (after printing nothing) when invalid.
bool parse_fail_on(const std::string& text, Severity& severity);

// Prints "allocscope: <message>" on stderr and returns kExitUsage.
int fail(const std::string& message);

// "1.5 MiB" style sizes for humans.
std::string format_bytes(uint64_t bytes);

}  // namespace allocscope::cli
