#include <dlfcn.h>
#include <doctest/doctest.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "elf_note.h"
#include "symbolize.h"

#if TEST_BOOST_STACKTRACE
#include <boost/stacktrace.hpp>
#endif

using namespace allocscope;

namespace symbolize_test_subject {

volatile int g_calls = 0;

[[gnu::noinline, gnu::noclone]] uint64_t caller_return_address() {
    return reinterpret_cast<uint64_t>(__builtin_return_address(0));
}

// A return address inside known_function, as a recorded stack has it.
constexpr int kKnownFirstLine = __LINE__;
[[gnu::noinline, gnu::noclone]] uint64_t known_function() {
    uint64_t here = caller_return_address();
    g_calls = g_calls + 1;  // not a tail call: the return address stays in here
    return here;
}
constexpr int kKnownLastLine = __LINE__;

}  // namespace symbolize_test_subject

namespace {

using symbolize_test_subject::known_function;

std::vector<ModuleRecord> current_modules() {
    std::vector<ModuleRecord> modules;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            uint64_t hi = 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& ph = info->dlpi_phdr[i];
                if (ph.p_type == PT_LOAD) hi = std::max<uint64_t>(hi, ph.p_vaddr + ph.p_memsz);
            }
            if (hi == 0) return 0;
            ModuleRecord r;
            r.base = info->dlpi_addr;
            r.size = hi;
            r.path = info->dlpi_name ? info->dlpi_name : "";
            r.build_id = loaded_build_id(info);
            if (r.path.empty()) r.path = std::filesystem::read_symlink("/proc/self/exe").string();
            static_cast<std::vector<ModuleRecord>*>(out)->push_back(r);
            return 0;
        },
        &modules);
    return modules;
}

ModuleRecord module_holding(const std::vector<ModuleRecord>& modules, uint64_t address) {
    for (const ModuleRecord& m : modules) {
        if (address >= m.base && address - m.base < m.size) return m;
    }
    FAIL("no module holds " << address);
    return {};
}

std::string hex(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
    return buf;
}

struct Warnings {
    std::vector<std::string> seen;
    Symbolizer::Warn callback() {
        return [this](const std::string& w) { seen.push_back(w); };
    }
};

uint64_t exported_function(const char* library, const char* name) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(handle != nullptr);
    void* symbol = dlsym(handle, name);
    dlclose(handle);
    REQUIRE(symbol != nullptr);
    return reinterpret_cast<uint64_t>(symbol);
}

}  // namespace

TEST_CASE("a return address in the program resolves to its function, source file and line") {
    const std::vector<ModuleRecord> modules = current_modules();
    const uint64_t address = known_function();
    const ModuleRecord self = module_holding(modules, address);
    Warnings warnings;
    Symbolizer symbolizer(modules, warnings.callback());

    const SymbolizedFrame& f = symbolizer.frame(address);
    CHECK(f.address == address);
    CHECK(f.module == self.path);
    CHECK(f.offset == address - self.base);
    CHECK(f.resolved());
    CHECK(f.function.find("symbolize_test_subject::known_function()") != std::string::npos);
#if TEST_SOURCE_LINES
    CHECK(f.file.ends_with("tests/symbolize_test.cpp"));
    CHECK(f.line > symbolize_test_subject::kKnownFirstLine);
    CHECK(f.line < symbolize_test_subject::kKnownLastLine);
    CHECK(f.text() == f.function + " (" + f.file + ":" + std::to_string(f.line) + ")");
#else
    // Built without libbacktrace: names from the ELF symbol table only.
    CHECK(f.file.empty());
    CHECK(f.text() == f.function);
#endif
    CHECK(warnings.seen.empty());

    // A few bytes into the function: the same function.
    const uint64_t entry = reinterpret_cast<uint64_t>(&known_function);
    CHECK(symbolizer.frame(entry + 4).function == f.function);

#if TEST_BOOST_STACKTRACE
    // Offline from the file, as Boost.Stacktrace finds it in this process
    // (at the call instruction, as the symbolizer looks return addresses up).
    boost::stacktrace::frame live(reinterpret_cast<const void*>(address - 1));
    CHECK(live.name() == f.function);
    CHECK(std::filesystem::path(live.source_file()).lexically_normal().string() == f.file);
    CHECK(live.source_line() == f.line);
#endif
}

TEST_CASE("a module file with another build id gives one warning and module+offset frames") {
    const uint64_t address = known_function();
    ModuleRecord self = module_holding(current_modules(), address);
    REQUIRE(!self.build_id.empty());
    self.build_id[0] = static_cast<char>(self.build_id[0] ^ 0x5a);
    ModuleRecord reloaded = self;  // the same file loaded again elsewhere
    reloaded.base += uint64_t{1} << 40;
    Warnings warnings;
    Symbolizer symbolizer({self, reloaded}, warnings.callback());

    std::vector<uint64_t> addresses = {address, address + 1, self.base + 0x10, address,
                                       reloaded.base + 0x20};
    symbolizer.resolve(addresses);
    for (uint64_t a : addresses) {
        const SymbolizedFrame& f = symbolizer.frame(a);
        const uint64_t offset = a - (a >= reloaded.base ? reloaded.base : self.base);
        CHECK_FALSE(f.resolved());
        CHECK(f.module == self.path);
        CHECK(f.offset == offset);
        CHECK(f.file.empty());
        CHECK(f.line == 0);
        CHECK(f.text() == self.path + "+" + hex(offset));
    }
    REQUIRE(warnings.seen.size() == 1);
    CHECK(warnings.seen[0].find(self.path) != std::string::npos);
    CHECK(warnings.seen[0].find("build id") != std::string::npos);
}

TEST_CASE("a missing module file gives one warning; an address in no module stays 0x...") {
    ModuleRecord gone{0x10000000, 0x200000, "\x01\x02\x03\x04", "/nonexistent/libgone.so"};
    Warnings warnings;
    Symbolizer symbolizer({gone}, warnings.callback());

    CHECK(symbolizer.frame(0x10000010).text() == "/nonexistent/libgone.so+0x10");
    CHECK(symbolizer.frame(0x101fffff).text() == "/nonexistent/libgone.so+0x1fffff");
    CHECK_FALSE(symbolizer.frame(0x10000010).resolved());
    REQUIRE(warnings.seen.size() == 1);
    CHECK(warnings.seen[0].find("/nonexistent/libgone.so") != std::string::npos);

    for (uint64_t outside : {uint64_t{0x5000}, uint64_t{0x10200000}}) {
        const SymbolizedFrame& f = symbolizer.frame(outside);
        CHECK(f.module.empty());
        CHECK(f.offset == 0);
        CHECK_FALSE(f.resolved());
        CHECK(f.text() == hex(outside));
    }
    CHECK(warnings.seen.size() == 1);
}

TEST_CASE("an address belongs to the module with the nearest load bias below it") {
    ModuleRecord outer{0x1000000, 0x100000, "a", "/nonexistent/outer.so"};
    ModuleRecord inner{0x1040000, 0x1000, "b", "/nonexistent/inner.so"};
    Symbolizer symbolizer({outer, inner}, {});

    CHECK(symbolizer.frame(0x1040010).text() == "/nonexistent/inner.so+0x10");
    CHECK(symbolizer.frame(0x1041000).text() == "/nonexistent/outer.so+0x41000");
    CHECK(symbolizer.frame(0x1000000).text() == "/nonexistent/outer.so+0x0");
}

TEST_CASE("each unique address is resolved once and a stack keeps the recorded order") {
    const std::vector<ModuleRecord> modules = current_modules();
    const uint64_t a = known_function();
    const uint64_t b = exported_function("libc.so.6", "free") + 4;
    const uint64_t c = 0x42;  // in no module
    Symbolizer symbolizer(modules, {});

    std::vector<std::pair<size_t, size_t>> progress;
    auto record = [&progress](size_t done, size_t total) { progress.emplace_back(done, total); };
    std::vector<uint64_t> first = {a, b, a, c, b};
    symbolizer.resolve(first, record);
    CHECK(symbolizer.resolved_count() == 3);
    REQUIRE(!progress.empty());
    CHECK(progress.back() == std::pair<size_t, size_t>(3, 3));

    const SymbolizedFrame* frame_a = &symbolizer.frame(a);
    progress.clear();
    symbolizer.resolve(first, record);
    CHECK(symbolizer.resolved_count() == 3);
    CHECK(progress.back() == std::pair<size_t, size_t>(0, 0));

    std::vector<uint64_t> recorded = {c, a, c, b};
    std::vector<const SymbolizedFrame*> stack = symbolizer.stack(recorded);
    REQUIRE(stack.size() == 4);
    for (size_t i = 0; i < stack.size(); ++i)
        CHECK(stack[i]->address == recorded[i]);
    CHECK(stack[1] == frame_a);
    CHECK(stack[0] == stack[2]);
    CHECK(symbolizer.resolved_count() == 3);
}

TEST_CASE("frames in shared libraries resolve at least to their function names") {
    const std::vector<ModuleRecord> modules = current_modules();
    const uint64_t in_malloc = exported_function("libc.so.6", "malloc") + 4;
    // libstdc++'s, a sanitizer's, or the program's own where libstdc++ is linked statically.
    void* (*new_function)(std::size_t) = &::operator new;
    const uint64_t in_new = reinterpret_cast<uint64_t>(new_function) + 4;
    Warnings warnings;
    Symbolizer symbolizer(modules, warnings.callback());

    const SymbolizedFrame& m = symbolizer.frame(in_malloc);
    CHECK(m.module == module_holding(modules, in_malloc).path);
    CHECK(m.function.find("malloc") != std::string::npos);

    const SymbolizedFrame& n = symbolizer.frame(in_new);
    CHECK(n.module == module_holding(modules, in_new).path);
    CHECK(n.function.find("operator new") != std::string::npos);
    CHECK(warnings.seen.empty());
}
