// allocscope run: runs a command with liballocscope.so preloaded.
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli.h"
#include "config.h"

#ifndef ALLOCSCOPE_INSTALL_LIBDIR
#define ALLOCSCOPE_INSTALL_LIBDIR "lib"
#endif

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kRunHelp =
    R"(usage: allocscope run [--out DIR] [--force] [--stack-depth N] [--plugins LIST]
                     [--plugin-dir DIR] [--plugin-option NAME.KEY=VALUE]...
                     [--check] [--fail-on info|warning|error] -- CMD [ARGS...]

Runs CMD with liballocscope.so preloaded (prepended to any LD_PRELOAD) and
ALLOCSCOPE_OUT set, so every process of the run that uses CUDA writes a trace
(rank<R>.trace, or pid<PID>.trace without a rank) into DIR. Detection plugins
run inside each process and write findings.<rank<R>|pid<PID>>.json; at the end
they are merged into DIR/findings.json and printed one line per finding.
Exits with CMD's exit status (128+N when it was killed by signal N).

options:
  --out DIR          output directory (default: $ALLOCSCOPE_OUT or ./allocscope-out)
  --force            delete traces and findings an earlier run left in DIR
                     instead of refusing
  --stack-depth N    frames captured per allocation, 0 turns stacks off (default 24)
  --plugins LIST     comma list of plugin names or paths (default: every
                     built-in plugin; `none` turns plugins off)
  --plugin-dir DIR   where plugin names are looked up (ALLOCSCOPE_PLUGIN_DIR)
  --plugin-option NAME.KEY=VALUE
                     an option for plugin NAME (repeatable; added to
                     ALLOCSCOPE_PLUGIN_OPTIONS)
  --check            after CMD, exit 3 when a finding is at or above the
                     --fail-on severity; CMD's own failure status wins, and
                     no readable findings at all exits 2
  --fail-on SEV      info, warning or error (default error); implies --check

environment:
  ALLOCSCOPE_LIB     path of liballocscope.so to preload instead of the bundled one

example:
  allocscope run --out /tmp/run1 -- torchrun --nproc_per_node 2 train.py
  allocscope run --check --fail-on warning -- python train.py
)";

volatile sig_atomic_t g_child = 0;

void forward_signal(int sig) {
    if (g_child > 0) kill(g_child, sig);
}

std::string exe_dir() {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return ".";
    return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

std::string find_interposer() {
    if (const char* lib = std::getenv("ALLOCSCOPE_LIB"); lib && *lib) {
        if (access(lib, R_OK) != 0) {
            throw std::runtime_error(std::string("ALLOCSCOPE_LIB=") + lib +
                                     " is not readable: " + std::strerror(errno));
        }
        return fs::absolute(lib).string();
    }
    fs::path dir = exe_dir();
    for (const fs::path& candidate :
         {dir / ".." / "interposer" / "liballocscope.so",
          dir / ".." / ALLOCSCOPE_INSTALL_LIBDIR / "liballocscope.so"}) {
        std::error_code ec;
        if (fs::exists(candidate, ec)) return fs::weakly_canonical(candidate).string();
    }
    throw std::runtime_error("cannot find liballocscope.so next to " + dir.string() +
                             " (set ALLOCSCOPE_LIB to its path)");
}

// Refuses (or with --force, clears) traces of an earlier run so two runs are
// never mixed in one directory.
void prepare_out_dir(const fs::path& dir, bool force) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
        if (!fs::is_directory(dir, ec)) {
            throw std::runtime_error("output path " + dir.string() + " is not a directory");
        }
        std::vector<std::string> old = trace_files_in(dir);
        for (const std::string& f : rank_findings_files_in(dir))
            old.push_back(f);
        if (fs::exists(dir / "findings.json", ec)) old.push_back((dir / "findings.json").string());
        if (!old.empty() && !force) {
            throw std::runtime_error("output directory " + dir.string() + " already holds " +
                                     std::to_string(old.size()) +
                                     " trace or findings file(s) from an earlier run; pass "
                                     "--force to replace them or choose another --out");
        }
        for (const std::string& p : old)
            fs::remove(p, ec);
        return;
    }
    fs::create_directories(dir, ec);
    if (ec) {
        throw std::runtime_error("cannot create output directory " + dir.string() + ": " +
                                 ec.message());
    }
    fs::permissions(dir, fs::perms::owner_all, ec);
}

// Merges the processes' findings into DIR/findings.json and prints them.
// Returns the exit status --check asks for (when `check` is set), else 0.
int merge_and_report(const fs::path& out_dir, bool check, Severity threshold) {
    const std::vector<std::string> files = rank_findings_files_in(out_dir);
    if (files.empty()) {
        if (!check) return 0;
        std::fprintf(stderr,
                     "allocscope: --check: no findings files in %s (no process ran plugins, "
                     "or none reached its exit)\n",
                     out_dir.c_str());
        return kExitUsage;
    }
    FindingsFile merged;
    const std::string target = (out_dir / "findings.json").string();
    try {
        merged = merge_findings_files(files);
        write_findings_file(target, merged);
    } catch (const FindingsError& e) {
        std::fprintf(stderr, "allocscope: %s\n", e.what());
        return check ? kExitUsage : 0;
    }
    print_findings(merged, stderr);
    std::fprintf(stderr, "allocscope: findings in %s\n", target.c_str());
    if (check && count_at_least(merged, threshold) > 0) return kExitFindings;
    return 0;
}

}  // namespace

int run_command(const std::vector<std::string>& args) {
    std::string out;
    bool force = false;
    std::string stack_depth;
    std::string plugins;
    std::string plugin_dir;
    std::vector<std::string> plugin_options;
    bool check = false;
    Severity threshold = Severity::error;
    size_t i = 0;
    for (; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            std::fputs(kRunHelp, stdout);
            return 0;
        }
        if (a == "--") {
            ++i;
            break;
        }
        if (a == "--out" || a == "--stack-depth" || a == "--plugins" || a == "--plugin-dir" ||
            a == "--plugin-option" || a == "--fail-on") {
            if (i + 1 >= args.size()) return fail(a + " needs a value (see allocscope run --help)");
            const std::string& v = args[++i];
            if (a == "--out") {
                out = v;
            } else if (a == "--stack-depth") {
                stack_depth = v;
            } else if (a == "--plugins") {
                plugins = v;
            } else if (a == "--plugin-dir") {
                plugin_dir = v;
            } else if (a == "--plugin-option") {
                plugin_options.push_back(v);
            } else {
                if (!parse_fail_on(v, threshold)) {
                    return fail("--fail-on expects info, warning or error, got '" + v + "'");
                }
                check = true;
            }
        } else if (a == "--force") {
            force = true;
        } else if (a == "--check") {
            check = true;
        } else if (a.rfind("--", 0) == 0) {
            return fail("unknown option '" + a + "' for run (see allocscope run --help)");
        } else {
            break;  // the command starts here
        }
    }
    if (i >= args.size()) return fail("run needs a command to run (see allocscope run --help)");
    if (!stack_depth.empty()) {
        char* end = nullptr;
        long v = std::strtol(stack_depth.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > 128) {
            return fail("--stack-depth expects an integer from 0 to 128, got '" + stack_depth +
                        "'");
        }
    }
    if (!plugins.empty()) {
        std::vector<std::string> entries;
        bool off = false;
        std::string problem;
        if (!parse_plugin_list(plugins, entries, off, problem)) {
            return fail("--plugins '" + plugins + "': " + problem);
        }
        if (off && check) return fail("--check needs plugins, but --plugins is none");
    }
    std::string options_env;
    if (const char* env = std::getenv("ALLOCSCOPE_PLUGIN_OPTIONS"); env && *env) options_env = env;
    for (const std::string& o : plugin_options) {
        std::string key, value, problem;
        if (!parse_plugin_option(o, key, value, problem)) return fail("--plugin-option " + problem);
        options_env += (options_env.empty() ? "" : ",") + o;
    }
    if (!plugin_dir.empty()) {
        std::error_code ec;
        if (!fs::is_directory(plugin_dir, ec)) {
            return fail("--plugin-dir " + plugin_dir + " is not a directory");
        }
        plugin_dir = fs::absolute(plugin_dir).string();
    }
    if (out.empty()) {
        const char* env = std::getenv("ALLOCSCOPE_OUT");
        out = env && *env ? env : "allocscope-out";
    }
    const fs::path out_dir = fs::absolute(out).lexically_normal();
    const std::string lib = find_interposer();
    prepare_out_dir(out_dir, force);

    std::string preload = lib;
    if (const char* existing = std::getenv("LD_PRELOAD"); existing && *existing) {
        preload += std::string(":") + existing;
    }
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("ALLOCSCOPE_OUT", out_dir.c_str(), 1);
    if (!stack_depth.empty()) setenv("ALLOCSCOPE_STACK_DEPTH", stack_depth.c_str(), 1);
    if (!plugins.empty()) setenv("ALLOCSCOPE_PLUGINS", plugins.c_str(), 1);
    if (!plugin_options.empty()) setenv("ALLOCSCOPE_PLUGIN_OPTIONS", options_env.c_str(), 1);
    if (!plugin_dir.empty()) setenv("ALLOCSCOPE_PLUGIN_DIR", plugin_dir.c_str(), 1);

    std::vector<char*> argv;
    for (size_t k = i; k < args.size(); ++k)
        argv.push_back(const_cast<char*>(args[k].c_str()));
    argv.push_back(nullptr);

    std::fflush(nullptr);
    pid_t child = fork();
    if (child < 0) return fail(std::string("cannot fork: ") + std::strerror(errno));
    if (child == 0) {
        execvp(argv[0], argv.data());
        std::fprintf(stderr, "allocscope: cannot run '%s': %s\n", argv[0], std::strerror(errno));
        _exit(127);
    }
    g_child = child;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        sigaction(sig, &sa, nullptr);

    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) return fail(std::string("waitpid failed: ") + std::strerror(errno));
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::fprintf(stderr, "allocscope: %zu trace file(s) in %s (allocscope report %s)\n",
                 trace_files_in(out_dir).size(), out_dir.c_str(), out_dir.c_str());
    const int checked = merge_and_report(out_dir, check, threshold);
    if (!trace_files_in(out_dir).empty()) write_run_reports(out_dir.string());
    if (code != 0 || !check) return code;
    return checked;
}

}  // namespace allocscope::cli
