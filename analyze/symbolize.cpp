#include "symbolize.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/core/demangle.hpp>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "elf_note.h"
#include "event.h"

#if ALLOCSCOPE_HAVE_LIBBACKTRACE
#include <backtrace.h>
#endif

#if ALLOCSCOPE_HAVE_LIBBACKTRACE
namespace {
// While set, libbacktrace initializes a state: it sees one module, the file it
// was given, at load bias 0 (see dl_iterate_phdr below).
thread_local bool t_module_file_only = false;
thread_local unsigned t_module_file_walks = 0;
}  // namespace

// libbacktrace (GCC's static libbacktrace.a) reads the file given to
// backtrace_create_state and then every module of the *current* process
// through dl_iterate_phdr: a PIE or shared library file is placed at this
// process's executable load bias, and libc, libstdc++... are parsed again
// for each state (150 ms each with libc6-dbg installed). This definition is
// hidden, so it binds only this executable's own references (libbacktrace.a's
// among them), never those of shared libraries (libgcc_s, sanitizers), and
// behaves as the real one except while a state is being initialized.
using PhdrCallback = int (*)(dl_phdr_info*, size_t, void*);
extern "C" __attribute__((visibility("hidden"))) int dl_iterate_phdr(PhdrCallback callback,
                                                                     void* data) {
    if (t_module_file_only) {
        ++t_module_file_walks;
        dl_phdr_info info{};
        info.dlpi_addr = 0;
        info.dlpi_name = "";  // libbacktrace's marker for "the executable it was given"
        return callback(&info, sizeof info, data);
    }
    using Walk = int (*)(PhdrCallback, void*);
    static const Walk real = reinterpret_cast<Walk>(dlsym(RTLD_NEXT, "dl_iterate_phdr"));
    return real ? real(callback, data) : 0;
}
#endif

namespace allocscope {

namespace {

std::string hex_bytes(std::string_view bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : bytes) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out.empty() ? "none" : out;
}

std::string demangle(std::string_view symbol) {
    // Versioned names from .symtab ("memcpy@@GLIBC_2.14") demangle without the version.
    std::string name(symbol.substr(0, symbol.find('@')));
    return boost::core::demangle(name.c_str());
}

// An ELF file mapped read-only: parsed, never loaded or executed. Every read
// is bounds-checked; the file may be truncated or not ELF at all.
class ElfFile {
  public:
    ElfFile() = default;
    ElfFile(const ElfFile&) = delete;
    ElfFile& operator=(const ElfFile&) = delete;
    ~ElfFile() {
        if (data_) munmap(const_cast<uint8_t*>(data_), size_);
    }

    // "" when mapped and parsed, else why not.
    std::string open(const std::string& path, const struct stat& st) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return std::strerror(errno);
        size_ = static_cast<size_t>(st.st_size);
        void* mem = size_ ? mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        int saved = errno;
        ::close(fd);
        if (mem == MAP_FAILED) return size_ ? std::strerror(saved) : "empty file";
        data_ = static_cast<const uint8_t*>(mem);
        if (size_ < sizeof(Elf64_Ehdr) || std::memcmp(data_, ELFMAG, SELFMAG) != 0)
            return "not an ELF file";
        if (data_[EI_CLASS] != ELFCLASS64 || data_[EI_DATA] != ELFDATA2LSB)
            return "not a 64-bit little-endian ELF file";
        std::memcpy(&ehdr_, data_, sizeof ehdr_);
        read_sections();
        build_id_ = find_build_id();
        return {};
    }

    bool position_independent() const noexcept { return ehdr_.e_type == ET_DYN; }
    const std::string& build_id() const noexcept { return build_id_; }

    // The name of the function symbol (.symtab, else .dynsym) holding the
    // file address `pc`; empty when none does.
    std::string_view function_at(uint64_t pc) {
        if (!symbols_read_) read_symbols();
        auto it = std::upper_bound(symbols_.begin(), symbols_.end(), pc,
                                   [](uint64_t a, const Symbol& s) { return a < s.value; });
        const Symbol* best = nullptr;
        // Aliases share an address (malloc, __libc_malloc): keep the best
        // ranked; bounded, as a pc in no function would scan the whole table.
        for (int scanned = 0; it != symbols_.begin() && scanned < 64; ++scanned) {
            --it;
            if (best && it->value != best->value) break;
            if (pc < it->value + std::max<uint64_t>(it->size, 1) &&
                (!best || it->rank <= best->rank))
                best = &*it;
        }
        return best ? best->name : std::string_view();
    }

  private:
    struct Symbol {
        uint64_t value;
        uint64_t size;
        std::string_view name;
        int rank;  // lower is the better name among aliases
    };

    template <class T>
    bool read(uint64_t offset, T& out) const {
        if (offset > size_ || size_ - offset < sizeof(T)) return false;
        std::memcpy(&out, data_ + offset, sizeof(T));
        return true;
    }
    bool in_file(uint64_t offset, uint64_t length) const {
        return offset <= size_ && size_ - offset >= length;
    }

    void read_sections() {
        if (ehdr_.e_shoff == 0 || ehdr_.e_shentsize != sizeof(Elf64_Shdr)) return;
        uint64_t count = ehdr_.e_shnum;
        Elf64_Shdr first;
        if (count == 0 && read(ehdr_.e_shoff, first)) count = first.sh_size;  // extended numbering
        if (!in_file(ehdr_.e_shoff, count * sizeof(Elf64_Shdr))) return;
        sections_.resize(count);
        std::memcpy(sections_.data(), data_ + ehdr_.e_shoff, count * sizeof(Elf64_Shdr));
    }

    // The NT_GNU_BUILD_ID note, from the PT_NOTE segments (what the
    // interposer reads in memory), else from SHT_NOTE sections.
    std::string find_build_id() const {
        if (ehdr_.e_phentsize == sizeof(Elf64_Phdr)) {
            for (uint64_t i = 0; i < ehdr_.e_phnum; ++i) {
                Elf64_Phdr ph;
                if (!read(ehdr_.e_phoff + i * sizeof ph, ph)) break;
                if (ph.p_type != PT_NOTE) continue;
                if (auto id = note_build_id(ph.p_offset, ph.p_filesz, ph.p_align)) return *id;
            }
        }
        for (const Elf64_Shdr& sh : sections_) {
            if (sh.sh_type != SHT_NOTE) continue;
            if (auto id = note_build_id(sh.sh_offset, sh.sh_size, sh.sh_addralign)) return *id;
        }
        return {};
    }

    std::optional<std::string> note_build_id(uint64_t offset, uint64_t length,
                                             uint64_t align) const {
        if (!in_file(offset, length)) return std::nullopt;
        std::string id = gnu_build_id(data_ + offset, size_t(length), size_t(align));
        if (id.empty()) return std::nullopt;
        return id;
    }

    void read_symbols() {
        symbols_read_ = true;
        for (uint32_t type : {SHT_SYMTAB, SHT_DYNSYM}) {
            for (const Elf64_Shdr& sh : sections_) {
                if (sh.sh_type == type && sh.sh_entsize == sizeof(Elf64_Sym)) add_symbols(sh);
            }
            if (!symbols_.empty()) break;  // a .symtab holds the .dynsym's functions too
        }
        std::sort(symbols_.begin(), symbols_.end(), [](const Symbol& a, const Symbol& b) {
            return a.value != b.value ? a.value < b.value : a.rank > b.rank;
        });
    }

    void add_symbols(const Elf64_Shdr& table) {
        if (table.sh_link >= sections_.size() || !in_file(table.sh_offset, table.sh_size)) return;
        const Elf64_Shdr& strings = sections_[table.sh_link];
        if (!in_file(strings.sh_offset, strings.sh_size)) return;
        const char* names = reinterpret_cast<const char*>(data_ + strings.sh_offset);
        for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= table.sh_size; off += sizeof(Elf64_Sym)) {
            Elf64_Sym sym;
            std::memcpy(&sym, data_ + table.sh_offset + off, sizeof sym);
            int type = ELF64_ST_TYPE(sym.st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF ||
                sym.st_value == 0 || sym.st_name >= strings.sh_size)
                continue;
            size_t max = strings.sh_size - sym.st_name;
            size_t length = strnlen(names + sym.st_name, max);
            if (length == 0 || length == max) continue;
            std::string_view name(names + sym.st_name, length);
            int bind = ELF64_ST_BIND(sym.st_info);
            int rank = (bind == STB_GLOBAL ? 0
                        : bind == STB_WEAK ? 8
                                           : 16) +
                       static_cast<int>(std::min<size_t>(name.find_first_not_of('_'), 7));
            symbols_.push_back({sym.st_value, sym.st_size, name, rank});
        }
    }

    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    Elf64_Ehdr ehdr_{};
    std::vector<Elf64_Shdr> sections_;
    std::string build_id_;
    bool symbols_read_ = false;
    std::vector<Symbol> symbols_;
};

// What a module file gives for one file address.
struct Location {
    std::string function;  // mangled or plain, as the file names it (named():
                           // demangled)
    std::string file;
    uint32_t line = 0;
};

// One module file on this machine whose build id matched a recorded one.
// Opened once per process and kept: libbacktrace states cannot be freed, and
// the reports of several ranks share their modules.
class ModuleFile {
  public:
    ModuleFile(std::string path, std::unique_ptr<ElfFile> elf)
        : path_(std::move(path)), elf_(std::move(elf)) {}

    // What locate() gives, its function demangled, looked up once per file
    // address in this process: the symbolizers of a report's ranks, whose
    // traces name the same files, share it.
    Location named(uint64_t pc, std::string& debug_error) {
        {
            std::lock_guard lock(mutex_);
            if (auto it = named_.find(pc); it != named_.end()) return it->second;
        }
        Location where = locate(pc, debug_error);
        if (!where.function.empty()) where.function = demangle(where.function);
        std::lock_guard lock(mutex_);
        return named_.try_emplace(pc, std::move(where)).first->second;
    }

    // Looks `pc` (a file address) up; the first debug-info error is returned
    // once through `debug_error`.
    Location locate(uint64_t pc, std::string& debug_error) {
        std::lock_guard lock(mutex_);
        Location where;
        // The function is named from the symbol table first, as
        // Boost.Stacktrace does: DWARF names members of anonymous namespaces
        // and lambdas without their scope ("open", "operator()").
        std::string_view symbol = elf_->function_at(pc);
#if ALLOCSCOPE_HAVE_LIBBACKTRACE
        if (!backtrace_ready_) start_backtrace();
        if (backtrace_) {
            Lookup lookup{this, &where};
            uintptr_t at = static_cast<uintptr_t>(pc + backtrace_bias_);
            backtrace_pcinfo(backtrace_, at, on_location, on_error, &lookup);
            // A stripped file's own table has its exported functions only;
            // libbacktrace also reads the separate debug file's.
            if (symbol.empty()) backtrace_syminfo(backtrace_, at, on_symbol, on_error, &lookup);
        }
#endif
        if (!symbol.empty()) where.function = symbol;
        if (!debug_error_.empty() && !debug_error_reported_) {
            debug_error_reported_ = true;
            debug_error = debug_error_;
        }
        return where;
    }

  private:
#if ALLOCSCOPE_HAVE_LIBBACKTRACE
    struct Lookup {
        ModuleFile* file;
        Location* where;
    };

    // Inlined frames come innermost first: the last one named is the
    // function the code belongs to, with the line of the call inlined there
    // (what Boost.Stacktrace reports for a frame).
    static int on_location(void* data, uintptr_t, const char* file, int line,
                           const char* function) {
        Location& where = *static_cast<Lookup*>(data)->where;
        if (function) {
            where.function = function;
            where.file = file ? file : "";
            where.line = file && line > 0 ? static_cast<uint32_t>(line) : 0;
        } else if (file && where.function.empty()) {
            where.file = file;
            where.line = line > 0 ? static_cast<uint32_t>(line) : 0;
        }
        return 0;
    }

    static void on_symbol(void* data, uintptr_t, const char* name, uintptr_t, uintptr_t) {
        if (name) static_cast<Lookup*>(data)->where->function = name;
    }

    static void on_error(void* data, const char* message, int errnum) {
        // -1: no debug info or no symbol table, which stripped modules are.
        if (errnum == -1) return;
        ModuleFile& file = *static_cast<Lookup*>(data)->file;
        if (file.debug_error_.empty())
            file.debug_error_ = errnum > 0 ? std::string(message) + ": " + std::strerror(errnum)
                                           : std::string(message);
    }

    void start_backtrace() {
        backtrace_ready_ = true;
        Location none;
        Lookup lookup{this, &none};
        backtrace_ = backtrace_create_state(path_.c_str(), 0, on_error, &lookup);
        if (!backtrace_) return;
        // libbacktrace reads the file at the first lookup; do that one now,
        // showing it only this file, at load bias 0.
        t_module_file_only = true;
        t_module_file_walks = 0;
        backtrace_pcinfo(backtrace_, 0, on_location, on_error, &lookup);
        t_module_file_only = false;
        // A libbacktrace that walked the real module list (a shared
        // libbacktrace) put a position-independent file at our own
        // executable's load bias.
        if (t_module_file_walks == 0 && elf_->position_independent()) {
            dl_iterate_phdr(
                [](dl_phdr_info* info, size_t, void* out) {
                    *static_cast<uint64_t*>(out) = info->dlpi_addr;
                    return 1;  // the executable comes first
                },
                &backtrace_bias_);
        }
    }

    backtrace_state* backtrace_ = nullptr;
    bool backtrace_ready_ = false;
    uint64_t backtrace_bias_ = 0;
#endif

    std::mutex mutex_;
    std::unordered_map<uint64_t, Location> named_;  // by file address
    std::string path_;
    std::unique_ptr<ElfFile> elf_;
    std::string debug_error_;
    bool debug_error_reported_ = false;
};

// The module files opened in this process, by path and recorded build id,
// with what opening them gave. A file that changed on disk is opened again.
struct OpenedFile {
    std::shared_ptr<ModuleFile> file;  // null when unusable
    std::string problem;               // why unusable
    dev_t device = 0;
    ino_t inode = 0;
    int64_t size = 0;
    timespec modified{};
};

class ModuleFiles {
  public:
    static ModuleFiles& instance() {
        static ModuleFiles* files = new ModuleFiles;  // lives as long as the states it holds
        return *files;
    }

    OpenedFile open(const std::string& path, const std::string& build_id) {
        struct stat st {};
        if (path.empty() || ::stat(path.c_str(), &st) != 0)
            return {nullptr, path.empty() ? "no path recorded" : std::strerror(errno)};
        if (!S_ISREG(st.st_mode)) return {nullptr, "not a regular file"};
        std::lock_guard lock(mutex_);
        std::string key = path + '\0' + build_id;
        auto it = opened_.find(key);
        if (it != opened_.end() && it->second.device == st.st_dev &&
            it->second.inode == st.st_ino && it->second.size == st.st_size &&
            it->second.modified.tv_sec == st.st_mtim.tv_sec &&
            it->second.modified.tv_nsec == st.st_mtim.tv_nsec)
            return it->second;
        OpenedFile opened{nullptr, {}, st.st_dev, st.st_ino, st.st_size, st.st_mtim};
        auto elf = std::make_unique<ElfFile>();
        opened.problem = elf->open(path, st);
        if (opened.problem.empty() && elf->build_id() != build_id) {
            opened.problem = "its build id " + hex_bytes(elf->build_id()) +
                             " is not the recorded " + hex_bytes(build_id);
        }
        if (opened.problem.empty())
            opened.file = std::make_shared<ModuleFile>(path, std::move(elf));
        opened_[key] = opened;
        return opened;
    }

  private:
    std::mutex mutex_;
    std::unordered_map<std::string, OpenedFile> opened_;
};

}  // namespace

std::string SymbolizedFrame::text() const {
    char hex[32];
    if (!function.empty()) {
        if (file.empty()) return function;
        return function + " (" + file + (line ? ":" + std::to_string(line) : "") + ")";
    }
    if (!module.empty()) {
        std::snprintf(hex, sizeof hex, "+0x%" PRIx64, offset);
        return module + hex;
    }
    std::snprintf(hex, sizeof hex, "0x%" PRIx64, address);
    return hex;
}

struct Symbolizer::Impl {
    struct Module {
        ModuleRecord record;
        bool opened = false;
        std::shared_ptr<ModuleFile> file;  // null: frames stay raw
    };

    std::vector<Module> modules;  // by load bias
    Warn warn;
    std::unordered_map<uint64_t, SymbolizedFrame> frames;
    std::map<std::string, std::string> source_paths;    // as read -> normalized
    const std::vector<std::string>* strings = nullptr;  // for Python frames

    Module* module_of(uint64_t address) {
        auto it = std::upper_bound(modules.begin(), modules.end(), address,
                                   [](uint64_t a, const Module& m) { return a < m.record.base; });
        // The nearest load bias below first: a module mapped where an
        // unloaded one was wins over it.
        while (it != modules.begin()) {
            --it;
            if (address - it->record.base < it->record.size) return &*it;
        }
        return nullptr;
    }

    ModuleFile* file_of(Module& module) {
        if (!module.opened) {
            module.opened = true;
            const ModuleRecord& r = module.record;
            OpenedFile opened = ModuleFiles::instance().open(r.path, r.build_id);
            module.file = opened.file;
            if (!module.file) {
                // One warning per recorded file, however many load biases it had.
                for (Module& same : modules) {
                    if (same.record.path == r.path && same.record.build_id == r.build_id)
                        same.opened = true;
                }
                note(r.path + ": " + opened.problem + "; its frames stay module+offset");
            }
        }
        return module.file.get();
    }

    void note(const std::string& message) const {
        if (warn) warn("cannot symbolize " + message);
    }

    const std::string& source_path(const std::string& file) {
        auto [it, added] = source_paths.try_emplace(file);
        if (added) {
            // Build directories give "/build/dir/../src/x.cpp".
            std::filesystem::path p(file);
            it->second = p.is_absolute() ? p.lexically_normal().string() : file;
        }
        return it->second;
    }

    // "function (file:line)" as python_frame_text wrote it.
    SymbolizedFrame python(uint64_t address) const {
        SymbolizedFrame f;
        f.address = address;
        f.module = "python";
        const uint32_t id = python_frame_string(address);
        if (!strings || id == 0 || id >= strings->size()) return f;
        const std::string& text = (*strings)[id];
        const size_t open = text.rfind(" (");
        const size_t colon = text.rfind(':');
        if (open == std::string::npos || colon == std::string::npos || colon < open ||
            text.back() != ')') {
            f.function = text;
            return f;
        }
        f.function = text.substr(0, open);
        f.file = text.substr(open + 2, colon - open - 2);
        f.line = static_cast<uint32_t>(std::strtoul(text.c_str() + colon + 1, nullptr, 10));
        return f;
    }

    SymbolizedFrame symbolize(uint64_t address) {
        if (is_python_frame(address)) return python(address);
        SymbolizedFrame f;
        f.address = address;
        Module* module = module_of(address);
        if (!module) return f;
        f.module = module->record.path;
        f.offset = address - module->record.base;
        ModuleFile* file = file_of(*module);
        if (!file) return f;
        // Recorded frames are return addresses: the call is the instruction
        // before, and may be the last one of its function or line.
        std::string debug_error;
        Location where = file->named(f.offset > 0 ? f.offset - 1 : 0, debug_error);
        if (!debug_error.empty()) {
            if (warn)
                warn("incomplete debug info in " + f.module + ": " + debug_error +
                     "; some frames have no file:line");
        }
        f.function = std::move(where.function);
        if (!where.file.empty()) {
            f.file = source_path(where.file);
            f.line = where.line;
        }
        return f;
    }
};

Symbolizer::Symbolizer(std::vector<ModuleRecord> modules, Warn warn)
    : impl_(std::make_unique<Impl>()) {
    impl_->warn = std::move(warn);
    impl_->modules.reserve(modules.size());
    for (ModuleRecord& r : modules)
        impl_->modules.push_back({std::move(r), false, nullptr});
    std::stable_sort(
        impl_->modules.begin(), impl_->modules.end(),
        [](const Impl::Module& a, const Impl::Module& b) { return a.record.base < b.record.base; });
}

Symbolizer::~Symbolizer() = default;

void Symbolizer::use_strings(const std::vector<std::string>& strings) {
    impl_->strings = &strings;
}

const SymbolizedFrame& Symbolizer::frame(uint64_t address) {
    auto it = impl_->frames.find(address);
    if (it != impl_->frames.end()) return it->second;
    // unordered_map nodes never move: references stay valid.
    return impl_->frames.emplace(address, impl_->symbolize(address)).first->second;
}

std::vector<const SymbolizedFrame*> Symbolizer::stack(std::span<const uint64_t> frames) {
    std::vector<const SymbolizedFrame*> out;
    out.reserve(frames.size());
    for (uint64_t address : frames)
        out.push_back(&frame(address));
    return out;
}

void Symbolizer::resolve(std::span<const uint64_t> addresses,
                         const std::function<void(size_t, size_t)>& progress) {
    std::vector<uint64_t> todo;
    todo.reserve(addresses.size());
    for (uint64_t address : addresses) {
        if (!impl_->frames.contains(address)) todo.push_back(address);
    }
    // In address order: one module after the other.
    std::sort(todo.begin(), todo.end());
    todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    for (size_t i = 0; i < todo.size(); ++i) {
        frame(todo[i]);
        if (progress && (i + 1) % 64 == 0 && i + 1 < todo.size()) progress(i + 1, todo.size());
    }
    if (progress) progress(todo.size(), todo.size());
}

size_t Symbolizer::resolved_count() const noexcept {
    return impl_->frames.size();
}

}  // namespace allocscope
