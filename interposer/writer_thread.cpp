// The writer thread: it drains the event ring into the trace file, with the
// definitions (strings, stacks, params) and modules the events use, keeps
// the live allocations, feeds the live plugins and the checks, and at exit
// writes the footer. Also opening the trace file and starting the thread.
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "recorder_internal.h"
#include "unwind.h"
#include "unwind_cfi.h"

#ifndef ALLOCSCOPE_VERSION
#define ALLOCSCOPE_VERSION "0.0.0"
#endif

namespace allocscope::recorder {

namespace {

constexpr size_t kWriterBatch = 4096;

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
// through the same Replay the tools use (Replay::apply_written): an alloc
// enters its pool's table; a free takes its record out and gets the record's
// size, device and memory kind, or is flagged as freeing an address never
// seen or already freed. A free the runtime refused leaves the record in. A
// cuMemUnmap is one event for its whole range (kFlagRange), which the replay
// splits into the frees of the mappings it covers; the trace keeps the one
// event and every reader splits it the same way. The hooks touch no table:
// no lock, no hash lookup on the program's threads. An alloc whose event
// was dropped (the writer stalled) is not in the table; its free is then
// flagged unknown.
//
// The changes go to the bounded trace (bound_live_change) and, while the
// live plugins run, into g->live_changes for their host, which is a view of
// this Replay (no second table: core/plugin_host.h). Returns false when out
// of memory lost an alloc or a change (the plugins' view would be wrong).
bool track_live(Event& e) noexcept {
    g->live_changes.clear();
    if (e.kind != EventKind::alloc && e.kind != EventKind::free) return true;
    bool complete = true;
    try {
        g->live.apply_written(e, [&complete](const LiveChange& c) noexcept {
            bound_live_change(c);
            if (!g->plugins || !complete) return;
            try {
                g->live_changes.push_back(c);
            } catch (...) {
                complete = false;  // the replay goes on: the trace's fill-in stays right
            }
        });
    } catch (...) {
        // Out of host memory growing a table: the event is still
        // recorded; an alloc's free will carry no size.
        return false;
    }
    return complete;
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
    // One event at a time: a checkpoint (bound_event) sees the live set of
    // the events before it, and the live plugins, a view of g->live, see it
    // with their event applied (before_live_plugins: what they get before).
    for (Event& e : batch) {
        before_live_plugins(e);
        const bool tracked = track_live(e);
        bound_event(e);
        g->writer.event(e);
        bound_written(e);
        feed_plugins(e, tracked);
    }
    // The checks' hosts own their tables (interposer/checks.h).
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

// ALLOCSCOPE_LOG=debug: "; N us a step over S steps" for a cost of `ns`,
// "" before the first step.
std::string per_step_text(uint64_t ns) {
    const uint64_t steps = g->step.load(std::memory_order_relaxed);
    if (steps == 0) return "";
    return "; " + std::to_string(ns / steps / 1000) + " us a step over " + std::to_string(steps) +
           " steps";
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
           walk_cycles_text(walks) + per_step_text(ns);
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
    {
        LoaderGuard loader;  // fork waits for the scan and the plugins' dlopen
        scan_modules();
        start_plugins();
    }
    bound_start();
    long sleep_us = 1000;
    for (;;) {
        uint64_t n = drain_once(batch);
        g->checks.service(g->ring.consumed(), {g->written_strings, g->written_params});
        g->writer.flush();
        bound_after_flush();
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
        std::string bounded;
        if (g->bound.dropped_events > 0) {
            bounded = "; " + std::to_string(g->bound.dropped_events) +
                      " events of the middle steps dropped to stay within " +
                      std::to_string(g->config.max_trace_bytes) + " bytes";
        }
        log_line(LogLevel::info, "allocscope: wrote " + g->writer.path() + " (" +
                                     std::to_string(footer.events) + " events" + bounded + ")");
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

}  // namespace

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
    header.host = c.host;
    // The first name is rank<R>.trace / pid<PID>.trace. It can exist already:
    // a launcher that execs keeps its pid, and several processes may share a
    // rank. Then the pid and a counter make the name unique.
    const std::string first = trace_file_name(c, pid);
    const std::string stem(trace_stem(first));
    const std::string pid_stem = c.rank >= 0 ? stem + ".pid" + std::to_string(pid) : stem;
    const std::string ext(kTraceExtension);
    for (int attempt = 0; attempt < 100; ++attempt) {
        std::string name = attempt == 0 ? first
                           : attempt == 1 && c.rank >= 0
                               ? pid_stem + ext
                               : pid_stem + "." + std::to_string(attempt) + ext;
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

}  // namespace allocscope::recorder
