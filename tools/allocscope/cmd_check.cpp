// allocscope check: gates CI on a findings file.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "replay_engine.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kCheckHelp =
    R"(usage: allocscope check PATH [--fail-on info|warning|error] [--full]

Reads a findings file (PATH, or PATH/findings.json when PATH is a directory
such as an `allocscope run` output), prints its errors and warnings (and
infos with --fail-on info) as a run does, one line for what several ranks
found alike, then the counts and the verdict, and exits
  3  when any finding is at or above the --fail-on severity (default error)
  4  otherwise, when not everything was checked: a plugin did not load or
     was disabled (a bad option, an error) on some process, or no process
     ran plugins; one line says what
  0  otherwise
  2  when PATH is missing or not a valid findings file (one message says why)

In a run directory, the traces of processes that died before writing their
final findings (killed, crashed: the trace ends without a footer, or no
findings.<name>.json is next to it) are replayed first, through the plugins
ALLOCSCOPE_PLUGINS, ALLOCSCOPE_PLUGIN_DIR and ALLOCSCOPE_PLUGIN_OPTIONS name
(every built-in plugin by default), and findings.json is written anew.

options:
  --fail-on SEV  info, warning or error (default error)
  --full         one line for every finding of every rank, infos included

example:
  allocscope check allocscope-out --fail-on warning
)";

}  // namespace

int check_command(const std::vector<std::string>& args) {
    Severity threshold = Severity::error;
    bool full = false;
    Args parser("check", kCheckHelp);
    parser.flag({"--full"}, full);
    parser.value({"--fail-on"}, [&threshold](const std::string& v) {
        return parse_fail_on(v, threshold)
                   ? std::string()
                   : "--fail-on expects info, warning or error, got '" + v + "'";
    });
    if (const auto status = parser.parse(args)) return *status;
    if (parser.positionals().size() > 1)
        return fail("check takes one PATH (" + parser.see_help() + ")");
    std::string path = parser.positionals().empty() ? std::string() : parser.positionals()[0];
    if (path.empty()) return fail("check needs a PATH (see allocscope check --help)");
    std::error_code ec;
    FindingsFile file;
    bool have = false;
    if (fs::is_directory(path, ec)) {
        // A run directory: the traces of processes that died before writing
        // their final findings are replayed first (as `allocscope run` does).
        const fs::path merged = fs::path(path) / "findings.json";
        if (!trace_files_in(path).empty()) {
            const Recovered recovered = recover_findings(
                path, plugin_choice_from_environment(),
                [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
            for (const std::string& line : recovered.lines)
                std::fprintf(stderr, "allocscope: findings replayed from the trace of %s\n",
                             line.c_str());
            if (!recovered.replayed.empty() || !fs::exists(merged, ec)) {
                try {
                    file = merge_run_findings(path, recovered);
                } catch (const FindingsError& e) {
                    return fail(e.what());
                }
                have = !file.ranks.empty();
                if (have) {
                    try {
                        write_findings_file(merged.string(), file);
                    } catch (const FindingsError& e) {
                        std::fprintf(stderr,
                                     "allocscope: %s (checking the merged findings as they are)\n",
                                     e.what());
                    }
                }
            }
        }
        if (!have && !fs::exists(merged, ec)) {
            return fail(path + ": no findings.json in this directory (did the run use plugins?)");
        }
        path = merged.string();
    } else if (!fs::exists(path, ec)) {
        return fail(path + ": no such file or directory");
    }
    if (!have) {
        try {
            file = read_findings_file(path);
        } catch (const FindingsError& e) {
            return fail(e.what());
        }
    }
    if (full)
        print_findings(file, stdout);
    else
        print_run_findings(file, "findings: " + path, stdout, threshold);
    return gate(file, threshold, stdout);
}

}  // namespace allocscope::cli
