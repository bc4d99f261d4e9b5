// SIGTERM and the trace (interposer/lifecycle.cpp, on_sigterm): a program
// without a SIGTERM handler of its own gets its trace finished (footer,
// plugins' finish, findings file) and still dies by SIGTERM; a program with
// a handler keeps it; ALLOCSCOPE_SIGTERM=0 keeps the old behaviour; a
// SIGTERM while other threads allocate never hangs; a forked child gets the
// default action back.
//
// Environment (tests/meson.build): E2E_PROGRAM (the sim-runtime
// preload_program), E2E_INTERPOSER, TEST_PLUGIN_DIR (the test plugins).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

using clock_type = std::chrono::steady_clock;

// The preload program under the interposer, started directly (no CLI, no
// shell left in between): its pid is the program's, its status its own.
struct Traced {
    TempDir t;
    fs::path out = t / "out";
    fs::path ready = t / "ready";
    pid_t pid = -1;
    int status = 0;
    bool reaped = false;

    Traced(const std::string& args, const std::string& extra_env = "") {
        const std::string command =
            "exec env " + extra_env + " E2E_READY=" + ready.string() +
            " LD_PRELOAD=" + env("E2E_INTERPOSER") + " ALLOCSCOPE_OUT=" + out.string() +
            " ALLOCSCOPE_PLUGIN_DIR=" + env("TEST_PLUGIN_DIR") + " ALLOCSCOPE_PLUGINS=test-count " +
            env("E2E_PROGRAM") + " " + args + " >" + (t / "stdout").string() + " 2>" +
            (t / "stderr").string();
        pid = spawn_shell(command);
        REQUIRE(pid >= 0);
    }
    ~Traced() {
        if (!reaped) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
    Traced(const Traced&) = delete;
    Traced& operator=(const Traced&) = delete;

    // Allocating past its first 2,000 allocations, recording into one trace.
    bool started() {
        return wait_for([&] { return fs::exists(ready) && traces().size() == 1; }, 120);
    }
    // Waits (a hang guard, not a timing assertion) for the process to end.
    bool ended(int seconds) {
        if (reaped) return true;
        const auto deadline = clock_type::now() + std::chrono::seconds(seconds);
        while (clock_type::now() < deadline) {
            const pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) return reaped = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    bool killed_by_sigterm() const {
        return reaped && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
    }
    std::vector<fs::path> traces() const { return files_matching(out, "", ".trace"); }
    std::string err() const { return slurp(t / "stderr"); }
};

}  // namespace

TEST_CASE("a program without a SIGTERM handler: SIGTERM finishes the trace, then kills it") {
    Traced p("until-killed");
    REQUIRE(p.started());
    REQUIRE(kill(p.pid, SIGTERM) == 0);
    REQUIRE(p.ended(120));
    CAPTURE(p.err());
    CHECK(p.killed_by_sigterm());  // the status it would have without allocscope
    const auto files = p.traces();
    REQUIRE(files.size() == 1);
    CHECK(ends_with_footer(files[0].string()));
    Trace trace = load_trace(files[0].string());
    CHECK_FALSE(trace.truncated);
    REQUIRE(trace.footer.has_value());
    CHECK(trace.events.size() > 2000);  // everything up to E2E_READY at least
    CHECK(trace.footer->events == trace.events.size());
    // The plugins finished: test-count reports at finish, into the
    // process's own findings file.
    const std::string stem = files[0].stem().string();
    const fs::path findings = p.out / ("findings." + stem + ".json");
    REQUIRE(fs::exists(findings));
    CHECK(contains(slurp(findings), "test-count"));
    CHECK_FALSE(contains(p.err(), "did not finish in time"));
}

TEST_CASE("a program with its own SIGTERM handler keeps it, installed before or after recording") {
    for (const char* when : {"", "late"}) {
        CAPTURE(when);
        TempDir m;
        const fs::path marker = m / "marker";
        Traced p("term-handler " + marker.string() + " " + when);
        REQUIRE(p.started());
        REQUIRE(kill(p.pid, SIGTERM) == 0);
        REQUIRE(p.ended(120));
        CAPTURE(p.err());
        CHECK(WIFEXITED(p.status));
        CHECK(WEXITSTATUS(p.status) == 7);
        CHECK(slurp(marker) == "handled\n");
    }
}

TEST_CASE("ALLOCSCOPE_SIGTERM=0: SIGTERM kills as before, the trace is cut") {
    Traced p("until-killed", "ALLOCSCOPE_SIGTERM=0");
    REQUIRE(p.started());
    REQUIRE(kill(p.pid, SIGTERM) == 0);
    REQUIRE(p.ended(120));
    CHECK(p.killed_by_sigterm());
    const auto files = p.traces();
    REQUIRE(files.size() == 1);
    CHECK_FALSE(ends_with_footer(files[0].string()));
    CHECK(files_matching(p.out, "findings.", ".json").empty());
}

TEST_CASE("SIGTERM while another thread allocates without pause: the process ends by SIGTERM") {
    int footers = 0;
    constexpr int kRuns = 5;
    for (int i = 0; i < kRuns; ++i) {
        CAPTURE(i);
        Traced p("term-threads");
        REQUIRE(p.started());
        REQUIRE(kill(p.pid, SIGTERM) == 0);
        // The handler waits at most 8 s for the writer; 120 s only guards
        // against a hang on a loaded machine.
        REQUIRE(p.ended(120));
        CAPTURE(p.err());
        CHECK(p.killed_by_sigterm());
        const auto files = p.traces();
        REQUIRE(files.size() == 1);
        // The trace is readable either way; finished unless the signal
        // landed on a thread holding a lock the writer needed.
        const bool footer = ends_with_footer(files[0].string());
        footers += footer;
        Trace trace = load_trace(files[0].string());
        CHECK(trace.footer.has_value() == footer);
        CHECK(trace.events.size() > 2000);
    }
    MESSAGE(footers << " of " << kRuns << " traces finished with a footer");
    WARN(footers == kRuns);
}

TEST_CASE("a forked child gets SIGTERM's default action back and dies by it at once") {
    TempDir t;
    const std::string out = (t / "out").string();
    ShellResult r = run_shell("LD_PRELOAD=" + env("E2E_INTERPOSER") + " ALLOCSCOPE_OUT=" + out +
                              " ALLOCSCOPE_PLUGINS=none " + env("E2E_PROGRAM") + " fork-term");
    CAPTURE(r.err);
    CHECK(r.status == 0);
    CHECK(r.out == "parent: SIGTERM handled\nchild: SIGTERM default\nchild ended by SIGTERM\n");
    // The parent's trace is finished at its normal exit.
    const auto files = files_matching(t / "out", "", ".trace");
    REQUIRE(files.size() == 1);
    CHECK(ends_with_footer(files[0].string()));

    // Without the handler the parent's disposition stays the default too.
    ShellResult off = run_shell("ALLOCSCOPE_SIGTERM=0 LD_PRELOAD=" + env("E2E_INTERPOSER") +
                                " ALLOCSCOPE_OUT=" + out + "2 ALLOCSCOPE_PLUGINS=none " +
                                env("E2E_PROGRAM") + " fork-term");
    CHECK(off.status == 0);
    CHECK(off.out == "parent: SIGTERM default\nchild: SIGTERM default\nchild ended by SIGTERM\n");
}
