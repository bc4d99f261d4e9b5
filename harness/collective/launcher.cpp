#include "collective/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "collective/communicator.h"
#include "collective/rank_info.h"

extern char** environ;

namespace allocscope::harness::collective {

namespace {

constexpr auto kReapInterval = std::chrono::milliseconds(100);

struct Rank {
    int rank;
    pid_t pid;
    bool running;
};

std::string unique_rendezvous() {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    char id[64];
    std::snprintf(id, sizeof id, "%d-%llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(now.tv_sec) * 1'000'000'000ull +
                      static_cast<unsigned long long>(now.tv_nsec));
    return id;
}

// The parent's environment minus the variables the launcher sets, plus them.
std::vector<std::string> rank_environment(int rank, int world_size, const std::string& rendezvous) {
    const std::vector<std::string> ours = {
        "RANK=" + std::to_string(rank),
        "WORLD_SIZE=" + std::to_string(world_size),
        "LOCAL_RANK=" + std::to_string(rank),
        "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
        std::string(kRendezvousVariable) + "=" + rendezvous,
    };
    std::vector<std::string> env;
    for (char** entry = environ; *entry; ++entry) {
        const std::string_view text(*entry);
        bool replaced = false;
        for (const std::string& mine : ours) {
            replaced |= text.substr(0, text.find('=') + 1) == mine.substr(0, mine.find('=') + 1);
        }
        if (!replaced) env.emplace_back(text);
    }
    env.insert(env.end(), ours.begin(), ours.end());
    return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
    std::vector<char*> result;
    for (std::string& s : strings)
        result.push_back(s.data());
    result.push_back(nullptr);
    return result;
}

int exit_status(int wait_status) {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    return 128 + WTERMSIG(wait_status);
}

void signal_running(const std::vector<Rank>& ranks, int sig) {
    for (const Rank& r : ranks) {
        if (r.running) kill(r.pid, sig);
    }
}

// Undoes the launcher's signal setup on every way out.
struct SignalScope {
    sigset_t handled{};
    sigset_t previous_mask{};
    struct sigaction previous_chld {};

    SignalScope() {
        sigemptyset(&handled);
        sigaddset(&handled, SIGINT);
        sigaddset(&handled, SIGTERM);
        sigaddset(&handled, SIGCHLD);
        pthread_sigmask(SIG_BLOCK, &handled, &previous_mask);
        // An inherited SIG_IGN would make the kernel reap the ranks itself,
        // and their exit status would be lost.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGCHLD, &dfl, &previous_chld);
    }
    ~SignalScope() {
        sigaction(SIGCHLD, &previous_chld, nullptr);
        pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
    }
};

}  // namespace

int launch_ranks(const LaunchOptions& options) {
    if (options.world_size < 1) {
        throw std::invalid_argument("cannot launch " + std::to_string(options.world_size) +
                                    " ranks");
    }
    if (options.argv.empty()) throw std::invalid_argument("launch_ranks needs argv[0]");

    const std::string rendezvous = unique_rendezvous();
    std::vector<std::string> argv_strings = options.argv;
    std::vector<char*> argv = pointers(argv_strings);
    // Everything the children touch between fork and exec is prepared here:
    // only async-signal-safe calls may run there.
    std::vector<std::vector<std::string>> env_strings;
    std::vector<std::vector<char*>> envs;
    for (int r = 0; r < options.world_size; ++r) {
        env_strings.push_back(rank_environment(r, options.world_size, rendezvous));
    }
    for (auto& strings : env_strings)
        envs.push_back(pointers(strings));
    const std::string exec_failed = std::string(program_invocation_short_name) +
                                    ": cannot execute " + options.executable + "\n";
    const pid_t launcher = getpid();

    SignalScope signals;
    std::vector<Rank> ranks;
    for (int r = 0; r < options.world_size; ++r) {
        const pid_t pid = fork();
        if (pid == 0) {
            sigaction(SIGCHLD, &signals.previous_chld, nullptr);
            pthread_sigmask(SIG_SETMASK, &signals.previous_mask, nullptr);
            // A rank must not outlive its launcher (nothing else would stop it).
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != launcher) _exit(127);
            execve(options.executable.c_str(), argv.data(), envs[static_cast<size_t>(r)].data());
            [[maybe_unused]] ssize_t ignored =
                write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
            _exit(127);
        }
        if (pid < 0) {
            const int err = errno;
            signal_running(ranks, SIGKILL);
            for (const Rank& started : ranks)
                waitpid(started.pid, nullptr, 0);
            throw std::runtime_error("cannot start rank " + std::to_string(r) + ": " +
                                     std::strerror(err));
        }
        ranks.push_back({r, pid, true});
    }

    int result = 0;
    int interrupted = 0;
    bool stopping = false;
    bool killed = false;
    std::chrono::steady_clock::time_point kill_at{};
    const auto stop = [&] {
        if (stopping) return;
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + options.stop_grace;
    };
    size_t running = ranks.size();
    while (running > 0) {
        timespec slice{0, std::chrono::nanoseconds(kReapInterval).count()};
        siginfo_t info{};
        const int sig = sigtimedwait(&signals.handled, &info, &slice);
        if (sig == SIGINT || sig == SIGTERM) {
            if (interrupted == 0) interrupted = sig;
            signal_running(ranks, sig);
            stop();
        }
        for (Rank& r : ranks) {
            int status = 0;
            if (!r.running || waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
            r.running = false;
            --running;
            const int code = exit_status(status);
            if (code == 0 || stopping) continue;
            std::fprintf(stderr, "%s: rank %d (pid %d) %s %d; stopping the other ranks\n",
                         program_invocation_short_name, r.rank, static_cast<int>(r.pid),
                         WIFEXITED(status) ? "exited with status" : "was killed by signal",
                         WIFEXITED(status) ? code : WTERMSIG(status));
            result = code;
            stop();
            signal_running(ranks, SIGTERM);
        }
        if (stopping && !killed && running > 0 && std::chrono::steady_clock::now() >= kill_at) {
            std::fprintf(stderr, "%s: %zu rank(s) still running after SIGTERM; sending SIGKILL\n",
                         program_invocation_short_name, running);
            signal_running(ranks, SIGKILL);
            killed = true;
        }
    }
    Communicator::remove_segment(rendezvous);
    return interrupted != 0 ? 128 + interrupted : result;
}

}  // namespace allocscope::harness::collective
