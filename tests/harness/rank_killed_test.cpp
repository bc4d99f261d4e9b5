// One of two sim-harness ranks killed mid-run under `allocscope run`, as when
// a rank dies (SIGKILL: OOM killer, node loss) or is stopped (SIGTERM): the
// launcher then stops the other rank with SIGTERM. The leaky configuration
// (delayed scaling, TE "seed": weight-copy-accumulation errors on every
// rank) must still give both ranks' findings in findings.json, the killed
// rank's from a replay of its cut trace (SIGKILL) or from its own finish on
// SIGTERM (interposer/lifecycle.cpp, on_sigterm), and `allocscope check`
// must gate on them.
//
// Environment (tests/meson.build): E2E_CLI, HARNESS.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "findings_reader.h"
#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

// The highest step a (possibly growing) trace has reached, -1 if unreadable.
int64_t last_step(const fs::path& trace) {
    try {
        const Trace t = load_trace(trace.string());
        int64_t step = -1;
        for (const Event& e : t.events) {
            if (e.kind == EventKind::step) step = std::max<int64_t>(step, int64_t(e.step));
        }
        return step;
    } catch (...) {
        return -1;
    }
}

struct Killed {
    int status = -1;  // allocscope run's exit status
    std::string err;
};

// The leaky configuration with far more steps than it gets to run: rank 1
// is killed with `sig` once its trace shows step kKillAfterStep (every
// shape and size as the other harness tests have them).
constexpr int64_t kKillAfterStep = 4;
Killed run_and_kill(const fs::path& out, int sig) {
    TempDir t;
    const std::string command = env("E2E_CLI") + " run --force --out " + out.string() + " -- " +
                                env("HARNESS") +
                                " --backend sim --ranks 2 --layers 2 --steps 100000 --warmup 1"
                                " --recipe delayed --te seed >" +
                                (t / "stdout").string() + " 2>" + (t / "stderr").string();
    const pid_t cli_pid = spawn_shell(command);
    REQUIRE(cli_pid >= 0);
    const fs::path rank1 = out / "rank1.trace";
    const bool reached = wait_for([&] { return last_step(rank1) >= kKillAfterStep; }, 300);
    pid_t victim = 0;
    if (reached) {
        try {
            victim = static_cast<pid_t>(load_trace(rank1.string()).header.pid);
        } catch (...) {
        }
    }
    if (!reached || victim <= 0 || kill(victim, sig) != 0) {
        kill(cli_pid, SIGKILL);
        waitpid(cli_pid, nullptr, 0);
        FAIL("rank 1 did not reach step " << kKillAfterStep << ", or could not be killed");
    }
    int raw = 0;
    // The launcher stops rank 0 with SIGTERM (SIGKILL 5 s later); the CLI
    // then replays and merges. Waiting is bounded by the test's timeout.
    REQUIRE(waitpid(cli_pid, &raw, 0) == cli_pid);
    Killed k;
    k.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    k.err = slurp(t / "stderr");
    return k;
}

// The ranks with a weight-copy-accumulation error in the merged findings.
std::set<int32_t> ranks_with_errors(const fs::path& out) {
    const FindingsFile merged = read_findings_file((out / "findings.json").string());
    std::set<int32_t> ranks;
    for (const Finding& f : merged.findings) {
        if (f.plugin == "weight-copy-accumulation" && f.severity == Severity::error)
            ranks.insert(f.rank);
    }
    return ranks;
}

void check_gate(const fs::path& out) {
    ShellResult gate = run_shell(env("E2E_CLI") + " check " + out.string());
    CAPTURE(gate.err);
    CHECK(gate.status == 3);  // the errors gate
    CHECK(contains(gate.out, "weight-copy-accumulation"));
}

}  // namespace

TEST_CASE("rank 1 SIGKILLed mid-run: its findings replayed, rank 0's from its SIGTERM finish") {
    TempDir t;
    const fs::path out = t / "out";
    const Killed k = run_and_kill(out, SIGKILL);
    CAPTURE(k.err);
    CHECK(k.status == 128 + SIGKILL);  // the launcher reports the first rank that failed
    CHECK_FALSE(ends_with_footer((out / "rank1.trace").string()));
    // Rank 0 was stopped by the launcher's SIGTERM and finished its trace.
    CHECK(ends_with_footer((out / "rank0.trace").string()));
    CHECK(contains(k.err, "allocscope: findings replayed from the trace of rank 1 (rank1.trace)"));
    CHECK_FALSE(contains(k.err, "findings replayed from the trace of rank 0"));
    CHECK(fs::exists(out / "findings.rank0.json"));
    CHECK(fs::exists(out / "findings.rank1.json"));
    CHECK(ranks_with_errors(out) == std::set<int32_t>{0, 1});
    check_gate(out);
}

TEST_CASE("rank 1 SIGTERMed mid-run: both ranks finish their own traces and findings") {
    TempDir t;
    const fs::path out = t / "out";
    const Killed k = run_and_kill(out, SIGTERM);
    CAPTURE(k.err);
    CHECK(k.status == 128 + SIGTERM);
    CHECK(ends_with_footer((out / "rank1.trace").string()));
    CHECK(ends_with_footer((out / "rank0.trace").string()));
    // Nothing to replay: each rank wrote its findings at SIGTERM.
    CHECK_FALSE(contains(k.err, "findings replayed from the trace of"));
    CHECK(fs::exists(out / "findings.rank0.json"));
    CHECK(fs::exists(out / "findings.rank1.json"));
    CHECK(ranks_with_errors(out) == std::set<int32_t>{0, 1});
    check_gate(out);
}
