// Faults injected into traced programs (issue 7): fork while other threads
// are inside hooks, a late dlopen of the interposer, SIGKILL mid-run, an
// output directory that is read-only or full, broken plugins running live,
// CUDA calls that fail, hostile symbol names in the HTML report, and the
// file-system hygiene of everything allocscope writes.
//
// Environment (tests/meson.build): E2E_CLI, E2E_PROGRAM (the sim-runtime
// preload_program), E2E_INTERPOSER, E2E_PLUGIN_DIR (built-in plugins),
// TEST_PLUGIN_DIR (the test plugins, tests/plugins).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "findings.h"
#include "findings_reader.h"
#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

std::string cli() {
    return env("E2E_CLI");
}
std::string program() {
    return env("E2E_PROGRAM");
}
std::string interposer() {
    return env("E2E_INTERPOSER");
}
std::string test_plugin_dir() {
    return env("TEST_PLUGIN_DIR");
}

struct Run {
    int status = -1;
    std::string out, err;
};

Run run(const std::string& command) {
    Run r;
    r.status = sh(command, &r.out, &r.err);
    return r;
}

std::vector<fs::path> traces_in(const fs::path& dir) {
    return files_matching(dir, "", ".trace");
}

// Program under the interposer without the CLI: ALLOCSCOPE_OUT=out.
std::string preloaded(const fs::path& out, const std::string& extra_env = "") {
    return extra_env + " LD_PRELOAD=" + interposer() + " ALLOCSCOPE_OUT=" + out.string() + " ";
}

unsigned mode_of(const fs::path& p) {
    struct stat st;
    REQUIRE(::lstat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
}

// A tmpfs mounted for one test (root, or an unprivileged user namespace is
// not tried here: see DiskFull). Unmounted (lazily) on destruction.
struct TmpfsMount {
    fs::path dir;
    bool mounted = false;
    TmpfsMount(const fs::path& at, const std::string& options) : dir(at) {
        fs::create_directories(dir);
        mounted = sh("mount -t tmpfs -o " + options + " allocscope-test " + dir.string()) == 0;
    }
    ~TmpfsMount() {
        if (mounted) sh("umount -l " + dir.string());
    }
};

}  // namespace

TEST_CASE("fork while threads are inside hooks: children allocate, exit and record nothing") {
    TempDir t;
    const fs::path out = t / "out";
    // Under AddressSanitizer two of its own limits apply to a child forked
    // from a threaded process: LeakSanitizer cannot run at its exit() (the
    // parent's threads are gone but registered), and a fork while the
    // writer thread dlopens a plugin can leave ASan's globals lock held in
    // the child (its exit() then waits forever in __asan_unregister_globals).
    // So leaks are not checked there and plugins stay off.
    const bool asan = std::getenv("ASAN_OPTIONS") != nullptr;
    Run r =
        run("ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" " + cli() + " run --out " +
            out.string() + (asan ? " --plugins none" : "") + " -- " + program() + " fork-alloc");
    CHECK(r.status == 0);
    CHECK(r.out == "fork-alloc done: 50 of 50 children exited cleanly\n");
    CHECK(count_lines(r.err, "recording disabled") == 0);
    // The policy (interposer/recorder.h): a forked child stops recording; it
    // leaves no file and nothing of it reaches the parent's trace.
    const auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    CHECK(files_matching(out, "findings.pid", ".json").size() == (asan ? 0 : 1));
    Trace trace = load_trace(files[0].string());
    CHECK(trace.footer.has_value());
    CHECK(trace.footer->events_dropped == 0);
    size_t worker_allocs = 0;
    for (const Event& e : trace.events) {
        if (e.kind == EventKind::alloc) {
            CHECK(e.size != 2222);
            ++worker_allocs;
        }
        CHECK(e.kind != EventKind::mark);
    }
    CHECK(worker_allocs > 0);
}

TEST_CASE("dlopen after CUDA is in use: one message, the program unchanged, the C API recorded") {
    TempDir t;
    const fs::path out = t / "out";
    Run plain = run(program() + " dlopen-late /nonexistent/liballocscope.so");
    CHECK(plain.status == 1);  // the program needs the library to exist
    Run r = run("ALLOCSCOPE_LOG=quiet ALLOCSCOPE_OUT=" + out.string() + " " + program() +
                " dlopen-late " + interposer());
    CHECK(r.status == 0);
    CHECK(r.out == "dlopen-late done: 0 failure(s)\n");
    CAPTURE(r.err);
    CHECK(count_lines(r.err, "allocscope:") == 1);
    CHECK(count_lines(r.err, "liballocscope.so was loaded after libcudart.so") == 1);
    CHECK(count_lines(r.err, "use allocscope run or LD_PRELOAD") == 1);
    const auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    Trace trace = load_trace(files[0].string());
    CHECK(trace.footer.has_value());
    int pushes = 0, blocks = 0, segments = 0;
    for (const Event& e : trace.events) {
        if (e.kind == EventKind::tag_push && trace.str(e.layer) == "late") ++pushes;
        if (e.level == Level::block) ++blocks;
        if (e.level == Level::segment) ++segments;
    }
    CHECK(pushes == 1);
    CHECK(blocks == 2);    // the allocator hooks reach it
    CHECK(segments == 0);  // cudaMalloc was bound to the runtime before
}

TEST_CASE("SIGKILL mid-run: the prefix is readable, report says truncated, flushed findings stay") {
    TempDir t;
    const fs::path out = t / "out";
    const fs::path ready = t / "ready";
    const std::string command =
        "E2E_READY=" + ready.string() + " " + cli() + " run --out " + out.string() +
        " --plugin-dir " + test_plugin_dir() +
        " --plugins test-error,test-count --plugin-option test-error.fail_in=none -- " + program() +
        " until-killed >" + (t / "stdout").string() + " 2>" + (t / "stderr").string();
    const pid_t cli_pid = fork();
    REQUIRE(cli_pid >= 0);
    if (cli_pid == 0) {
        execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    using clock = std::chrono::steady_clock;
    auto wait_for = [](auto&& done, int seconds) {
        const auto deadline = clock::now() + std::chrono::seconds(seconds);
        while (!done() && clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return done();
    };
    // Allocating, and test-error's finding (made on its first event) has
    // been checkpointed into findings.pid<PID>.json.
    const bool started = wait_for(
        [&] { return fs::exists(ready) && !files_matching(out, "findings.pid", ".json").empty(); },
        120);
    const auto files = traces_in(out);
    if (!started || files.size() != 1) {
        kill(cli_pid, SIGKILL);
        waitpid(cli_pid, nullptr, 0);
        FAIL("the program did not start allocating, or no findings checkpoint appeared");
    }
    const std::string name = files[0].filename().string();  // pid<PID>.trace
    const pid_t traced = static_cast<pid_t>(std::stol(name.substr(3)));
    // The writer thread lags the program on a loaded machine: kill once the
    // file holds the first 2,000 iterations' events (the program goes on
    // allocating until then).
    const bool written = wait_for(
        [&] {
            try {
                return load_trace(files[0].string()).events.size() > 2000;
            } catch (...) {
                return false;
            }
        },
        120);
    CHECK(written);
    REQUIRE(kill(traced, SIGKILL) == 0);
    int status = 0;
    REQUIRE(waitpid(cli_pid, &status, 0) == cli_pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + SIGKILL);  // run passes the status on

    Trace trace = load_trace(files[0].string());
    CHECK(trace.truncated);
    CHECK_FALSE(trace.footer.has_value());
    CHECK(trace.events.size() > 2000);
    CHECK(contains(trace.truncation_message, name));

    Run report = run(cli() + " report --full " + out.string());
    CHECK(report.status == 0);
    CHECK(contains(report.out, "warning: " + files[0].string() + ": trace "));
    CHECK((contains(report.out, "ends without a footer") || contains(report.out, "cut off")));
    CHECK(contains(report.out, "events by kind and level"));
    // allocscope run wrote its report of the truncated trace too.
    CHECK(contains(slurp(out / "report.txt"), "without a footer"));

    // The killed process never finished its plugins: run replayed its trace
    // through the same plugins, so the merged findings hold test-error's
    // first-event finding and test-count's, which it reports at finish.
    const std::string err = slurp(t / "stderr");
    // "pid<N>.trace": the process had no rank and is named by its pid.
    const std::string who = "pid " + name.substr(3, name.size() - 9);
    CHECK(contains(err, "allocscope: findings replayed from the trace of " + who + " (" + name +
                            "): the trace ends without a footer"));
    const FindingsFile merged = read_findings_file((out / "findings.json").string());
    bool early = false, at_finish = false;
    for (const Finding& f : merged.findings) {
        early = early || (f.plugin == "test-error" && f.summary == "emitted before failing");
        at_finish = at_finish || f.plugin == "test-count";
    }
    CHECK(early);
    CHECK(at_finish);
    CHECK(contains(err, "emitted before failing"));
    // The per-process file is the replay's too (the checkpoint is replaced).
    const std::string stem = name.substr(0, name.size() - 6);
    CHECK(contains(slurp(out / ("findings." + stem + ".json")), "test-count"));

    // check on the directory: findings.json removed, the replay is made again.
    fs::remove(out / "findings.json");
    fs::remove(out / ("findings." + stem + ".json"));
    Run gate = run("ALLOCSCOPE_PLUGIN_DIR=" + test_plugin_dir() +
                   " ALLOCSCOPE_PLUGINS=test-error,test-count"
                   " ALLOCSCOPE_PLUGIN_OPTIONS=test-error.fail_in=none " +
                   cli() + " check " + out.string() + " --fail-on info");
    CHECK(gate.status == 3);  // test-count's finding is an info or above
    CHECK(contains(gate.err, "findings replayed from the trace of " + who + " (" + name + ")"));
    CHECK(contains(gate.out, "test-count"));
    CHECK(fs::exists(out / "findings.json"));
}

TEST_CASE("a read-only output directory: one warning, output and status unchanged") {
    TempDir t;
    const fs::path ro = t / "ro";
    std::string why;
    std::unique_ptr<TmpfsMount> mount;
    if (geteuid() == 0) {
        // Root ignores permission bits: a read-only file system stops it.
        mount = std::make_unique<TmpfsMount>(ro, "ro,size=64k");
        if (!mount->mounted) why = "cannot mount a read-only tmpfs";
    } else {
        fs::create_directories(ro);
        fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    }
    if (!why.empty()) {
        MESSAGE("skipped: " << why);
        return;
    }
    Run plain = run(program() + " script");
    Run r = run(preloaded(ro / "out") + program() + " script");
    std::error_code ec;  // a read-only tmpfs refuses: it goes away with the mount
    fs::permissions(ro, fs::perms::owner_all, fs::perm_options::replace, ec);
    CHECK(r.status == plain.status);
    CHECK(r.out == plain.out);
    CAPTURE(r.err);
    CHECK(count_lines(r.err, "allocscope:") == 1);
    CHECK(count_lines(r.err, "recording disabled: cannot create output directory") == 1);
}

TEST_CASE("a full disk: one warning, output and status unchanged, the prefix readable") {
    // Every way of filling the disk this machine allows is tried, so that a
    // machine where one is missing (a container that may not mount) still
    // runs the others, and what runs here is what runs there: a 128 KiB
    // tmpfs (root), a tmpfs in a user namespace, and a file-size limit
    // (writes fail with EFBIG instead of ENOSPC; SIGXFSZ ignored as a
    // program that never writes files would not notice it).
    // ALLOCSCOPE_LOG=quiet: warnings only, so the "wrote findings" line that
    // a disk with room for the small findings file allows is not counted.
    TempDir t;
    const std::string workload = program() + " churn 200000";
    Run plain = run(workload);
    CHECK(plain.status == 0);
    int tried = 0;
    for (const std::string how : {"tmpfs", "user-namespace tmpfs", "file-size limit"}) {
        const fs::path full = t / ("full" + std::to_string(tried + 1));
        std::unique_ptr<TmpfsMount> mount;
        std::string prefix;
        if (how == "tmpfs") {
            if (geteuid() != 0) continue;
            mount = std::make_unique<TmpfsMount>(full, "size=128k");
            if (!mount->mounted) continue;
        } else if (how == "user-namespace tmpfs") {
            if (sh("unshare -rm true") != 0) continue;
            fs::create_directories(full);
            prefix = "unshare -rm sh -c 'mount -t tmpfs -o size=128k allocscope-test " +
                     full.string() + " && exec \"$@\"' sh ";
        } else {
            fs::create_directories(full);
            prefix = "sh -c 'trap \"\" XFSZ; ulimit -f 256; exec \"$@\"' sh ";
        }
        ++tried;
        CAPTURE(how);
        Run r = run("ALLOCSCOPE_LOG=quiet LD_PRELOAD=" + interposer() +
                    " ALLOCSCOPE_OUT=" + (full / "out").string() +
                    " ALLOCSCOPE_PLUGIN_DIR=" + env("E2E_PLUGIN_DIR") + " " + prefix + workload);
        CHECK(r.status == plain.status);
        CHECK(r.out == plain.out);
        CAPTURE(r.err);
        CHECK(count_lines(r.err, "allocscope:") == 1);
        CHECK((count_lines(r.err, "No space left on device") == 1 ||
               count_lines(r.err, "File too large") == 1));
        CHECK(count_lines(r.err, "further events are lost") == 1);
        if (how == "user-namespace tmpfs") continue;  // its tmpfs went with the namespace
        const auto files = traces_in(full / "out");
        REQUIRE(files.size() == 1);
        Trace trace = load_trace(files[0].string());  // a prefix, no exception
        CHECK(trace.truncated);
        CHECK(trace.events.size() > 0);
        CHECK(trace.events.size() < 400000);
    }
    MESSAGE("disk full tried " << tried << " way(s)");
    CHECK(tried >= 1);  // the file-size limit needs nothing
}

TEST_CASE("broken plugins running live: one message each, the others run on, program unchanged") {
    TempDir t;
    const fs::path out = t / "out";
    Run plain = run(program() + " script");
    const std::string plugins =
        "test-count,test-throw,test-error,test-abi2,test-nosym,test-badsize,peak-owner-missing";
    // allocscope run loads them first and refuses to start the program...
    Run refused = run(cli() + " run --out " + out.string() + " --plugin-dir " + test_plugin_dir() +
                      " --plugins " + plugins + " -- " + program() + " script");
    CHECK(refused.status == 2);
    CHECK(refused.out.empty());
    CHECK(count_lines(refused.err, "allocscope: plugin test-abi2 disabled: ") == 1);
    CHECK(count_lines(refused.err, " was not started") == 1);
    // ...a process traced without it finds them live.
    Run r = run("RANK=0 LD_PRELOAD=" + interposer() + " ALLOCSCOPE_OUT=" + out.string() +
                " ALLOCSCOPE_PLUGIN_DIR=" + test_plugin_dir() + " ALLOCSCOPE_PLUGINS=" + plugins +
                " " + program() + " script");
    CHECK(r.status == plain.status);
    CHECK(r.out == plain.out);
    CAPTURE(r.err);
    CHECK(count_lines(r.err, "allocscope: plugin test-throw disabled: on_event threw") == 1);
    CHECK(count_lines(r.err,
                      "allocscope: plugin test-error disabled: on_event returned an error") == 1);
    CHECK(count_lines(r.err, "allocscope: plugin test-abi2 disabled: ") == 1);
    CHECK(count_lines(r.err,
                      "plugin ABI version 2 under the name allocscope_plugin_v1, expected 1") >= 1);
    CHECK(count_lines(r.err, "allocscope: plugin test-nosym disabled: ") == 1);
    CHECK(count_lines(r.err, "does not export 'allocscope_plugin'") >= 1);
    CHECK(count_lines(r.err, "allocscope: plugin test-badsize disabled: ") == 1);
    CHECK(count_lines(r.err, "allocscope: plugin peak-owner-missing disabled: ") == 1);
    const FindingsFile f = read_findings_file((out / "findings.rank0.json").string());
    REQUIRE(f.ranks.size() == 1);
    CHECK(f.ranks[0].plugins == std::vector<std::string>{"test-count"});
    CHECK(f.ranks[0].disabled.size() == 6);
    bool counted = false;
    for (const Finding& x : f.findings)
        counted = counted || x.plugin == "test-count";
    CHECK(counted);
    Trace trace = load_trace(traces_in(out).at(0).string());
    CHECK(trace.footer.has_value());
}

TEST_CASE(
    "a program dying of out-of-memory without a caching allocator: the report opens with the "
    "request, and the run's last lines say it") {
    TempDir t;
    const fs::path out = t / "out";
    Run r = run(cli() + " run --out " + out.string() + " -- " + program() + " oom-exit");
    CHECK(r.status == 1);  // the program's own
    CHECK(contains(r.out, "cudaMalloc(1 PiB) = 2\n"));
    const size_t summary = r.err.rfind("out of memory at step 2, layers.3 forward");
    REQUIRE(summary != std::string::npos);
    CHECK(summary > r.err.find("report: " + out.string() + "/report.txt"));  // last
    CHECK(contains(r.err, "1.00 PiB requested on device 0 (cudaMalloc failed)"));
    CHECK(contains(r.err, "allocated 1.00 MiB in 1 allocation(s)"));
    const std::string report = slurp(out / "report.txt");
    const size_t section = report.find("== out of memory ==");
    REQUIRE(section != std::string::npos);
    CHECK(section < report.find("== run =="));
    CHECK(contains(report, "live at that moment by (layer, phase):"));
    CHECK(contains(report, "layers.3 forward"));
    CHECK(contains(slurp(out / "report.html"), "<h2 id=oom>Out of memory</h2>"));
}

TEST_CASE("failing CUDA calls: every error is passed through unchanged and recorded as such") {
    TempDir t;
    const fs::path out = t / "out";
    const std::string limit =
        "ALLOCSCOPE_SIM_MEMORY_LIMIT=1073741824 ALLOCSCOPE_SIM_REFUSE_FREE=4 ";
    Run plain = run(limit + program() + " fail-calls");
    Run r = run(limit + cli() + " run --out " + out.string() + " -- " + program() + " fail-calls");
    CHECK(plain.status == 0);
    CHECK(r.status == plain.status);
    CHECK(r.out == plain.out);  // every return code and cudaGetLastError
    CHECK(contains(plain.out, "cudaMalloc(1 PiB) = 2, last error 2\n"));
    CHECK(contains(plain.out, "cudaMalloc(NULL, 4096) = 1\n"));
    CHECK(contains(plain.out, "cudaFree(refused) = 719, last error 719\n"));
    CHECK(contains(plain.out, "cudaFree(again) = 0\n"));
    // The program went on after each refusal: no out-of-memory moment; the
    // two refused for want of memory were recovered from, the invalid ones
    // are no shortage of memory.
    const std::string written = slurp(out / "report.txt");
    CHECK(contains(written,
                   "failed allocations (oom): 4, largest request 1.00 PiB; 0 "
                   "out-of-memory moment(s), 2 failed call(s) recovered from"));
    CHECK_FALSE(contains(written, "== out of memory =="));
    Trace trace = load_trace(traces_in(out).at(0).string());
    struct Oom {
        std::string api;
        uint64_t size;
        int32_t result;
    };
    std::vector<Oom> ooms;
    int bad_frees = 0;
    std::vector<Event> refused;  // the frees of the memory the runtime kept
    for (const Event& e : trace.events) {
        if (e.kind == EventKind::oom)
            ooms.push_back({std::string(to_string(e.api)), e.size, e.result});
        if (e.kind == EventKind::free && e.result == 719) refused.push_back(e);
        if (e.kind == EventKind::free && e.result != 0 && e.result != 719) {
            ++bad_frees;
            CHECK(e.result == 1);  // cudaErrorInvalidValue
            CHECK((e.flags & (kFlagUnknownAddress | kFlagDoubleFree)) != 0);
        }
        if (e.kind == EventKind::alloc) CHECK(e.size == 8192);
    }
    // A refused free of live memory carries its size and leaves it live, so
    // the free that follows is an ordinary one, not a double free.
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].size == 8192);
    CHECK(refused[0].flags == 0);
    std::vector<Event> after;
    for (const Event& e : trace.events)
        if (e.kind == EventKind::free && e.address == refused[0].address && e.seq > refused[0].seq)
            after.push_back(e);
    REQUIRE(after.size() == 1);
    CHECK(after[0].result == 0);
    CHECK(after[0].size == 8192);
    CHECK(after[0].flags == 0);
    REQUIRE(trace.footer.has_value());
    CHECK(trace.footer->double_frees == 1);
    CHECK(trace.footer->unknown_frees == 1);
    REQUIRE(ooms.size() == 4);
    CHECK(ooms[0].api == "cudaMalloc");
    CHECK(ooms[0].size == uint64_t{1} << 50);
    CHECK(ooms[0].result == 2);  // cudaErrorMemoryAllocation
    CHECK(ooms[1].api == "cudaMallocAsync");
    CHECK(ooms[1].size == uint64_t{3} << 48);
    CHECK(ooms[1].result == 2);
    CHECK(ooms[2].api == "cudaMalloc");
    CHECK(ooms[2].size == 4096);
    CHECK(ooms[2].result == 1);  // cudaErrorInvalidValue
    CHECK(ooms[3].api == "cudaMallocPitch");
    CHECK(ooms[3].result == 1);
    CHECK(bad_frees == 2);
    Run report = run(cli() + " report " + out.string());
    CHECK(contains(report.out, "failed allocations (oom): 4"));
}

TEST_CASE("hostile symbol names reach the HTML report escaped") {
#if !defined(__x86_64__)
    MESSAGE("skipped: the hostile symbol is defined in x86-64 assembly");
    return;
#endif
    TempDir t;
    const fs::path out = t / "out";
    Run r = run(cli() + " run --out " + out.string() + " -- " + program() + " hostile-symbol");
    REQUIRE(r.status == 0);
    const std::string hostile = "<img src=x onerror=alert(1)>&'";
    // The symbol is in the report at all (the text report prints it as is).
    Run text = run(cli() + " report " + out.string());
    CHECK(text.status == 0);
    REQUIRE_MESSAGE(contains(text.out, hostile), text.out);
    for (const fs::path& html : {out / "report.html", fs::path(t / "again.html")}) {
        if (html.filename() == "again.html") {
            REQUIRE(run(cli() + " report " + out.string() + " --format html -o " + html.string())
                        .status == 0);
        }
        const std::string page = slurp(html);
        CAPTURE(html);
        // Stacks travel in the page's JSON data, '<', '>' and '&' escaped
        // there, and reach the DOM through textContent.
        CHECK(contains(page, "\\u003cimg src=x onerror=alert(1)\\u003e\\u0026'"));
        CHECK_FALSE(contains(page, "<img"));
        CHECK_FALSE(contains(page, "onerror=alert(1)>"));
    }
}

TEST_CASE("output files are 0600 and directories 0700; planted symlinks are never followed") {
    TempDir t;
    // allocscope run creates the whole path 0700.
    const fs::path out = t / "a" / "b" / "out";
    Run r = run(cli() + " run --out " + out.string() + " -- " + program() + " exit 0");
    REQUIRE(r.status == 0);
    for (const fs::path& d : {t / "a", t / "a" / "b", out}) {
        CAPTURE(d);
        CHECK(mode_of(d) == 0700);
    }
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(out)) {
        CAPTURE(e.path());
        CHECK(e.is_regular_file());
        CHECK(mode_of(e.path()) == 0600);
        ++files;
    }
    CHECK(files >= 5);  // trace, findings.pid*.json, findings.json, report.txt, report.html
    // So does the interposer on its own.
    const fs::path direct = t / "c" / "d";
    REQUIRE(run(preloaded(direct, "RANK=0") + program() + " exit 0").status == 0);
    CHECK(mode_of(t / "c") == 0700);
    CHECK(mode_of(direct) == 0700);
    CHECK(mode_of(direct / "rank0.trace") == 0600);
    CHECK(mode_of(direct / "findings.rank0.json") == 0600);

    // A shared directory with symlinks planted at the names allocscope
    // writes: the victims stay untouched.
    const fs::path victim = t / "victim";
    std::ofstream(victim) << "precious";
    const fs::path taken = t / "taken";  // the trace's own name is a symlink
    fs::create_directories(taken);
    fs::create_symlink(victim, taken / "rank0.trace");
    r = run(preloaded(taken, "RANK=0 ALLOCSCOPE_PLUGINS=none") + program() + " exit 0");
    CHECK(r.status == 0);
    CHECK(fs::is_symlink(taken / "rank0.trace"));
    REQUIRE(files_matching(taken, "rank0.pid", ".trace").size() == 1);  // another name instead
    const std::string trace = files_matching(taken, "rank0.pid", ".trace").at(0).string();

    const fs::path shared = t / "shared";
    fs::create_directories(shared);
    for (const char* name : {"findings.rank0.json", "report.html", "export.json", "findings.json"})
        fs::create_symlink(victim, shared / name);
    r = run(preloaded(shared, "RANK=0") + program() + " exit 0");
    CHECK(r.status == 0);
    CHECK(run(cli() + " report " + trace + " --format html -o " + (shared / "report.html").string())
              .status == 0);
    CHECK(run(cli() + " export " + trace + " --format perfetto -o " +
              (shared / "export.json").string())
              .status == 0);
    CHECK(run(cli() + " replay " + trace + " --plugin-dir " + env("E2E_PLUGIN_DIR") + " -o " +
              (shared / "findings.json").string())
              .status == 0);
    for (const char* name :
         {"findings.rank0.json", "report.html", "export.json", "findings.json"}) {
        CAPTURE(name);
        CHECK(fs::is_regular_file(fs::symlink_status(shared / name)));
        CHECK(mode_of(shared / name) == 0600);
    }
    CHECK(slurp(victim) == "precious");
    // rank0.trace and the four files; no temporary file is left behind.
    CHECK(files_matching(shared, "", "").size() == 5);
}

TEST_CASE("plugins are loaded only by name from the plugin directory or by path, never from .") {
    TempDir t;
    // The current directory holds test-count where a careless lookup would
    // find it: ./, ./plugins, ./allocscope/plugins.
    const fs::path cwd = t / "cwd";
    const fs::path so = fs::path(test_plugin_dir()) / "allocscope-plugin-test-count.so";
    for (const fs::path& d : {cwd, cwd / "plugins", cwd / "allocscope" / "plugins"}) {
        fs::create_directories(d);
        fs::copy_file(so, d / so.filename());
    }
    const fs::path out = t / "out";
    Run r = run("cd " + cwd.string() + " && " +
                preloaded(out, "RANK=0 ALLOCSCOPE_PLUGINS=test-count") + program() + " exit 0");
    CHECK(r.status == 0);
    CAPTURE(r.err);
    CHECK(count_lines(r.err,
                      "allocscope: plugin test-count disabled: no "
                      "allocscope-plugin-test-count.so in ") == 1);
    const FindingsFile f = read_findings_file((out / "findings.rank0.json").string());
    CHECK(f.findings.empty());
    // By path (relative to the current directory, given explicitly) it loads.
    const fs::path out2 = t / "out2";
    r = run("cd " + cwd.string() + " && " +
            preloaded(out2, "RANK=0 ALLOCSCOPE_PLUGINS=./allocscope-plugin-test-count.so") +
            program() + " exit 0");
    CHECK(r.status == 0);
    const FindingsFile g = read_findings_file((out2 / "findings.rank0.json").string());
    CHECK(g.ranks.at(0).plugins == std::vector<std::string>{"test-count"});
}
