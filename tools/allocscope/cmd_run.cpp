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

#ifndef ALLOCSCOPE_INSTALL_LIBDIR
#define ALLOCSCOPE_INSTALL_LIBDIR "lib"
#endif

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kRunHelp =
    R"(usage: allocscope run [--out DIR] [--force] [--stack-depth N] -- CMD [ARGS...]

Runs CMD with liballocscope.so preloaded (prepended to any LD_PRELOAD) and
ALLOCSCOPE_OUT set, so every process of the run that uses CUDA writes a trace
(rank<R>.trace, or pid<PID>.trace without a rank) into DIR. Exits with CMD's
exit status (128+N when it was killed by signal N).

options:
  --out DIR          output directory (default: $ALLOCSCOPE_OUT or ./allocscope-out)
  --force            delete traces an earlier run left in DIR instead of refusing
  --stack-depth N    frames captured per allocation, 0 turns stacks off (default 24)

environment:
  ALLOCSCOPE_LIB     path of liballocscope.so to preload instead of the bundled one

example:
  allocscope run --out /tmp/run1 -- torchrun --nproc_per_node 2 train.py
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
        const std::vector<std::string> old = trace_files_in(dir);
        if (!old.empty() && !force) {
            throw std::runtime_error("output directory " + dir.string() + " already holds " +
                                     std::to_string(old.size()) +
                                     " trace(s) from an earlier run; pass --force to replace "
                                     "them or choose another --out");
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

}  // namespace

int run_command(const std::vector<std::string>& args) {
    std::string out;
    bool force = false;
    std::string stack_depth;
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
        if (a == "--out" || a == "--stack-depth") {
            if (i + 1 >= args.size()) return fail(a + " needs a value (see allocscope run --help)");
            (a == "--out" ? out : stack_depth) = args[++i];
        } else if (a == "--force") {
            force = true;
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
    return code;
}

}  // namespace allocscope::cli
