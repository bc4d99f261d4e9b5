// The module map: the objects loaded in the process (base, size, path,
// build id), written into the trace by the writer thread so a reader can
// symbolize the stacks, and the text of liballocscope.so itself, whose
// frames stack capture drops.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "elf_note.h"
#include "recorder_internal.h"

namespace allocscope::recorder {

namespace {

std::string self_exe_path() {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

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
            LoaderGuard loader;
            scan_modules();  // a library was loaded since the last scan
            return;
        }
    }
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

}  // namespace allocscope::recorder
