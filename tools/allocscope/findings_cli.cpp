// Findings helpers shared by run, replay and check.
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "cli.h"
#include "plugin_host.h"

#ifndef ALLOCSCOPE_INSTALL_LIBDIR
#define ALLOCSCOPE_INSTALL_LIBDIR "lib"
#endif

namespace allocscope::cli {

namespace fs = std::filesystem;

std::string cli_plugin_dir() {
    if (const std::string& dir = environment_config().plugin_dir; !dir.empty()) return dir;
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return {};
    const fs::path exe_dir = fs::path(std::string(buf, static_cast<size_t>(n))).parent_path();
    std::vector<std::string> candidates;
    // The build tree (<build>/tools/allocscope): the same <build>/plugins
    // the build tree's interposer uses.
    std::error_code ec;
    if (fs::exists(exe_dir / ".." / "interposer" / "liballocscope.so", ec)) {
        candidates.push_back((exe_dir / ".." / "plugins").string());
    }
    candidates.push_back(
        (exe_dir / ".." / ALLOCSCOPE_INSTALL_LIBDIR / "allocscope" / "plugins").string());
    return first_directory(candidates);
}

std::string overwrite_problem(const std::string& output, const std::vector<std::string>& inputs) {
    if (output.empty() || output == "-") return {};
    std::error_code ec;
    const fs::path out = fs::absolute(output, ec).lexically_normal();
    if (ec) return {};
    const std::string name = out.filename().string();
    const bool recorded = name.ends_with(".trace") || name.ends_with(".trace.tmp") ||
                          (name.starts_with("findings") && name.ends_with(".json"));
    for (const std::string& input : inputs) {
        if (fs::is_directory(input, ec)) {
            if (recorded && fs::equivalent(out.parent_path(), input, ec))
                return "-o " + output + " would write over what the run in " + input +
                       " recorded (its traces and findings are read by report, check, diff and "
                       "export): write it elsewhere";
        } else if (fs::equivalent(out, input, ec)) {
            return "-o " + output + " is an input of this command: write it elsewhere";
        }
    }
    return {};
}

namespace {

// One line per (plugin, reason) that was disabled, naming the ranks (or
// processes) it was disabled on: 64 ranks with one misspelt option give one
// line, not 64.
void print_disabled(const FindingsFile& file, std::FILE* out) {
    struct Alike {
        std::string plugin, reason;
        std::vector<int32_t> ranks;
        std::vector<std::string> traces;  // processes without a rank
    };
    std::vector<Alike> alike;
    for (const RankRun& r : file.ranks) {
        for (const DisabledPlugin& d : r.disabled) {
            auto it = std::find_if(alike.begin(), alike.end(), [&](const Alike& a) {
                return a.plugin == d.plugin && a.reason == d.reason;
            });
            if (it == alike.end())
                it = alike.insert(alike.end(), Alike{d.plugin, d.reason, {}, {}});
            if (r.rank >= 0)
                it->ranks.push_back(r.rank);
            else
                it->traces.push_back(r.trace);
        }
    }
    for (const Alike& a : alike) {
        std::string who = a.ranks.empty() ? std::string() : ranks_text(a.ranks);
        for (const std::string& t : a.traces)
            who += (who.empty() ? "" : ", ") + t;
        std::fprintf(
            out, "%s\n",
            printable("allocscope: " + who + ": plugin " + a.plugin + " was disabled: " + a.reason)
                .c_str());
    }
}

}  // namespace

void print_findings(const FindingsFile& file, std::FILE* out) {
    size_t by[3] = {0, 0, 0};
    for (const Finding& f : file.findings) {
        ++by[static_cast<int>(f.severity)];
        std::fprintf(out, "%s\n", summary_line(f).c_str());
    }
    print_disabled(file, out);
    std::fprintf(out, "allocscope: %zu finding(s): %zu error, %zu warning, %zu info\n",
                 file.findings.size(), by[2], by[1], by[0]);
}

void print_run_findings(const FindingsFile& file, const std::string& where, std::FILE* out,
                        Severity lowest) {
    lowest = std::min(lowest, Severity::warning);
    std::vector<FindingGroup> groups = collapse_findings(file);
    std::stable_sort(groups.begin(), groups.end(),
                     [](const FindingGroup& a, const FindingGroup& b) {
                         return a.members[0]->severity > b.members[0]->severity;
                     });
    for (const FindingGroup& g : groups) {
        if (g.members[0]->severity < lowest) break;
        for (const std::string& line : group_lines(g))
            std::fprintf(out, "%s\n", line.c_str());
    }
    print_disabled(file, out);
    if (const std::string line = unproven_weights_line(file); !line.empty())
        std::fprintf(out, "allocscope: %s\n", line.c_str());
    if (const std::string line = provenance_steps_line(file); !line.empty())
        std::fprintf(out, "allocscope: %s\n", line.c_str());
    bool rankless = false;
    for (const RankRun& r : file.ranks)
        rankless |= r.rank < 0;
    const size_t n = file.ranks.size();
    const std::string on = rankless ? std::to_string(n) + (n == 1 ? " process" : " processes")
                                    : std::to_string(n) + (n == 1 ? " rank" : " ranks");
    std::fprintf(out, "allocscope: %s — %s\n", distinct_findings_text(file, " on " + on).c_str(),
                 where.c_str());
}

std::vector<std::string> unchecked(const FindingsFile& file) {
    std::vector<std::string> out;
    if (file.ranks.empty()) out.push_back("no process's stream (no process ran plugins)");
    for (const RankRun& r : file.ranks) {
        const std::string who = r.rank >= 0 ? "rank " + std::to_string(r.rank) : r.trace;
        for (const DisabledPlugin& d : r.disabled)
            out.push_back(printable("plugin " + d.plugin + " on " + who + ": " + d.reason));
    }
    return out;
}

std::string unchecked_line(const std::vector<std::string>& missing) {
    if (missing.empty()) return {};
    return missing.front() +
           (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "");
}

int gate(const FindingsFile& file, Severity threshold, std::FILE* out) {
    const size_t over = count_at_least(file, threshold);
    const std::string sev(to_string(threshold));
    const std::vector<std::string> missing = unchecked(file);
    if (over > 0) {
        // Findings decide the status; what was not checked is still said.
        const std::string also =
            missing.empty() ? std::string()
                            : "; and not everything was checked: " + unchecked_line(missing);
        std::fprintf(out, "allocscope: check failed: %zu finding(s) at or above %s%s\n", over,
                     sev.c_str(), also.c_str());
        return kExitFindings;
    }
    if (!missing.empty()) {
        std::fprintf(out, "allocscope: check failed: not everything was checked: %s\n",
                     unchecked_line(missing).c_str());
        return kExitUnchecked;
    }
    std::fprintf(out, "allocscope: check passed: no finding at or above %s\n", sev.c_str());
    return 0;
}

bool parse_fail_on(const std::string& text, Severity& severity) {
    auto parsed = parse_severity(text);
    if (!parsed) return false;
    severity = *parsed;
    return true;
}

}  // namespace allocscope::cli
