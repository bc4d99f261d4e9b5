// The recorder's lifecycle: the process-wide state, brought up by the first
// hook or API call (initialize), switched off in a forked child, and
// finished at exit (the writer drains, the plugins finish) or on SIGTERM;
// and how the library was loaded.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "output_file.h"
#include "recorder_internal.h"
#include "unwind.h"

namespace allocscope::recorder {

constinit std::atomic<int> g_state{kUninitialized};
constinit State* g = nullptr;
constinit char g_self_path[PATH_MAX]{};
constinit char g_loaded_after[256]{};

namespace {

// How long exit waits for the writer to drain before giving up.
constexpr int kExitDrainMs = 5000;
// How long exit then waits for the plugins' finish and the findings file.
constexpr int kExitPluginsMs = 10000;
// On SIGTERM the trace gets the exit's time (kExitDrainMs), the plugins
// less: a launcher sends SIGKILL some seconds after SIGTERM (torchrun 30 s,
// the harness 5 s), and findings not written are replayed by the CLI.
constexpr int kTermPluginsMs = 3000;

constinit pthread_mutex_t g_init_mutex = PTHREAD_MUTEX_INITIALIZER;
// The loader guard (recorder_internal.h): forks waiting to start, and
// guarded loader calls under way. Atomics, not a mutex: fork's prepare
// handler runs with the sanitizers' and libc's own locks in play.
constinit std::atomic<int> g_forks_pending{0};
constinit std::atomic<int> g_loader_calls{0};
// The storage of *g.
alignas(State) unsigned char g_storage[sizeof(State)];

// --- SIGTERM ------------------------------------------------------------------
//
// A process that dies by SIGTERM's default action runs no exit path: its
// trace ends without a footer and its plugins never finish. When recording
// starts and SIGTERM's disposition is still SIG_DFL (the program has no
// handler of its own, and does not ignore it), on_sigterm is installed. It
// does only async-signal-safe things: atomic stores and loads (lock-free, so
// no lock), clock_gettime, nanosleep, write, sigaction, raise, sigprocmask.
// It switches recording off and sets the writer's stop flag, exactly as the
// exit destructor does; the writer thread (all signals blocked, so the
// handler never runs there) notices within one sleep (at most 20 ms), drains
// the ring, writes the footer, runs the plugins' finish and the findings
// file, and sets trace_done / writer_done, which the handler waits for with
// a time limit. Then it restores SIG_DFL, re-raises and unblocks SIGTERM:
// the process dies by SIGTERM as it would have without allocscope. Flags,
// not a pipe: a program may close or dup2 over descriptors it does not know
// (daemons, closefrom before exec), and the writer already polls its flag.
//
// The finish runs on a normal thread, but the thread the signal interrupted
// may hold a lock the writer or a plugin needs (malloc's arena, the loader's
// lock, allocscope's definitions lock inside a hook). Then the writer stalls,
// the handler gives up after the time limit and the process dies as before:
// the trace is cut (the CLI replays it), nothing worse.
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the SIGTERM handler needs lock-free atomics");

void write_stderr(const char* text) noexcept {
    ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
    (void)ignored;
}

// Async-signal-safe: waits until `flag` is set or `deadline_ns` has passed.
bool wait_until(const std::atomic<bool>& flag, uint64_t deadline_ns) noexcept {
    while (!flag.load(std::memory_order_acquire)) {
        if (mono_ns() >= deadline_ns) return false;
        timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
    }
    return true;
}

// SIGTERM's default action, from inside the handler (SIGTERM is blocked
// there): the disposition back to SIG_DFL, the signal raised (it stays
// pending) and unblocked, which ends the process.
void die_by_sigterm() noexcept {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTERM, &dfl, nullptr);
    raise(SIGTERM);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_UNBLOCK, &term, nullptr);
}

void on_sigterm(int) {
    const int saved_errno = errno;
    State* s = g;
    // Only the recording process waits for its writer: a forked child (its
    // copy of the state is off, and its writer does not exist) and a process
    // not recording die at once.
    if (s && getpid() == s->owner_pid) {
        int expected = kRecording;
        if (g_state.compare_exchange_strong(expected, kOff, std::memory_order_acq_rel)) {
            s->stop.store(true, std::memory_order_release);
        }
        // A finish under way (this SIGTERM's, an earlier one's on another
        // thread, or the exit's) is waited for, within its time limits.
        if (s->stop.load(std::memory_order_acquire)) {
            const uint64_t start = mono_ns();
            if (!wait_until(s->trace_done, start + kExitDrainMs * 1000000ull)) {
                write_stderr(
                    "allocscope: SIGTERM: the trace writer did not finish in time; the trace "
                    "may lack its footer and last events\n");
            } else if (!wait_until(s->writer_done, mono_ns() + kTermPluginsMs * 1000000ull)) {
                write_stderr(
                    "allocscope: SIGTERM: plugins did not finish in time; findings "
                    "not written\n");
            }
        }
    }
    die_by_sigterm();
    errno = saved_errno;  // reached only if SIGTERM did not end the process
}

// Whether SIGTERM's current disposition is on_sigterm.
bool sigterm_is_ours() noexcept {
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) != 0) return false;
    return !(current.sa_flags & SA_SIGINFO) && current.sa_handler == on_sigterm;
}

// When recording starts: on_sigterm, only over SIG_DFL (ALLOCSCOPE_SIGTERM=0:
// never). A handler of the program's, or SIG_IGN, is left alone; one the
// program installs later replaces on_sigterm.
void install_sigterm_handler() {
    if (!g->config.sigterm) return;
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) {
        log_line(LogLevel::debug,
                 "allocscope: the program handles SIGTERM itself; left to its handler");
        return;
    }
    struct sigaction ours {};
    ours.sa_handler = on_sigterm;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART | SA_ONSTACK;
    if (sigaction(SIGTERM, &ours, nullptr) == 0)
        log_line(LogLevel::debug, "allocscope: SIGTERM finishes the trace before the process ends");
}

void initialize() {
    g = new (g_storage) State();
    {
        LoaderGuard loader;
        find_own_module();
    }
    const Config* parsed = config();
    if (!parsed) throw std::bad_alloc();
    g->config = *parsed;
    for (const std::string& w : g->config.warnings)
        log_line(LogLevel::quiet, w);
    if (g_loaded_after[0] && !g->config.disabled) {
        log_line(LogLevel::quiet,
                 std::string("allocscope: liballocscope.so was loaded after ") + g_loaded_after +
                     " (by dlopen, not LD_PRELOAD): CUDA calls bound to it bypass the hooks, so "
                     "the trace holds only what reaches allocscope directly (its C API, "
                     "NVTX, allocator hooks); use allocscope run or LD_PRELOAD to record them all");
    }
    if (g->config.disabled) {
        g_state.store(kOff, std::memory_order_release);
        return;
    }
    g->start_mono_ns = mono_ns();
    g->owner_pid = getpid();
    g->cost_stats = g->config.log == LogLevel::debug;
    if (g->cost_stats) enable_walk_stats(g->config.walk_cycles);
    // Sequence numbers start at 1: the plugin ABI's alloc_seq 0 means "a
    // free of an unknown address", so no allocation may have seq 0. No hook
    // runs yet, so taking and retiring seq 0 here cannot race.
    if (g->ring.reserve(0)) g->ring.release_until(1);
    std::string error;
    if (!make_private_dirs(g->config.out_dir, error) || !open_trace(error)) {
        log_line(LogLevel::quiet, "allocscope: recording disabled: " + error);
        g_state.store(kOff, std::memory_order_release);
        return;
    }
    if (!start_writer()) {
        log_line(LogLevel::quiet, "allocscope: recording disabled: cannot start writer thread");
        g_state.store(kOff, std::memory_order_release);
        return;
    }
    log_line(LogLevel::debug, "allocscope: recording to " + g->writer.path());
    g_state.store(kRecording, std::memory_order_release);
    install_sigterm_handler();
}

}  // namespace

const Config* config() noexcept {
    // Never destroyed: hooks may run during static destruction.
    static constinit std::atomic<const Config*> parsed{nullptr};
    if (const Config* c = parsed.load(std::memory_order_acquire)) return c;
    try {
        auto* fresh = new Config(parse_config([](const char* name) { return std::getenv(name); }));
        const Config* expected = nullptr;
        if (parsed.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel))
            return fresh;
        delete fresh;  // another thread's is the one
        return expected;
    } catch (...) {
        return nullptr;
    }
}

void log_line(LogLevel at_least, const std::string& line) {
    if (g && static_cast<int>(g->config.log) < static_cast<int>(at_least)) return;
    std::string out = line + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
    (void)ignored;
}

bool ensure_started() noexcept {
    int s = g_state.load(std::memory_order_acquire);
    if (s == kRecording) return true;
    if (s == kOff) return false;
    pthread_mutex_lock(&g_init_mutex);
    if (g_state.load(std::memory_order_acquire) == kUninitialized) {
        try {
            initialize();
        } catch (...) {
            g_state.store(kOff, std::memory_order_release);
        }
    }
    pthread_mutex_unlock(&g_init_mutex);
    return g_state.load(std::memory_order_acquire) == kRecording;
}

namespace {

void before_fork() {
    g_forks_pending.fetch_add(1, std::memory_order_seq_cst);
    while (g_loader_calls.load(std::memory_order_seq_cst) != 0)
        sched_yield();
}

void after_fork_parent() {
    g_forks_pending.fetch_sub(1, std::memory_order_seq_cst);
}

void on_fork_child() {
    g_state.store(kOff, std::memory_order_release);
    // The child records nothing: SIGTERM gets its default action back (the
    // handler would re-raise at once anyway: the child is not the owner).
    if (sigterm_is_ours()) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGTERM, &dfl, nullptr);
    }
    g_forks_pending.fetch_sub(1, std::memory_order_seq_cst);
}

// Hooks only see calls that bind to them, which needs the library ahead of
// the CUDA runtime in the lookup order: LD_PRELOAD, or allocscope run. Loaded
// later (dlopen once CUDA is in use), calls already bound to the runtime, and
// most later ones, bypass the hooks; initialize() says so once and records
// what still reaches it (the C API, allocator hooks).
void note_how_loaded() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&note_how_loaded), &info) && info.dli_fname) {
        if (!realpath(info.dli_fname, g_self_path)) g_self_path[0] = '\0';
    }
    struct Scan {
        uintptr_t self;
        char* after;
    } scan{reinterpret_cast<uintptr_t>(info.dli_fbase), g_loaded_after};
    dl_iterate_phdr(
        [](dl_phdr_info* pi, size_t, void* arg) -> int {
            auto* sc = static_cast<Scan*>(arg);
            // Link-map order: everything after this library came later.
            if (pi->dlpi_addr == sc->self ||
                (pi->dlpi_phnum > 0 &&
                 pi->dlpi_addr + pi->dlpi_phdr[0].p_vaddr - pi->dlpi_phdr[0].p_offset ==
                     sc->self)) {
                return 1;
            }
            const char* name = pi->dlpi_name ? pi->dlpi_name : "";
            const char* base = std::strrchr(name, '/');
            base = base ? base + 1 : name;
            if (std::strncmp(base, "libcudart.so", 12) == 0 ||
                std::strncmp(base, "libcuda.so", 10) == 0) {
                std::snprintf(sc->after, sizeof g_loaded_after, "%s", base);
                return 1;
            }
            return 0;
        },
        &scan);
}

__attribute__((constructor)) void install_fork_policy() {
    pthread_atfork(before_fork, after_fork_parent, on_fork_child);
    note_how_loaded();
}

__attribute__((destructor)) void finish_recording() {
    if (g_state.load(std::memory_order_acquire) != kRecording || getpid() != g->owner_pid) return;
    g_state.store(kOff, std::memory_order_release);
    g->stop.store(true, std::memory_order_release);
    auto wait_for = [](const std::atomic<bool>& flag, int ms) {
        for (int waited = 0; waited < ms; ++waited) {
            if (flag.load(std::memory_order_acquire)) return true;
            timespec pause{0, 1000000};
            nanosleep(&pause, nullptr);
        }
        return flag.load(std::memory_order_acquire);
    };
    if (!wait_for(g->trace_done, kExitDrainMs)) {
        log_line(LogLevel::quiet, "allocscope: trace writer did not finish within " +
                                      std::to_string(kExitDrainMs / 1000) +
                                      " s at exit; the trace may lack its last events");
        return;
    }
    if (!wait_for(g->writer_done, kExitPluginsMs)) {
        log_line(LogLevel::quiet, "allocscope: plugins did not finish within " +
                                      std::to_string(kExitPluginsMs / 1000) +
                                      " s at exit; findings not written");
    }
}

}  // namespace

LoaderGuard::LoaderGuard() noexcept {
    for (;;) {
        while (g_forks_pending.load(std::memory_order_seq_cst) != 0)
            sched_yield();
        g_loader_calls.fetch_add(1, std::memory_order_seq_cst);
        if (g_forks_pending.load(std::memory_order_seq_cst) == 0) return;
        g_loader_calls.fetch_sub(1, std::memory_order_seq_cst);  // a fork came first
    }
}

LoaderGuard::~LoaderGuard() {
    g_loader_calls.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace allocscope::recorder
