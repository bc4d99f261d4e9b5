// Report cost on a big trace: writes a synthetic 1 M-event training-loop
// trace (8 layers, forward / backward / optimizer tags, block and segment
// allocations) whose 200 allocation sites have 10-frame stacks of distinct
// addresses in this executable (2,000 unique addresses, symbolized from its
// own file), then times `allocscope report` on it, text and HTML, with
// `--top 200` so every address is symbolized. Prints the trace's size per
// event and the median of the runs.
//
//   report_bench CLI WORKDIR [EVENTS [REPETITIONS]]
#include <link.h>
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

void write_trace(const std::string& path, uint64_t events, const Self& self) {
    TraceWriter w;
    TraceHeader h;
    h.tool_version = "bench";
    h.pid = 1;
    h.rank = 0;
    h.world_size = 1;
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

double run_seconds(const std::string& command) {
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = std::system(command.c_str());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0) {
        std::fprintf(stderr, "report_bench: '%s' failed\n", command.c_str());
        std::exit(1);
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: report_bench CLI WORKDIR [EVENTS [REPETITIONS]]\n");
        return 2;
    }
    const std::string cli = argv[1], dir = argv[2];
    const uint64_t events = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1000000;
    const int reps = argc > 4 ? std::max(1, std::atoi(argv[4])) : 3;
    const std::string trace = dir + "/rank0.trace";
    ::unlink(trace.c_str());
    write_trace(trace, events, find_self());
    struct stat st {};
    stat(trace.c_str(), &st);
    std::printf("trace: %llu events, %lld bytes, %.2f bytes/event\n",
                static_cast<unsigned long long>(events), static_cast<long long>(st.st_size),
                double(st.st_size) / double(events));
    for (const char* format : {"text", "html", "json"}) {
        std::vector<double> s;
        for (int r = 0; r < reps; ++r) {
            s.push_back(run_seconds(cli + " report " + trace + " --top 200 --format " + format +
                                    " -o " + dir + "/report." + format + " 2>/dev/null"));
        }
        std::sort(s.begin(), s.end());
        std::printf("report --format %-5s --top 200: %.3f s (median of %d)\n", format,
                    s[s.size() / 2], reps);
    }
    return 0;
}
