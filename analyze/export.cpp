// The exports' shared parts: the writer and stack frames. The formats are in
// export_perfetto.cpp, export_collapsed.cpp and export_memory_viz.cpp.
#include "export.h"

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <stdexcept>

#include "symbolize.h"

namespace allocscope {

ExportWriter::ExportWriter(std::FILE* file, std::string name)
    : file_(file), name_(std::move(name)) {
    if (file_) buffer_.reserve(kChunk + (kChunk >> 2));
}

void ExportWriter::drain() {
    if (!file_ || buffer_.empty()) return;
    if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
        const int err = errno;
        throw std::runtime_error("cannot write " + name_ + ": " + std::strerror(err ? err : EIO));
    }
    written_ += buffer_.size();
    buffer_.clear();
}

void ExportWriter::flush() {
    drain();
    if (file_ && std::fflush(file_) != 0) {
        const int err = errno;
        throw std::runtime_error("cannot write " + name_ + ": " + std::strerror(err ? err : EIO));
    }
}

StackFrames symbolize_stacks(const TraceTables& trace, Symbolizer& symbolizer,
                             std::span<const uint32_t> ids, const ExportProgress& progress) {
    StackFrames out(trace.stacks.size());
    std::vector<uint64_t> addresses;
    for (uint32_t id : ids) {
        if (id != 0 && id < trace.stacks.size())
            addresses.insert(addresses.end(), trace.stacks[id].begin(), trace.stacks[id].end());
    }
    symbolizer.resolve(addresses, progress ? progress : std::function<void(size_t, size_t)>{});
    for (uint32_t id : ids) {
        if (id == 0 || id >= trace.stacks.size() || !out[id].empty()) continue;
        for (const SymbolizedFrame* f : symbolizer.stack(trace.stacks[id])) {
            ExportFrame e;
            e.text = f->text();
            e.name = f->resolved() ? f->function : e.text;
            e.file = !f->file.empty() ? f->file : f->module;
            e.line = f->line;
            out[id].push_back(std::move(e));
        }
    }
    return out;
}

StackFrames raw_stacks(const TraceTables& trace, std::span<const uint32_t> ids) {
    StackFrames out(trace.stacks.size());
    for (uint32_t id : ids) {
        if (id == 0 || id >= trace.stacks.size() || !out[id].empty()) continue;
        for (uint64_t address : trace.stacks[id]) {
            char hex[32];
            std::snprintf(hex, sizeof hex, "0x%" PRIx64, address);
            ExportFrame e;
            e.name = e.text = hex;
            out[id].push_back(std::move(e));
        }
    }
    return out;
}

}  // namespace allocscope
