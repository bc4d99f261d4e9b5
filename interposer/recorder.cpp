#include "recorder.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checks.h"
#include "config.h"
#include "cuda_decls.h"
#include "elf_note.h"
#include "event_ring.h"
#include "findings.h"
#include "live_table.h"
#include "output_file.h"
#include "plugin_host.h"
#include "real_cuda.h"
#include "replay.h"
#include "stack_table.h"
#include "string_table.h"
#include "trace_writer.h"
#include "unwind.h"
#include "unwind_cfi.h"

#ifndef ALLOCSCOPE_VERSION
#define ALLOCSCOPE_VERSION "0.0.0"
#endif

namespace allocscope::recorder {

namespace {

enum : int { kUninitialized = 0, kRecording = 1, kOff = 2 };

constexpr uint32_t kMaxTagDepth = 64;
constexpr size_t kWriterBatch = 4096;
// How long a hook waits for room in a full ring before dropping its event.
constexpr uint64_t kRingPatienceNs = 2'000'000'000ull;
// How long exit waits for the writer to drain before giving up.
constexpr int kExitDrainMs = 5000;
// How long exit then waits for the plugins' finish and the findings file.
constexpr int kExitPluginsMs = 10000;

struct TagEntry {
    uint32_t layer;
    uint32_t phase;
    // Keyed tags (allocscope_enter and friends); 0 / 0 / 0 for a plain push.
    uint32_t kind;
    uint64_t key;
    uint64_t generation;
    // The layer's interned text: the string table's strings never move, so
    // the owning thread reads it without the lock. nullptr for "".
    const std::string* layer_text;
};

// A string this thread interned, by the pointer it came in: a tag call
// whose text sits at the same address with the same content (checked with
// strcmp against the interned copy, which never changes or moves) takes
// its id from here, without the definitions lock and the table's hash.
struct InternedText {
    const char* ptr;
    const std::string* text;
    uint32_t id;
};
constexpr size_t kInternCacheSlots = 32;

// A stack this thread interned, by its 64-bit hash and depth: a capture
// whose frames hash to the same value takes the id from here instead of
// the process-wide table, whose slot and stored frames are two cache
// misses in a program that evicts them between captures. Two different
// stacks of one depth with one hash would share an id; with 64-bit hashes
// and n distinct stacks that has odds of about n^2 / 2^65 per process.
struct StackIdSlot {
    uint64_t hash;  // 0: empty (StackTable::hash never returns 0)
    uint32_t id;
    uint32_t depth;
};
constexpr size_t kStackIdSlots = 1024;  // 16 KiB per thread

// Trivially constructible so TLS needs no constructor or destructor calls.
struct ThreadState {
    bool in_hook;
    bool is_writer;
    uint32_t tid;
    uint32_t depth;  // pushes minus pops, including those beyond kMaxTagDepth
    int32_t device;  // cached current device, valid while device_context is current
    void* device_context;
    TagEntry tags[kMaxTagDepth];
    InternedText interned[kInternCacheSlots];
    StackIdSlot stack_ids[kStackIdSlots];
};
thread_local ThreadState t_thread;

struct Definition {
    RecordType type;
    uint32_t id;
    std::string text;
    std::vector<uint64_t> frames;
    ParamRecord param;
};

struct ModuleRange {
    uint64_t start;
    uint64_t end;
};

struct State {
    Config config;
    uint64_t start_mono_ns = 0;
    pid_t owner_pid = 0;

    EventRing ring;
    Replay live;  // the writer thread's only (track_live)
    StackTable stacks;
    std::atomic<uint64_t> step{0};
    std::atomic<uint64_t> events_dropped{0};
    // ALLOCSCOPE_LOG=debug only: what stack capture costs the program's
    // threads, reported in one line at exit (see capture_stack_id).
    bool cost_stats = false;
    std::atomic<uint64_t> stacks_captured{0};
    std::atomic<uint64_t> stack_ns{0};
    std::atomic<uint64_t> walk_ns{0};  // of stack_ns: the walk, the rest is interning
    std::atomic<uint64_t> python_frames{0};
    uint64_t self_start = 0;  // text of liballocscope.so, see capture_stack_id
    uint64_t self_end = 0;

    // Definitions (strings, stacks, params) wait here until the writer puts
    // them into the trace ahead of the events that use them.
    std::mutex defs_mutex;
    StringTable strings;
    uint32_t params = 0;
    // (layer, name) string ids -> the latest param index registered for it,
    // for allocscope_derived.
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> param_index;
    std::vector<Definition> pending_defs;

    // Owned by the writer thread once it runs.
    TraceWriter writer;
    std::vector<ModuleRange> module_ranges;
    std::set<std::pair<uint64_t, std::string>> modules_written;
    pthread_t writer_thread{};
    std::atomic<bool> stop{false};
    std::atomic<bool> trace_done{false};  // footer written
    std::atomic<bool> writer_done{false};

    // Live plugins (writer thread only). The writer keeps its own copy of
    // the definitions it writes, so events are resolved exactly as a reader
    // of the trace resolves them.
    std::unique_ptr<PluginHost> plugins;
    std::vector<std::string> written_strings{std::string()};  // index = string id
    std::vector<ParamRecord> written_params;                  // index = param index
    // Scoped checks (allocscope_check_begin/end), fed by the writer too.
    CheckSet checks;
};

std::atomic<int> g_state{kUninitialized};
std::atomic<OuterFrames> g_outer_frames{nullptr};  // set_outer_frames
pthread_mutex_t g_init_mutex = PTHREAD_MUTEX_INITIALIZER;
// Never destroyed: hooks may run during static destruction of other objects.
alignas(State) unsigned char g_storage[sizeof(State)];
State* g = nullptr;
// Set when the library is loaded (see note_how_loaded): its absolute path,
// and the CUDA library that was loaded before it, if any.
char g_self_path[PATH_MAX];
char g_loaded_after[256];

uint64_t mono_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

uint64_t wall_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

uint32_t thread_id() noexcept {
    if (t_thread.tid == 0) t_thread.tid = static_cast<uint32_t>(syscall(SYS_gettid));
    return t_thread.tid;
}

TagEntry current_tag() noexcept {
    uint32_t d = t_thread.depth;
    if (d == 0) return {};
    return t_thread.tags[(d < kMaxTagDepth ? d : kMaxTagDepth) - 1];
}

void log_line(LogLevel at_least, const std::string& line) {
    if (g && static_cast<int>(g->config.log) < static_cast<int>(at_least)) return;
    std::string out = line + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
    (void)ignored;
}

// --- module map (writer thread) ---------------------------------------------

std::string self_exe_path() {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

void scan_modules() {
    struct Found {
        ModuleRecord record;
        ModuleRange range;
    };
    std::vector<Found> found;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* arg) -> int {
            auto* out = static_cast<std::vector<Found>*>(arg);
            uint64_t lo = UINT64_MAX, hi = 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& ph = info->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD) continue;
                lo = std::min<uint64_t>(lo, ph.p_vaddr);
                hi = std::max<uint64_t>(hi, ph.p_vaddr + ph.p_memsz);
            }
            if (hi == 0) return 0;
            Found f;
            f.record.base = info->dlpi_addr;
            f.record.size = hi;
            f.record.path = info->dlpi_name ? info->dlpi_name : "";
            f.record.build_id = loaded_build_id(info);
            f.range = {info->dlpi_addr + lo, info->dlpi_addr + hi};
            out->push_back(std::move(f));
            return 0;
        },
        &found);
    for (Found& f : found) {
        if (f.record.path.empty()) f.record.path = self_exe_path();
        auto key = std::make_pair(f.record.base, f.record.path);
        if (!g->modules_written.insert(key).second) continue;
        g->writer.module(f.record);
        g->module_ranges.push_back(f.range);
    }
}

void cover_modules(const std::vector<uint64_t>& frames) {
    for (uint64_t pc : frames) {
        bool known = false;
        for (const ModuleRange& r : g->module_ranges) {
            if (pc >= r.start && pc < r.end) {
                known = true;
                break;
            }
        }
        if (!known) {
            scan_modules();  // a library was loaded since the last scan
            return;
        }
    }
}

// --- live plugins (writer thread) ----------------------------------------------

void keep_definition(const Definition& d) {
    if (d.type == RecordType::string) {
        if (g->written_strings.size() <= d.id) g->written_strings.resize(d.id + 1);
        g->written_strings[d.id] = d.text;
    } else if (d.type == RecordType::param) {
        if (g->written_params.size() <= d.param.index) g->written_params.resize(d.param.index + 1);
        g->written_params[d.param.index] = d.param;
    }
}

// <ALLOCSCOPE_PLUGIN_DIR>, else relative to liballocscope.so: installed,
// <libdir>/liballocscope.so -> <libdir>/allocscope/plugins; in the build
// tree, <build>/interposer/liballocscope.so -> <build>/plugins.
std::string plugin_dir() {
    if (!g->config.plugin_dir.empty()) return g->config.plugin_dir;
    // The library's absolute path as it was when loaded: a relative
    // LD_PRELOAD path must not make plugins load from wherever the program
    // has chdir'ed to since, and nothing is looked up in "." implicitly.
    const std::string lib = g_self_path;
    const size_t slash = lib.rfind('/');
    if (lib.empty() || lib[0] != '/' || slash == std::string::npos) return {};
    const std::string dir = lib.substr(0, slash);
    std::vector<std::string> candidates{dir + "/allocscope/plugins"};
    if (dir.size() >= 11 && dir.compare(dir.size() - 11, 11, "/interposer") == 0) {
        candidates.push_back(dir + "/../plugins");
    }
    return first_directory(candidates);
}

void start_plugins() {
    if (g->config.plugins_off) return;
    try {
        HostSettings settings;
        settings.rank = g->config.rank;
        settings.world_size = g->config.world_size > 0 ? g->config.world_size : 0;
        settings.options = g->config.plugin_options;
        settings.warn = [](const std::string& line) { log_line(LogLevel::quiet, line); };
        settings.info = [](const std::string& line) { log_line(LogLevel::info, line); };
        auto host = std::make_unique<PluginHost>(std::move(settings));
        const std::string dir = plugin_dir();
        if (dir.empty() && g->config.plugins.empty()) {
            log_line(LogLevel::debug,
                     "allocscope: no plugin directory found (set ALLOCSCOPE_PLUGIN_DIR); no "
                     "plugins run");
        }
        host->load(g->config.plugins, dir);
        g->plugins = std::move(host);
    } catch (const std::exception& e) {
        log_line(LogLevel::quiet, std::string("allocscope: plugins off: ") + e.what());
    } catch (...) {
        log_line(LogLevel::quiet, "allocscope: plugins off: unexpected exception");
    }
}

void feed_plugins(const std::vector<Event>& batch) {
    if (!g->plugins) return;
    try {
        for (const Event& e : batch)
            g->plugins->feed(e, g->written_strings, g->written_params);
    } catch (const std::exception& e) {
        // Only the host's own bookkeeping throws (out of memory); plugin
        // failures are contained by the host.
        log_line(LogLevel::quiet,
                 std::string("allocscope: plugins stopped, no findings written: ") + e.what());
        g->plugins.reset();
    } catch (...) {
        log_line(LogLevel::quiet, "allocscope: plugins stopped, no findings written");
        g->plugins.reset();
    }
}

// findings.<stem>.json next to <stem>.trace: the trace's name is unique in
// the directory, so is this one.
std::string trace_name() {
    const std::string& trace = g->writer.path();
    const size_t slash = trace.rfind('/');
    return slash == std::string::npos ? trace : trace.substr(slash + 1);
}

std::string findings_path() {
    const std::string name = trace_name();
    const std::string stem = name.size() > 6 ? name.substr(0, name.size() - 6) : name;
    return g->config.out_dir + "/findings." + stem + ".json";
}

// Findings emitted while the program runs are written out (the same file,
// replaced atomically) at most once a second, so a process killed with
// SIGKILL leaves those of about a second before; the file written at exit
// replaces the last checkpoint. Built-in plugins emit at finish, so for them
// this never writes. Failures stay silent: the final write reports them.
void checkpoint_findings() {
    static size_t written = 0;
    static uint64_t last_ns = 0;
    if (!g->plugins) return;
    const size_t n = g->plugins->findings().size();
    const uint64_t now = mono_ns();
    if (n == written || (last_ns != 0 && now - last_ns < 1'000'000'000ull)) return;
    last_ns = now;
    try {
        write_findings_file(findings_path(), g->plugins->findings_file(trace_name()));
        written = n;
    } catch (...) {
    }
}

void finish_plugins() {
    if (!g->plugins) return;
    const std::string name = trace_name();
    const std::string path = findings_path();
    try {
        g->plugins->finish();
        FindingsFile file = g->plugins->findings_file(name);
        write_findings_file(path, file);
        log_line(LogLevel::info, "allocscope: wrote " + path + " (" +
                                     std::to_string(file.findings.size()) + " finding(s))");
    } catch (const std::exception& e) {
        // After a failed trace write (disk full) its one warning has said
        // that output is being lost; the findings share its fate.
        if (!g->writer.failed()) {
            log_line(LogLevel::quiet, std::string("allocscope: findings not written: ") + e.what());
        }
    } catch (...) {
        if (!g->writer.failed()) log_line(LogLevel::quiet, "allocscope: findings not written");
    }
}

// --- writer thread ------------------------------------------------------------

void write_pending_definitions() {
    std::vector<Definition> defs;
    {
        std::lock_guard lock(g->defs_mutex);
        defs.swap(g->pending_defs);
    }
    for (const Definition& d : defs) {
        // Kept whether plugins run or not: a check may start any time.
        try {
            keep_definition(d);
        } catch (...) {
            log_line(LogLevel::quiet,
                     "allocscope: plugins stopped, no findings written: out of memory");
            g->plugins.reset();
            g->checks.close("the recorder ran out of memory");
        }
        switch (d.type) {
            case RecordType::string:
                g->writer.string(d.id, d.text);
                break;
            case RecordType::stack:
                cover_modules(d.frames);
                g->writer.stack(d.id, d.frames);
                break;
            case RecordType::param:
                g->writer.param(d.param);
                break;
            default:
                break;
        }
    }
}

// The live allocations, kept by the writer in seq order (the trace's order)
// through the same Replay the tools use: an alloc enters its pool's table; a
// free takes its record out and gets the record's size, device and memory
// kind, or is flagged as freeing an address never seen or already freed. A
// free the runtime refused leaves the record in. The hooks touch no table:
// no lock, no hash lookup on the program's threads. An alloc whose event was
// dropped (the writer stalled) is not in the table; its free is then flagged
// unknown.
void track_live(std::vector<Event>& batch) noexcept {
    for (Event& e : batch) {
        if (e.kind != EventKind::alloc && e.kind != EventKind::free) continue;
        LiveRecord freed;
        FreeOutcome outcome;
        try {
            outcome = g->live.apply(e, &freed);
        } catch (...) {
            // Out of host memory growing a table: the event is still
            // recorded; an alloc's free will carry no size.
            continue;
        }
        if (e.kind != EventKind::free) continue;
        if (outcome == FreeOutcome::freed) {
            e.size = freed.size;
            e.device = freed.device;
            e.memory = freed.memory;
        } else if (outcome == FreeOutcome::unknown) {
            e.flags |= kFlagUnknownAddress;
        } else {
            e.flags |= kFlagDoubleFree;
        }
    }
}

// Moves published events into the file. Returns how many were written.
uint64_t drain_once(std::vector<Event>& batch) {
    // Read what is published before taking the definitions: every definition
    // an event refers to was queued before that event was published.
    uint64_t n = g->ring.published_run(kWriterBatch);
    write_pending_definitions();
    if (n == 0) return 0;
    uint64_t first = g->ring.consumed();
    batch.clear();
    for (uint64_t i = 0; i < n; ++i)
        batch.push_back(g->ring.at(first + i));
    g->ring.release_until(first + n);
    track_live(batch);
    for (const Event& e : batch)
        g->writer.event(e);
    feed_plugins(batch);
    g->checks.feed(batch, first, {g->written_strings, g->written_params});
    return n;
}

void report_write_failure_once() {
    static bool reported = false;
    if (g->writer.failed() && !reported) {
        reported = true;
        log_line(LogLevel::quiet, "allocscope: " + g->writer.error() +
                                      "; recording continues but further events are lost");
    }
}

// ALLOCSCOPE_WALK_CYCLES=1: cycles per frame by where its rule came from.
std::string walk_cycles_text(const WalkStats& w) {
    if (w.memo_hit_cycles + w.recent_hit_cycles + w.miss_cycles == 0) return "";
    const uint64_t misses = w.frames - w.memo_hits - w.recent_hits;
    auto per = [](uint64_t cycles, uint64_t n) { return std::to_string(n ? cycles / n : 0); };
    return "; cycles per frame: " + per(w.memo_hit_cycles, w.memo_hits) +
           " (rule from the memo), " + per(w.recent_hit_cycles, w.recent_hits) +
           " (recent rules), " + per(w.miss_cycles, misses) + " (process-wide cache)";
}

// ALLOCSCOPE_LOG=debug: what stack capture cost the program's threads.
std::string stack_cost_line() {
    const uint64_t n = g->stacks_captured.load();
    const uint64_t ns = g->stack_ns.load();
    const WalkStats walks = walk_stats();
    const uint64_t walk_ns = g->walk_ns.load();
    return "allocscope: " + std::to_string(n) + " stacks captured, " +
           std::to_string(n ? ns / n : 0) + " ns each on average (" + std::to_string(ns / 1000000) +
           " ms in all; walking " + std::to_string(n ? walk_ns / n : 0) +
           " ns, interning the rest), " + std::to_string(g->python_frames.load()) +
           " Python frames appended, " + std::to_string(fallback_capture_count()) +
           " walks fell back to libgcc's unwinder; " +
           std::to_string(walks.walks ? walks.frames / walks.walks : 0) +
           " native frames stepped through per walk, " +
           std::to_string(walks.frames ? walks.memo_hits * 100 / walks.frames : 0) +
           " % of their rules from the thread's memo of its last walk, " +
           std::to_string(walks.frames ? walks.recent_hits * 100 / walks.frames : 0) +
           " % from its recent rules; " + std::to_string(walks.replays) +
           " captures replayed an earlier walk (the stack words it read unchanged)" +
           walk_cycles_text(walks);
}

// ALLOCSCOPE_LOG=debug, from the writer thread: the CPU it used, which the
// program's threads do not pay for directly but which competes with them
// for cores.
std::string writer_cost_line(uint64_t recording_ns) {
    timespec cpu{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    const uint64_t cpu_ns = uint64_t(cpu.tv_sec) * 1000000000ull + uint64_t(cpu.tv_nsec);
    char text[256];
    std::snprintf(text, sizeof text,
                  "allocscope: the writer thread used %.1f ms of CPU in %.1f ms of recording "
                  "(%.1f %% of a core: encoding, writing, checks and live plugins)",
                  double(cpu_ns) / 1e6, double(recording_ns) / 1e6,
                  recording_ns ? 100.0 * double(cpu_ns) / double(recording_ns) : 0.0);
    return text;
}

void* writer_main(void*) {
    t_thread.is_writer = true;
    t_thread.in_hook = true;  // nothing this thread does is recorded
    std::vector<Event> batch;
    batch.reserve(kWriterBatch);
    scan_modules();
    start_plugins();
    long sleep_us = 1000;
    for (;;) {
        uint64_t n = drain_once(batch);
        g->checks.service(g->ring.consumed(), {g->written_strings, g->written_params});
        g->writer.flush();
        report_write_failure_once();
        checkpoint_findings();
        if (n > 0) {
            sleep_us = 1000;
            continue;
        }
        if (g->stop.load(std::memory_order_acquire)) break;
        timespec pause{0, sleep_us * 1000};
        nanosleep(&pause, nullptr);
        // A program thread waiting on a check is not kept waiting long.
        sleep_us = g->checks.busy() ? 200 : std::min<long>(sleep_us * 2, 20000);
    }
    g->checks.close("recording has stopped (the program is exiting)");
    // Final drain: wait briefly for hooks that reserved a slot before
    // recording was switched off (a free blocked in the real call).
    uint64_t deadline = mono_ns() + 1'000'000'000ull;
    while (g->ring.consumed() < g->ring.reserved() && mono_ns() < deadline) {
        if (drain_once(batch) == 0) {
            timespec pause{0, 200000};
            nanosleep(&pause, nullptr);
        }
    }
    write_pending_definitions();
    FooterRecord footer;
    footer.events = g->writer.events_written();
    footer.unknown_frees = g->live.unknown_frees();
    footer.double_frees = g->live.double_frees();
    footer.stacks_dropped = g->stacks.dropped();
    footer.events_dropped = g->events_dropped.load() + (g->ring.reserved() - g->ring.consumed());
    footer.end_mono_ns = mono_ns();
    g->writer.close(footer);
    report_write_failure_once();
    if (!g->writer.failed()) {
        log_line(LogLevel::info, "allocscope: wrote " + g->writer.path() + " (" +
                                     std::to_string(footer.events) + " events)");
    }
    if (g->cost_stats) {
        log_line(LogLevel::debug, stack_cost_line());
        log_line(LogLevel::debug, writer_cost_line(footer.end_mono_ns - g->start_mono_ns));
    }
    // The trace is complete before any plugin's finish runs: a plugin that
    // takes too long at exit costs its findings, never the trace.
    g->trace_done.store(true, std::memory_order_release);
    finish_plugins();
    g->writer_done.store(true, std::memory_order_release);
    return nullptr;
}

// --- initialization -----------------------------------------------------------

bool open_trace(std::string& error) {
    const Config& c = g->config;
    const uint32_t pid = static_cast<uint32_t>(getpid());
    TraceHeader header;
    header.tool_version = ALLOCSCOPE_VERSION;
    header.pid = pid;
    header.rank = c.rank;
    header.world_size = c.world_size;
    header.stack_depth = c.stack_depth;
    header.start_wall_ns = wall_ns();
    header.start_mono_ns = g->start_mono_ns;
    // The first name is rank<R>.trace / pid<PID>.trace. It can exist already:
    // a launcher that execs keeps its pid, and several processes may share a
    // rank. Then the pid and a counter make the name unique.
    const std::string first = trace_file_name(c, pid);
    const std::string stem = first.substr(0, first.size() - 6);
    const std::string pid_stem = c.rank >= 0 ? stem + ".pid" + std::to_string(pid) : stem;
    for (int attempt = 0; attempt < 100; ++attempt) {
        std::string name = attempt == 0 ? first
                           : attempt == 1 && c.rank >= 0
                               ? pid_stem + ".trace"
                               : pid_stem + "." + std::to_string(attempt) + ".trace";
        error.clear();
        if (g->writer.open(c.out_dir + "/" + name, header, error)) return true;
        if (errno != EEXIST) return false;
    }
    return false;
}

bool start_writer() {
    sigset_t all, old;
    sigfillset(&all);
    // The writer thread must never run the program's signal handlers.
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&g->writer_thread, nullptr, writer_main, nullptr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) return false;
    pthread_detach(g->writer_thread);
    return true;
}

void find_own_module() {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&find_own_module), &info)) return;
    struct Query {
        uint64_t base;
        uint64_t start, end;
    } q{reinterpret_cast<uint64_t>(info.dli_fbase), 0, 0};
    dl_iterate_phdr(
        [](dl_phdr_info* pi, size_t, void* arg) -> int {
            auto* q = static_cast<Query*>(arg);
            if (pi->dlpi_addr + pi->dlpi_phdr[0].p_vaddr - pi->dlpi_phdr[0].p_offset != q->base &&
                pi->dlpi_addr != q->base) {
                return 0;
            }
            for (int i = 0; i < pi->dlpi_phnum; ++i) {
                const ElfW(Phdr)& ph = pi->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
                q->start = pi->dlpi_addr + ph.p_vaddr;
                q->end = q->start + ph.p_memsz;
            }
            return 1;
        },
        &q);
    g->self_start = q.start;
    g->self_end = q.end;
}

void initialize() {
    g = new (g_storage) State();
    find_own_module();
    g->config = parse_config([](const char* name) { return std::getenv(name); });
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

void on_fork_child() {
    g_state.store(kOff, std::memory_order_release);
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
    pthread_atfork(nullptr, nullptr, on_fork_child);
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

// --- event helpers ---------------------------------------------------------------

uint32_t intern_locked(const char* text) {
    if (!text || !*text) return 0;
    auto [id, is_new] = g->strings.intern(text);
    if (is_new) g->pending_defs.push_back({RecordType::string, id, text, {}, {}});
    return id;
}

uint32_t intern(const char* text) {
    if (!text || !*text) return 0;
    std::lock_guard lock(g->defs_mutex);
    return intern_locked(text);
}

// Frames of liballocscope.so itself (hooks, recorder) lead every captured
// stack; how many depends on inlining, so the walk drops them by address
// (at most this many) without counting them towards the depth.
constexpr size_t kOwnFramesMax = 8;

uint32_t intern_stack(const uint64_t* frames, size_t n) noexcept {
    if (n == 0) return 0;
    const std::span<const uint64_t> stack{frames, n};
    const uint64_t h = StackTable::hash(stack);
    StackIdSlot& cached = t_thread.stack_ids[h % kStackIdSlots];
    if (cached.hash == h && cached.depth == n) return cached.id;
    try {
        const uint32_t id =
            g->stacks.intern(h, stack, [](uint32_t id, std::span<const uint64_t> f) {
                std::lock_guard lock(g->defs_mutex);
                g->pending_defs.push_back(
                    {RecordType::stack, id, {}, std::vector<uint64_t>(f.begin(), f.end()), {}});
            });
        if (id != 0) cached = {h, id, static_cast<uint32_t>(n)};
        return id;
    } catch (...) {
        return 0;
    }
}

// The key under which the recorder keeps a stack id with the unwinder's
// record of a walk (WalkCookie): the outer frames' hash, since the native
// frames are that walk's. Never 0.
uint64_t outer_key(std::span<const uint64_t> outer) noexcept {
    return StackTable::hash(outer.first(std::min(outer.size(), kMaxOuterFrames)));
}

// The native frames, then up to kMaxOuterFrames of `outer` (Python's: the
// callers of the interpreter the native stack ends in), as a stack id. A
// capture that replays a walk whose frames were interned before with the
// same outer frames takes that id from the walk's cookie: no frames copied,
// hashed or looked up.
struct StackCapture {
    uint64_t frames[Config::kMaxStackDepth + kMaxOuterFrames];
    WalkCookie* cookie = nullptr;
    uint64_t key = 0;
    size_t n = 0;

    // Returns the id when the cookie had it (0: frames captured, n set).
    __attribute__((always_inline)) uint32_t walk(std::span<const uint64_t> outer,
                                                 uint32_t depth) noexcept {
        key = outer_key(outer);
        const size_t native =
            capture_stack(frames, std::min<size_t>(depth, Config::kMaxStackDepth), 0,
                          {g->self_start, g->self_end, kOwnFramesMax}, &cookie, key);
        if (native == kFramesInCookie) return static_cast<uint32_t>(cookie->value);
        const size_t extra = std::min(outer.size(), kMaxOuterFrames);
        std::copy_n(outer.begin(), extra, frames + native);
        n = native + extra;
        return 0;
    }
    uint32_t intern() noexcept {
        const uint32_t id = intern_stack(frames, n);
        if (cookie && id != 0) *cookie = {key, id};
        return id;
    }
};

__attribute__((always_inline)) inline uint32_t capture_stack_id_untimed(
    std::span<const uint64_t> outer, uint32_t depth) noexcept {
    StackCapture capture;
    if (const uint32_t id = capture.walk(outer, depth)) return id;
    return capture.intern();
}

__attribute__((noinline)) uint32_t capture_stack_id_timed(std::span<const uint64_t> outer,
                                                          uint32_t depth) noexcept {
    StackCapture capture;
    const uint64_t start = mono_ns();
    uint32_t id = capture.walk(outer, depth);
    const uint64_t walked = mono_ns();
    if (id == 0) id = capture.intern();
    const uint64_t end = mono_ns();
    g->stack_ns.fetch_add(end - start, std::memory_order_relaxed);
    g->walk_ns.fetch_add(walked - start, std::memory_order_relaxed);
    g->stacks_captured.fetch_add(1, std::memory_order_relaxed);
    g->python_frames.fetch_add(outer.size(), std::memory_order_relaxed);
    return id;
}

// The stack id of the calling hook's caller (0: stacks off or not recorded).
uint32_t capture_stack_id(std::span<const uint64_t> outer = {}) noexcept {
    const uint32_t depth = g->config.stack_depth;
    if (depth == 0) return 0;
    if (g->cost_stats) [[unlikely]]
        return capture_stack_id_timed(outer, depth);
    return capture_stack_id_untimed(outer, depth);
}

// The fields every event shares; `seq` is the ring's.
void fill_common(Event& e, EventKind kind) noexcept {
    e.kind = kind;
    e.level = Level::none;
    e.memory = MemoryKind::none;
    e.api = Api::none;
    e.address = 0;
    e.size = 0;
    e.stream = 0;
    e.stack = 0;
    e.aux = 0;
    e.flags = 0;
    e.device = -1;
    e.result = 0;
    e.t_ns = mono_ns() - g->start_mono_ns;
    e.tid = thread_id();
    e.step = g->step.load(std::memory_order_relaxed);
    TagEntry tag = current_tag();
    e.layer = tag.layer;
    e.phase = tag.phase;
}

// Reserves a slot (every field is written: slots are reused).
EventRing::Slot* begin_event(EventKind kind) noexcept {
    EventRing::Slot* slot = g->ring.reserve(kRingPatienceNs);
    if (!slot) {
        g->events_dropped.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    fill_common(slot->event, kind);
    return slot;
}

void emit_simple(EventKind kind, uint32_t layer, uint32_t phase, uint32_t aux,
                 uint32_t flags) noexcept {
    EventRing::Slot* slot = begin_event(kind);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = layer;
    e.phase = phase;
    e.aux = aux;
    e.flags = flags;
    e.api = Api::c_api;
    EventRing::publish(slot);
}

// C API calls are not hooks, but CUDA calls they trigger must not be
// recorded as the user's either; they share the hooks' guard.
struct ApiScope {
    HookGuard guard;
    bool active() const noexcept { return guard.recording() && ensure_started(); }
};

}  // namespace

// --- hooks' interface ---------------------------------------------------------------

HookGuard::HookGuard() noexcept : outer_(!t_thread.in_hook) {
    t_thread.in_hook = true;
    recording_ = outer_ && g_state.load(std::memory_order_relaxed) != kOff;
}

HookGuard::~HookGuard() {
    if (outer_) t_thread.in_hook = false;
}

__attribute__((noinline)) void record_alloc(const AllocInfo& info, void* address, int result,
                                            std::span<const uint64_t> outer) noexcept {
    if (!ensure_started()) return;
    const bool ok = result == 0 && address != nullptr;
    // No frames given (a runtime or driver hook): ask the registered
    // provider (set_outer_frames) for the thread's Python frames.
    uint64_t provided[kMaxOuterFrames];
    if (ok && outer.data() == nullptr && g->config.stack_depth != 0) {
        if (OuterFrames provider = g_outer_frames.load(std::memory_order_acquire)) {
            const size_t n = provider(provided, kMaxOuterFrames);
            outer = {provided, std::min(n, kMaxOuterFrames)};
        }
    }
    const uint32_t stack = ok ? capture_stack_id(outer) : 0;
    EventRing::Slot* slot = begin_event(ok ? EventKind::alloc : EventKind::oom);
    if (!slot) return;
    Event& e = slot->event;
    e.address = ok ? reinterpret_cast<uint64_t>(address) : 0;
    e.size = info.size;
    e.stream = info.stream;
    e.stack = stack;
    e.device = info.device;
    e.result = result;
    e.level = info.level;
    e.memory = info.memory;
    e.api = info.api;
    EventRing::publish(slot);
}

// The free's size, device and memory kind, and whether its address was
// live, are the writer's to fill in (track_live): the hook only reserves
// the slot, so its seq precedes any allocation that reuses the address.
void begin_free(PendingFree& pending, Api api, Level level, void* address,
                uint64_t stream) noexcept {
    pending.slot = nullptr;
    if (!ensure_started()) return;
    EventRing::Slot* slot = begin_event(EventKind::free);
    if (!slot) return;
    Event& e = slot->event;
    e.address = reinterpret_cast<uint64_t>(address);
    e.stream = stream;
    e.level = level;
    e.api = api;
    pending.slot = slot;
}

void end_free(PendingFree& pending, int result) noexcept {
    if (!pending.slot) return;
    auto* slot = static_cast<EventRing::Slot*>(pending.slot);
    slot->event.result = result;
    EventRing::publish(slot);
}

namespace {

// Pushes `tag` (its layer and phase already interned) onto the calling
// thread's stack. Beyond kMaxTagDepth the push is counted and flagged but
// the tag stays the enclosing one.
void push_entry(TagEntry tag) noexcept {
    uint32_t flags = 0;
    if (t_thread.depth < kMaxTagDepth) {
        t_thread.tags[t_thread.depth] = tag;
    } else {
        flags = kFlagTagOverflow;
        const TagEntry parent = current_tag();
        tag.layer = parent.layer;
        tag.phase = parent.phase;
    }
    ++t_thread.depth;
    emit_simple(EventKind::tag_push, tag.layer, tag.phase, 0, flags);
}

void pop_entry() noexcept {
    if (t_thread.depth == 0) return;
    const TagEntry tag = current_tag();
    const uint32_t flags = t_thread.depth > kMaxTagDepth ? uint32_t{kFlagTagOverflow} : 0u;
    --t_thread.depth;
    emit_simple(EventKind::tag_pop, tag.layer, tag.phase, 0, flags);
}

// Pops until `depth` tags are left.
void pop_to(uint32_t depth) noexcept {
    while (t_thread.depth > depth)
        pop_entry();
}

InternedText& interned_slot(const char* text) noexcept {
    const auto bits = reinterpret_cast<uintptr_t>(text);
    return t_thread.interned[((bits >> 3) ^ (bits >> 11)) % kInternCacheSlots];
}

// The id and interned copy of non-empty `text` from the thread's cache, or
// false.
bool cached_intern(const char* text, uint32_t& id, const std::string*& interned) noexcept {
    const InternedText& slot = interned_slot(text);
    if (slot.ptr != text || std::strcmp(text, slot.text->c_str()) != 0) return false;
    id = slot.id;
    interned = slot.text;
    return true;
}

// Interns `text` (NULL: keeps `id` and `interned` as they are; "": none)
// through the thread's cache, else under the definitions lock.
void intern_for_tag(const char* text, uint32_t& id, const std::string*& interned) {
    if (!text) return;
    if (!*text) {
        id = 0;
        interned = nullptr;
        return;
    }
    if (cached_intern(text, id, interned)) return;
    {
        std::lock_guard lock(g->defs_mutex);
        id = intern_locked(text);
        interned = &g->strings.at(id);
    }
    interned_slot(text) = {text, interned, id};
}

// The entry (layer, phase) makes over the calling thread's current tag: a
// NULL value keeps the enclosing one, "" is none. False when interning failed.
bool make_entry(TagEntry& tag, const char* layer, const char* phase) noexcept {
    tag = current_tag();
    tag.kind = 0;
    tag.key = 0;
    tag.generation = 0;
    try {
        intern_for_tag(layer, tag.layer, tag.layer_text);
        const std::string* phase_text = nullptr;
        intern_for_tag(phase, tag.phase, phase_text);
    } catch (...) {
        return false;
    }
    return true;
}

// The number of the calling thread's tags that are stored (beyond
// kMaxTagDepth they are only counted).
uint32_t stored_depth() noexcept {
    return t_thread.depth < kMaxTagDepth ? t_thread.depth : kMaxTagDepth;
}

// The keyed entries on the calling thread's stack: all of them (kind 0), or
// those of `kind`.
uint32_t keyed_entries(uint32_t kind = 0) noexcept {
    uint32_t n = 0;
    for (uint32_t i = 0, d = stored_depth(); i < d; ++i) {
        const uint32_t k = t_thread.tags[i].kind;
        n += k != 0 && (kind == 0 || k == kind);
    }
    return n;
}

std::string_view text_of(const TagEntry& e) noexcept {
    return e.layer_text ? std::string_view(*e.layer_text) : std::string_view();
}

// True when module `layer` is `scope` or inside it ("a.b" is inside "a";
// everything is inside "").
bool within(std::string_view layer, std::string_view scope) noexcept {
    if (scope.empty() || layer == scope) return true;
    return layer.size() > scope.size() && layer.substr(0, scope.size()) == scope &&
           layer[scope.size()] == '.';
}

}  // namespace

bool push_tag(const char* layer, const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active()) return false;
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return false;
    push_entry(tag);
    return true;
}

void pop_tag() noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    pop_entry();  // a pop without push is ignored (allocscope.h)
}

int enter_tag(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
              const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    const uint32_t before = keyed_entries();
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return -1;
    tag.kind = kind;
    tag.key = key;
    tag.generation = generation;
    push_entry(tag);
    return static_cast<int>(before);
}

int64_t leave_tag(uint64_t key, uint32_t kind, const char** layer) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    for (uint32_t i = stored_depth(); i-- > 0;) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind != kind || e.key != key) continue;
        const auto generation = static_cast<int64_t>(e.generation & INT64_MAX);
        if (layer) *layer = e.layer_text ? e.layer_text->c_str() : "";
        pop_to(i);
        return generation;
    }
    return -1;
}

void leave_kind(uint32_t kind, uint64_t older_than) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return;
    const uint32_t n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind == kind && e.generation < older_than) {
            pop_to(i);
            return;
        }
    }
}

int enter_nested(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
                 const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    // Entries of this kind from an earlier generation are over.
    uint32_t n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind == kind && e.generation < generation) {
            pop_to(i);
            break;
        }
    }
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return -1;
    tag.kind = kind;
    tag.key = key;
    tag.generation = generation;
    const std::string_view name = text_of(tag);
    // The first entry of this kind that does not enclose `layer` is over,
    // and so is everything above it, but the entries among them that are
    // inside `layer` (entered first through a shared trigger) come back on
    // top of it.
    TagEntry inner[kMaxTagDepth];
    uint32_t inner_count = 0;
    n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind != kind) continue;
        if (e.key == key) return 0;  // entered already
        if (within(name, text_of(e))) continue;
        for (uint32_t j = i; j < n; ++j) {
            const TagEntry& x = t_thread.tags[j];
            if (x.kind == kind && x.layer != tag.layer && within(text_of(x), name))
                inner[inner_count++] = x;
        }
        pop_to(i);
        break;
    }
    push_entry(tag);
    for (uint32_t i = 0; i < inner_count; ++i)
        push_entry(inner[i]);
    return 1;
}

uint32_t keyed_depth(uint32_t kind) noexcept {
    HookGuard guard;
    return guard.recording() ? keyed_entries(kind) : 0;
}

std::string current_layer() {
    ApiScope scope;
    if (!scope.active()) return {};
    return std::string(text_of(current_tag()));
}

void set_step(uint64_t step) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    g->step.store(step, std::memory_order_relaxed);
    EventRing::Slot* slot = begin_event(EventKind::step);
    if (!slot) return;
    slot->event.step = step;
    slot->event.api = Api::c_api;
    EventRing::publish(slot);
}

namespace {

// A new param record (under defs_mutex); the latest index of (layer, name)
// is what allocscope_derived names.
uint32_t add_param_locked(uint32_t layer, uint32_t name, uint32_t dtype, uint64_t numel,
                          uint64_t sharded_numel) {
    ParamRecord p;
    p.index = g->params++;
    p.layer = layer;
    p.name = name;
    p.dtype = dtype;
    p.numel = numel;
    p.sharded_numel = sharded_numel;
    g->pending_defs.push_back({RecordType::param, p.index, {}, {}, p});
    g->param_index[{layer, name}] = p.index;
    return p.index;
}

}  // namespace

void register_param(const char* layer, const char* name, uint64_t numel, const char* dtype,
                    uint64_t sharded_numel) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    uint32_t index = 0;
    try {
        std::lock_guard lock(g->defs_mutex);
        index = add_param_locked(intern_locked(layer), intern_locked(name), intern_locked(dtype),
                                 numel, sharded_numel);
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    emit_simple(EventKind::param, tag.layer, tag.phase, index, 0);
}

void derived(const void* ptr, const char* layer, const char* name, const char* how) noexcept {
    ApiScope scope;
    if (!scope.active() || !ptr || !layer || !*layer) return;
    uint32_t index = 0;
    uint32_t how_id = 0;
    bool registered = false;
    try {
        std::lock_guard lock(g->defs_mutex);
        const uint32_t layer_id = intern_locked(layer);
        const uint32_t name_id = intern_locked(name);
        how_id = intern_locked(how);
        auto it = g->param_index.find({layer_id, name_id});
        registered = it == g->param_index.end();
        // Never registered: registered here without sizes, so the
        // declaration still names its parameter.
        index = registered ? add_param_locked(layer_id, name_id, 0, 0, 0) : it->second;
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    if (registered) emit_simple(EventKind::param, tag.layer, tag.phase, index, 0);
    EventRing::Slot* slot = begin_event(EventKind::derived);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = tag.layer;
    e.phase = tag.phase;
    e.aux = index;
    e.stream = how_id;
    e.address = reinterpret_cast<uint64_t>(ptr);
    e.api = Api::c_api;
    EventRing::publish(slot);
}

void mark(const char* text) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    uint32_t id = 0;
    try {
        id = intern(text);
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    emit_simple(EventKind::mark, tag.layer, tag.phase, id, 0);
}

void set_outer_frames(OuterFrames provider) noexcept {
    g_outer_frames.store(provider, std::memory_order_release);
}

// Also inside a hook: the outer-frames provider names frames from there.
// Interning makes no CUDA call, so nothing here needs the hooks' guard.
uint64_t python_frame(const char* function, const char* file, int line) noexcept {
    if (!file || !ensure_started()) return 0;
    try {
        const uint32_t id = intern(python_frame_text(function ? function : "", file, line).c_str());
        return id ? python_frame_address(id) : 0;
    } catch (...) {
        return 0;
    }
}

std::string current_phase() {
    ApiScope scope;
    if (!scope.active()) return {};
    const uint32_t phase = current_tag().phase;
    if (phase == 0) return {};
    std::lock_guard lock(g->defs_mutex);
    return g->strings.at(phase);
}

uint64_t check_begin(const char* plugins, const char* options, std::string& error) noexcept {
    try {
        ApiScope scope;
        if (!scope.active()) {
            error =
                "allocscope is not recording in this process (disabled, no output, or a "
                "forked child: see its earlier message)";
            return 0;
        }
        CheckSet::Settings settings;
        settings.rank = g->config.rank;
        settings.world_size = g->config.world_size > 0 ? g->config.world_size : 0;
        settings.plugin_dir = plugin_dir();
        return g->checks.begin(plugins ? plugins : "", options ? options : "", settings, error);
    } catch (const std::exception& e) {
        error = std::string("cannot start the check: ") + e.what();
    } catch (...) {
        error = "cannot start the check";
    }
    return 0;
}

bool check_end(uint64_t id, CheckSet::Outcome& out) noexcept {
    try {
        ApiScope scope;
        if (!scope.active()) {
            out.error = "allocscope is not recording in this process";
            return false;
        }
        // Every event this thread recorded so far lies before the end.
        return g->checks.end(id, g->ring.reserved(), out);
    } catch (const std::exception& e) {
        out.error = std::string("cannot end the check: ") + e.what();
    } catch (...) {
        out.error = "cannot end the check";
    }
    return false;
}

// cudaGetDevice costs over a microsecond in the real runtime (measured on
// the H200 host, docs/PERFORMANCE.md), so the device is cached per thread, keyed
// by the driver's current context: the runtime's current device is the
// device of the current context, and a context never changes device.
int32_t current_device() noexcept {
    using GetDevice = cudaError_t (*)(int*);
    using GetContext = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)
    // Looked up like the hooks' own real functions, and again until found: a
    // runtime loaded after the first driver-level allocation still counts.
    static std::atomic<GetDevice> device_cache{nullptr};
    static std::atomic<GetContext> context_cache{nullptr};
    const GetDevice get_device = cached_function(device_cache, &resolve_real, "cudaGetDevice");
    if (!get_device) return -1;
    const GetContext get_context =
        cached_function(context_cache, &resolve_driver, "cuCtxGetCurrent");
    void* context = nullptr;
    if (get_context && get_context(&context) == 0 && context &&
        context == t_thread.device_context) {
        return t_thread.device;
    }
    int device = -1;
    if (get_device(&device) != cudaSuccess) return -1;
    if (context) {
        t_thread.device_context = context;
        t_thread.device = device;
    }
    return device;
}

}  // namespace allocscope::recorder
