// allocscope check: gates CI on a findings file.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kCheckHelp = R"(usage: allocscope check PATH [--fail-on info|warning|error]

Reads a findings file (PATH, or PATH/findings.json when PATH is a directory
such as an `allocscope run` output), prints one line per finding and exits
  3  when any finding is at or above the --fail-on severity (default error)
  0  otherwise
  2  when PATH is missing or not a valid findings file (one message says why)

example:
  allocscope check allocscope-out --fail-on warning
)";

}  // namespace

int check_command(const std::vector<std::string>& args) {
    Severity threshold = Severity::error;
    Args parser("check", kCheckHelp);
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
    if (fs::is_directory(path, ec)) {
        const fs::path file = fs::path(path) / "findings.json";
        if (!fs::exists(file, ec)) {
            return fail(path + ": no findings.json in this directory (did the run use plugins?)");
        }
        path = file.string();
    } else if (!fs::exists(path, ec)) {
        return fail(path + ": no such file or directory");
    }
    FindingsFile file;
    try {
        file = read_findings_file(path);
    } catch (const FindingsError& e) {
        return fail(e.what());
    }
    print_findings(file, stdout);
    const size_t over = count_at_least(file, threshold);
    const std::string sev(to_string(threshold));
    if (over > 0) {
        std::printf("allocscope: check failed: %zu finding(s) at or above %s\n", over, sev.c_str());
        return kExitFindings;
    }
    std::printf("allocscope: check passed: no finding at or above %s\n", sev.c_str());
    return 0;
}

}  // namespace allocscope::cli
