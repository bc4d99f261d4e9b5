// Report cost on big traces: writes RANKS synthetic training-loop traces of
// EVENTS events each (default 1 rank of 1 M events; 8 layers, forward /
// backward / optimizer tags, block and segment allocations) whose 200
// allocation sites have 10-frame stacks of distinct addresses in this
// executable (2,000 unique addresses, symbolized from its own file), then
// runs `allocscope report` on them (the trace, or the directory of ranks) in
// each of FORMATS (default text,html,json) with `--top 200` so every address
// is symbolized. Prints the trace's size per event and, per format, the
// median over the runs of the wall time, the CPU time and the peak resident
// set of the command.
//
//   report_bench CLI WORKDIR [EVENTS [REPETITIONS [RANKS [FORMATS]]]]
#include <link.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "elf_note.h"
#include "trace_writer.h"

using namespace allocscope;

namespace {

struct Self {
    ModuleRecord module;
    uint64_t text_lo = 0, text_hi = 0;
};

Self find_self() {
    Self self;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* arg) -> int {
            auto* s = static_cast<Self*>(arg);
            uint64_t hi = 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& ph = info->dlpi_phdr[i];
                if (ph.p_type != PT_LOAD) continue;
                hi = std::max<uint64_t>(hi, ph.p_vaddr + ph.p_memsz);
                if (ph.p_flags & PF_X) {
                    s->text_lo = info->dlpi_addr + ph.p_vaddr;
                    s->text_hi = s->text_lo + ph.p_memsz;
                }
            }
            s->module.base = info->dlpi_addr;
            s->module.build_id = loaded_build_id(info);
            s->module.size = hi;
            return 1;  // the executable comes first
        },
        &self);
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    self.module.path = n > 0 ? std::string(buf, size_t(n)) : "";
    return self;
}

void write_trace(const std::string& path, uint64_t events, int32_t rank, int32_t ranks,
                 const Self& self) {
    TraceWriter w;
    TraceHeader h;
    h.tool_version = "bench";
    h.pid = uint32_t(1 + rank);
    h.rank = rank;
    h.world_size = ranks;
    h.stack_depth = 10;
    std::string error;
    if (!w.open(path, h, error)) {
        std::fprintf(stderr, "report_bench: %s\n", error.c_str());
        std::exit(1);
    }
    w.module(self.module);
    // Strings: 8 layers and 3 phases.
    uint32_t id = 1;
    std::vector<uint32_t> layers, phases;
    for (int l = 0; l < 8; ++l) {
        w.string(id, "layers." + std::to_string(l));
        layers.push_back(id++);
    }
    for (const char* p : {"forward", "backward", "optimizer"}) {
        w.string(id, p);
        phases.push_back(id++);
    }
    // 200 stacks of 10 distinct addresses spread over the text segment.
    const uint64_t span = self.text_hi - self.text_lo;
    for (uint32_t s = 1; s <= 200; ++s) {
        std::vector<uint64_t> frames;
        for (uint64_t f = 0; f < 10; ++f)
            frames.push_back(self.text_lo + (span * ((s - 1) * 10 + f)) / 2000 + 1);
        w.stack(s, frames);
    }
    uint64_t seq = 0, t = 0, step = 0;
    Event e;
    auto emit = [&](EventKind kind, uint32_t layer, uint32_t phase) {
        e = Event{};
        e.seq = ++seq;
        t += 700 + (seq * 7919) % 900;
        e.t_ns = t;
        e.step = step;
        e.kind = kind;
        e.tid = 100;
        e.layer = layer;
        e.phase = phase;
    };
    std::vector<uint64_t> saved;  // activations kept for backward
    uint64_t next_address = 0x7f0000000000;
    while (seq + 200 < events) {
        emit(EventKind::step, 0, 0);
        e.step = ++step;
        w.event(e);
        for (int l = 0; l < 8 && seq + 50 < events; ++l) {  // forward
            emit(EventKind::tag_push, layers[l], phases[0]);
            w.event(e);
            for (int k = 0; k < 12; ++k) {
                emit(EventKind::alloc, layers[l], phases[0]);
                e.level = Level::block;
                e.memory = MemoryKind::device;
                e.api = Api::block_alloc;
                e.address = next_address += 0x10000;
                e.size = 512 * uint64_t(1 + (seq * 31) % 2048);
                e.stack = uint32_t(1 + (seq * 13) % 200);
                w.event(e);
                if (k % 3 == 0) {
                    saved.push_back(e.address);
                } else {
                    const uint64_t address = e.address;
                    emit(EventKind::free, layers[l], phases[0]);
                    e.level = Level::block;
                    e.api = Api::block_free;
                    e.address = address;
                    w.event(e);
                }
            }
            emit(EventKind::tag_pop, layers[l], phases[0]);
            w.event(e);
        }
        for (int l = 7; l >= 0; --l) {  // backward frees what forward saved
            emit(EventKind::tag_push, layers[l], phases[1]);
            w.event(e);
            for (int k = 0; k < 4 && !saved.empty(); ++k) {
                const uint64_t address = saved.back();
                saved.pop_back();
                emit(EventKind::free, layers[l], phases[1]);
                e.level = Level::block;
                e.api = Api::block_free;
                e.address = address;
                w.event(e);
            }
            emit(EventKind::tag_pop, layers[l], phases[1]);
            w.event(e);
        }
    }
    FooterRecord footer;
    footer.events = seq;
    footer.end_mono_ns = t;
    w.close(footer);
}

struct Cost {
    double seconds = 0;
    double cpu_seconds = 0;  // user + system
    double peak_mb = 0;      // the largest resident set, MB (10^6 bytes)
};

// Runs `command` through sh; what it cost, from wait4's resource usage (the
// shell's and its children's).
Cost run(const std::string& command) {
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    rusage usage{};
    if (pid < 0 || wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "report_bench: '%s' failed\n", command.c_str());
        std::exit(1);
    }
    Cost c;
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto seconds = [](const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) / 1e6; };
    c.cpu_seconds = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    c.peak_mb = double(usage.ru_maxrss) * 1024 / 1e6;
    return c;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr,
                     "usage: report_bench CLI WORKDIR [EVENTS [REPETITIONS [RANKS [FORMATS]]]]\n");
        return 2;
    }
    const std::string cli = argv[1], dir = argv[2];
    const uint64_t events = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1000000;
    const int reps = argc > 4 ? std::max(1, std::atoi(argv[4])) : 3;
    const int32_t ranks = argc > 5 ? std::max(1, std::atoi(argv[5])) : 1;
    std::string formats = argc > 6 ? argv[6] : "text,html,json";
    const Self self = find_self();
    uint64_t bytes = 0;
    for (int32_t r = 0; r < ranks; ++r) {
        const std::string trace = dir + "/rank" + std::to_string(r) + ".trace";
        ::unlink(trace.c_str());
        write_trace(trace, events, r, ranks, self);
        struct stat st {};
        stat(trace.c_str(), &st);
        bytes += uint64_t(st.st_size);
    }
    std::printf("%d trace%s of %llu events, %llu bytes, %.2f bytes/event\n", ranks,
                ranks > 1 ? "s" : "", static_cast<unsigned long long>(events),
                static_cast<unsigned long long>(bytes), double(bytes) / double(events * ranks));
    const std::string input = ranks > 1 ? dir : dir + "/rank0.trace";
    formats += ',';
    for (size_t at = 0, comma; (comma = formats.find(',', at)) != std::string::npos;
         at = comma + 1) {
        const std::string format = formats.substr(at, comma - at);
        if (format.empty()) continue;
        std::vector<double> wall, cpu, peak;
        for (int r = 0; r < reps; ++r) {
            const Cost c = run(cli + " report " + input + " --top 200 --format " + format + " -o " +
                               dir + "/report." + format + " 2>/dev/null");
            wall.push_back(c.seconds);
            cpu.push_back(c.cpu_seconds);
            peak.push_back(c.peak_mb);
        }
        std::printf(
            "report --format %-5s --top 200: %.3f s, %.3f s CPU, %.1f MB peak RSS "
            "(median of %d)\n",
            format.c_str(), median(wall), median(cpu), median(peak), reps);
    }
    return 0;
}
