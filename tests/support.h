// What the end-to-end suites share: their environment, scratch
// directories, running commands, reading files, and a trace whose strings
// carry markup (for the HTML report's escaping).
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trace_writer.h"

namespace allocscope::test {

namespace fs = std::filesystem;

// The value of an environment variable tests/meson.build sets.
inline std::string env(const char* name) {
    const char* v = std::getenv(name);
    REQUIRE_MESSAGE(v != nullptr, name << " must be set (see tests/meson.build)");
    return v;
}

// A fresh directory under /tmp, removed with everything in it.
struct TempDir {
    fs::path dir;
    TempDir() {
        char tmpl[] = "/tmp/allocscope-test-XXXXXX";
        dir = mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::permissions(dir, fs::perms::owner_all, ec);  // a test may have made it read-only
        fs::remove_all(dir, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    fs::path operator/(const std::string& name) const { return dir / name; }
    std::string file(const std::string& name) const { return (dir / name).string(); }
};

inline std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Changes the byte at `offset` of `path` (flips all its bits, so it cannot
// stay what it was: a trace's bytes there may be anything, an ASLR'd load
// address for one). Fails the test when the file is shorter.
inline void flip_byte(const fs::path& path, std::streamoff offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    const int byte = f.get();
    REQUIRE(byte != std::char_traits<char>::eof());
    f.seekp(offset);
    f.put(static_cast<char>(byte ^ 0xff));
    REQUIRE(f.good());
}

inline bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// How many lines of `text` contain `needle`.
inline size_t count_lines(const std::string& text, const std::string& needle) {
    size_t n = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        n += line.find(needle) != std::string::npos;
    return n;
}

// The files in `dir` named prefix...suffix, sorted.
inline std::vector<fs::path> files_matching(const fs::path& dir, const std::string& prefix,
                                            const std::string& suffix) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) == 0 && name.size() >= suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            out.push_back(e.path());
        }
    }
    std::sort(out.begin(), out.end());
    return out;
}

// Runs `command` through the shell: its exit status (128 + signal when
// killed); its standard output and error into `out` / `err` when given,
// discarded otherwise.
inline int sh(const std::string& command, std::string* out = nullptr, std::string* err = nullptr) {
    TempDir t;
    const int raw =
        std::system((command + " >" + (t / "o").string() + " 2>" + (t / "e").string()).c_str());
    if (out) *out = slurp(t / "o");
    if (err) *err = slurp(t / "e");
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
}

// A command's exit status (as sh's) and its standard output and error.
struct ShellResult {
    int status = 0;
    std::string out;
    std::string err;
};
inline ShellResult run_shell(const std::string& command) {
    ShellResult r;
    r.status = sh(command, &r.out, &r.err);
    return r;
}

// A one-rank trace with one 1 MiB allocation under the tag (layer, phase),
// both strings taken as they are (markup, quotes, anything).
inline void write_tagged_trace(const fs::path& path, const std::string& layer,
                               const std::string& phase) {
    TraceWriter w;
    TraceHeader h;
    h.tool_version = "test";
    h.pid = 7;
    h.rank = 0;
    h.world_size = 1;
    std::string error;
    REQUIRE_MESSAGE(w.open(path.string(), h, error), error);
    w.string(1, layer);
    w.string(2, phase);
    uint64_t seq = 0;
    auto event = [&](EventKind kind) {
        Event e;
        e.seq = ++seq;
        e.t_ns = seq * 1000;
        e.kind = kind;
        e.tid = 1;
        e.layer = 1;
        e.phase = 2;
        return e;
    };
    w.event(event(EventKind::tag_push));
    Event a = event(EventKind::alloc);
    a.level = Level::segment;
    a.memory = MemoryKind::device;
    a.api = Api::cudaMalloc;
    a.address = 0x1000;
    a.size = 1 << 20;
    w.event(a);
    w.event(event(EventKind::tag_pop));
    w.close(FooterRecord{});
}

// Starts `sh -c command` in a child with SIGTERM as a shell gives it
// (default, unblocked, whatever the test runner left); its pid, -1 when
// fork failed. The caller waits for it.
inline pid_t spawn_shell(const std::string& command) {
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &term, nullptr);
        execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}

// Polls `done` every 20 ms until it holds or `seconds` pass; its last answer.
inline bool wait_for(const std::function<bool()>& done, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return done();
}

}  // namespace allocscope::test
