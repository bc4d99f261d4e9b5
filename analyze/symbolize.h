// Symbolization of recorded stacks, offline: the addresses of a trace's
// stack table are resolved against the modules the traced process had
// loaded (its module records: load bias, size, build id, path), using the
// module files on this machine. Each unique address is resolved once and
// cached; everything runs on the calling thread.
//
// A module whose file is missing, unreadable or has another build id than
// the recorded one gets one warning (through `warn`) and its frames stay
// raw: "module+0xoffset". An address outside every module is raw as
// "0xaddress".
//
// Module files are read with libbacktrace (file:line, inlined calls folded
// into the function they were inlined in), else from their ELF symbol tables
// (function names only); they are mapped read-only, never loaded. A file is
// opened once per process and shared by all Symbolizers (a report of several
// ranks); one Symbolizer is used from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trace_format.h"

namespace allocscope {

struct SymbolizedFrame {
    uint64_t address = 0;  // as recorded, in the traced process
    std::string module;    // path of the module holding it, "" when none
    uint64_t offset = 0;   // address - the module's load bias
    std::string function;  // demangled; "" when unknown
    std::string file;      // source file; "" when unknown
    uint32_t line = 0;     // 0 when unknown

    bool resolved() const noexcept { return !function.empty(); }
    // "function (file:line)", "function", "module+0xoffset" or "0xaddress".
    std::string text() const;
};

class Symbolizer {
  public:
    using Warn = std::function<void(const std::string&)>;
    Symbolizer(std::vector<ModuleRecord> modules, Warn warn);
    ~Symbolizer();
    Symbolizer(const Symbolizer&) = delete;
    Symbolizer& operator=(const Symbolizer&) = delete;

    // The trace's string table, which names its Python frames (core/event.h,
    // is_python_frame); it must outlive the Symbolizer. Without it a Python
    // frame prints as "python+0x...".
    void use_strings(const std::vector<std::string>& strings);

    // The frame at `address` (resolved on first use, then cached). The
    // reference stays valid for the Symbolizer's life. Recorded addresses
    // are return addresses: the location given is the call's (address - 1).
    const SymbolizedFrame& frame(uint64_t address);
    // A recorded stack, innermost frame first (the trace's order).
    std::vector<const SymbolizedFrame*> stack(std::span<const uint64_t> frames);
    // Resolves these addresses now (e.g. every address of the stacks a
    // report will print, to show progress); `progress(done, total)` is
    // called as it goes when given.
    void resolve(std::span<const uint64_t> addresses,
                 const std::function<void(size_t, size_t)>& progress = {});
    // Unique addresses resolved so far.
    size_t resolved_count() const noexcept;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace allocscope
