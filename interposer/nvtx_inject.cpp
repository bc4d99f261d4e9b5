// liballocscope.so as the process's NVTX injection library
// (NVTX_INJECTION64_PATH, set by `allocscope run --nvtx`): NVTX ranges and
// marks become tags, steps and notes by the rules of nvtx_names.h. The
// library is normally preloaded too, so NVTX's dlopen() finds the loaded
// copy; when it is not, the dlopen()ed copy records tags and marks (it
// cannot see allocations: nothing routes CUDA calls through it).
//
// Every thread keeps a stack with one entry per open range push (of any
// domain) and per open range start that entered a tag, recording whether
// the range entered a tag. A pop leaves the innermost open push of its
// domain, and a tag is popped only when its entry is the innermost one, so
// names that are not tags never unbalance the tag stack:
//  * a range that ends while a range opened after it is still open (other
//    domains, starts/ends out of LIFO order) keeps its tag until the ranges
//    above it end;
//  * a started range ended on another thread is handed to the starting
//    thread, which leaves it at its next NVTX call;
//  * a pop with no open push of its domain is ignored.
// The first anomaly of each kind is noted in the trace as a mark.
//
// Fork policy: nothing here takes a lock of its own (registered strings and
// the hand-over slots are atomics), so a forked child goes on unharmed; the
// recorder's policy covers what the callbacks record.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <string>
#include <string_view>

#include "nvtx_abi.h"
#include "nvtx_names.h"
#include "recorder.h"

namespace allocscope::nvtx {

namespace {

enum EntryFlag : uint8_t {
    kMapped = 1,   // the range entered a tag: its end pops it
    kEnded = 2,    // ended, waiting for the entries above it to end
    kStarted = 4,  // nvtxRangeStart (key = range id), else a push (key = domain)
};

struct Entry {
    uint64_t key;
    uint8_t flags;
};

constexpr uint32_t kMaxDepth = 128;

// Trivially constructible so TLS needs no constructor or destructor calls.
struct RangeStack {
    uint32_t depth;  // open entries, counting pushes beyond kMaxDepth (never tags)
    Entry entries[kMaxDepth];
};
thread_local RangeStack t_ranges;

// Range ids: bit 0 says the range entered a tag.
std::atomic<uint64_t> g_next_range{1};

// Started ranges ended on another thread, waiting for their own thread.
constexpr size_t kHandOverSlots = 64;
std::atomic<uint64_t> g_handed_over[kHandOverSlots];
std::atomic<uint32_t> g_handed_over_count{0};

// Registered strings: handle = index + 1. Never freed: a handle stays valid
// for the process's life.
constexpr uint32_t kMaxRegistered = 1u << 16;
std::atomic<const char*> g_registered[kMaxRegistered];
std::atomic<uint32_t> g_registered_count{0};

enum Anomaly { kStrayPop, kOutOfOrder, kOtherThread, kHandOverFull, kAnomalyCount };
constexpr const char* kAnomalyNotes[kAnomalyCount] = {
    "nvtx: a range pop without an open push was ignored",
    "nvtx: a tagged range ended before a range opened after it; its tag is left when that "
    "range ends",
    "nvtx: a tagged range ended on another thread; its tag is left at its own thread's next "
    "NVTX call",
    "nvtx: too many tagged ranges ended on other threads at once; one stays open on its own "
    "thread",
};
std::atomic<bool> g_noted[kAnomalyCount];

void note(Anomaly a) noexcept {
    if (!g_noted[a].exchange(true, std::memory_order_relaxed)) recorder::mark(kAnomalyNotes[a]);
}

std::string_view bounded(const char* s) noexcept {
    if (!s) return {};
    return {s, strnlen(s, kMaxNameBytes + 1)};
}

// UTF-32 (wchar_t on Linux) to UTF-8, at most kMaxNameBytes + 1 bytes (a
// longer name is never mapped); invalid code points become '?'.
std::string_view widen(const wchar_t* w, std::string& out) noexcept {
    if (!w) return {};
    try {
        for (size_t i = 0; w[i] != 0 && out.size() <= kMaxNameBytes; ++i) {
            const uint32_t c = static_cast<uint32_t>(w[i]);
            if (c < 0x80) {
                out += static_cast<char>(c);
            } else if (c < 0x800) {
                out += static_cast<char>(0xc0 | (c >> 6));
                out += static_cast<char>(0x80 | (c & 0x3f));
            } else if ((c >= 0xd800 && c < 0xe000) || c > 0x10ffff) {
                out += '?';
            } else if (c < 0x10000) {
                out += static_cast<char>(0xe0 | (c >> 12));
                out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
                out += static_cast<char>(0x80 | (c & 0x3f));
            } else {
                out += static_cast<char>(0xf0 | (c >> 18));
                out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
                out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
                out += static_cast<char>(0x80 | (c & 0x3f));
            }
        }
    } catch (...) {
        return {};
    }
    return out;
}

abi::StringHandle register_string(std::string_view text) noexcept {
    if (g_registered_count.load(std::memory_order_relaxed) >= kMaxRegistered) return nullptr;
    const uint32_t n = g_registered_count.fetch_add(1, std::memory_order_relaxed);
    if (n >= kMaxRegistered) return nullptr;
    char* copy = static_cast<char*>(std::malloc(text.size() + 1));
    if (!copy) return nullptr;
    std::memcpy(copy, text.data(), text.size());
    copy[text.size()] = '\0';
    g_registered[n].store(copy, std::memory_order_release);
    return reinterpret_cast<abi::StringHandle>(uintptr_t{n} + 1);
}

const char* registered(abi::StringHandle handle) noexcept {
    const uintptr_t v = reinterpret_cast<uintptr_t>(handle);
    if (v == 0 || v > kMaxRegistered) return nullptr;
    return g_registered[v - 1].load(std::memory_order_acquire);
}

// An event's message as UTF-8: a view of the caller's string, of a
// registered one, or of `storage`. Empty when absent or of another type.
std::string_view message(const abi::EventAttributes* a, std::string& storage) noexcept {
    if (!a || a->size < sizeof(abi::EventAttributes)) return {};
    switch (a->message_type) {
        case abi::kMessageAscii:
            return bounded(a->message.ascii);
        case abi::kMessageUnicode:
            return widen(a->message.unicode, storage);
        case abi::kMessageRegistered:
            return bounded(registered(a->message.registered));
        default:
            return {};
    }
}

// Enters the tag `name` maps to; whether it did.
bool enter(std::string_view name) noexcept {
    if (name.empty()) return false;
    try {
        RangeTag t = map_range(name);
        if (t.step) recorder::set_step(*t.step);
        if (!t.mapped) return false;
        if (t.sub_phase) t.phase = sub_phase_of(recorder::current_phase(), t.phase);
        return recorder::push_tag(t.keep_layer ? nullptr : t.layer.c_str(),
                                  t.keep_phase ? nullptr : t.phase.c_str());
    } catch (...) {
        return false;
    }
}

// Leaves the ended entries at the top of the stack.
void unwind(RangeStack& s) noexcept {
    while (s.depth > 0 && s.depth <= kMaxDepth && (s.entries[s.depth - 1].flags & kEnded)) {
        if (s.entries[s.depth - 1].flags & kMapped) recorder::pop_tag();
        --s.depth;
    }
}

void end_entry(RangeStack& s, uint32_t index) noexcept {
    Entry& e = s.entries[index];
    e.flags |= kEnded;
    if ((e.flags & kMapped) && index + 1 != s.depth) note(kOutOfOrder);
    unwind(s);
}

// Takes over the ranges of this thread that other threads ended.
void collect_handed_over(RangeStack& s) noexcept {
    if (g_handed_over_count.load(std::memory_order_acquire) == 0) return;
    const uint32_t n = s.depth < kMaxDepth ? s.depth : kMaxDepth;
    for (uint32_t i = 0; i < n; ++i) {
        Entry& e = s.entries[i];
        if (!(e.flags & kStarted) || (e.flags & kEnded)) continue;
        for (std::atomic<uint64_t>& slot : g_handed_over) {
            uint64_t id = e.key;
            if (slot.load(std::memory_order_relaxed) == id &&
                slot.compare_exchange_strong(id, 0, std::memory_order_acq_rel)) {
                g_handed_over_count.fetch_sub(1, std::memory_order_release);
                e.flags |= kEnded;
                break;
            }
        }
    }
    unwind(s);
}

void hand_over(uint64_t id) noexcept {
    note(kOtherThread);
    for (std::atomic<uint64_t>& slot : g_handed_over) {
        uint64_t empty = 0;
        if (slot.compare_exchange_strong(empty, id, std::memory_order_acq_rel)) {
            g_handed_over_count.fetch_add(1, std::memory_order_release);
            return;
        }
    }
    note(kHandOverFull);
}

int push(uint64_t domain, std::string_view name) noexcept {
    RangeStack& s = t_ranges;
    collect_handed_over(s);
    if (s.depth < kMaxDepth) {
        s.entries[s.depth] = {domain, static_cast<uint8_t>(enter(name) ? kMapped : 0)};
    }
    return static_cast<int>(s.depth++);
}

int pop(uint64_t domain) noexcept {
    RangeStack& s = t_ranges;
    collect_handed_over(s);
    if (s.depth > kMaxDepth) return static_cast<int>(--s.depth);
    for (uint32_t i = s.depth; i-- > 0;) {
        const Entry& e = s.entries[i];
        if ((e.flags & (kStarted | kEnded)) == 0 && e.key == domain) {
            end_entry(s, i);
            return static_cast<int>(i);
        }
    }
    note(kStrayPop);
    return -1;
}

abi::RangeId start(std::string_view name) noexcept {
    RangeStack& s = t_ranges;
    collect_handed_over(s);
    const uint64_t id = g_next_range.fetch_add(1, std::memory_order_relaxed) << 1;
    if (s.depth >= kMaxDepth || !enter(name)) return id;
    s.entries[s.depth++] = {id | 1, static_cast<uint8_t>(kMapped | kStarted)};
    return id | 1;
}

void end(abi::RangeId id) noexcept {
    RangeStack& s = t_ranges;
    collect_handed_over(s);
    if ((id & 1) == 0) return;  // entered no tag
    const uint32_t n = s.depth < kMaxDepth ? s.depth : kMaxDepth;
    for (uint32_t i = n; i-- > 0;) {
        const Entry& e = s.entries[i];
        if ((e.flags & kStarted) && !(e.flags & kEnded) && e.key == id) {
            end_entry(s, i);
            return;
        }
    }
    hand_over(id);
}

void mark(std::string_view name) noexcept {
    collect_handed_over(t_ranges);
    try {
        const MarkAction m = map_mark(name);
        if (m.kind == MarkAction::Kind::step) recorder::set_step(m.step);
        if (m.kind == MarkAction::Kind::note) recorder::mark(std::string(m.note).c_str());
    } catch (...) {
    }
}

uint64_t domain_key(abi::DomainHandle domain) noexcept {
    return reinterpret_cast<uintptr_t>(domain);
}

// A domain's handle is a hash of its name (never 0, the default domain's),
// so creating a name twice gives one domain and nothing is stored.
abi::DomainHandle domain_of(std::string_view name) noexcept {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : name)
        h = (h ^ c) * 1099511628211ull;
    return reinterpret_cast<abi::DomainHandle>(static_cast<uintptr_t>(h | 1));
}

// --- the callbacks ---------------------------------------------------------------

void mark_ex(const abi::EventAttributes* a) {
    std::string storage;
    mark(message(a, storage));
}
void mark_a(const char* text) {
    mark(bounded(text));
}
void mark_w(const wchar_t* text) {
    std::string storage;
    mark(widen(text, storage));
}
abi::RangeId range_start_ex(const abi::EventAttributes* a) {
    std::string storage;
    return start(message(a, storage));
}
abi::RangeId range_start_a(const char* text) {
    return start(bounded(text));
}
abi::RangeId range_start_w(const wchar_t* text) {
    std::string storage;
    return start(widen(text, storage));
}
void range_end(abi::RangeId id) {
    end(id);
}
int range_push_ex(const abi::EventAttributes* a) {
    std::string storage;
    return push(0, message(a, storage));
}
int range_push_a(const char* text) {
    return push(0, bounded(text));
}
int range_push_w(const wchar_t* text) {
    std::string storage;
    return push(0, widen(text, storage));
}
int range_pop() {
    return pop(0);
}

void domain_mark_ex(abi::DomainHandle, const abi::EventAttributes* a) {
    mark_ex(a);
}
abi::RangeId domain_range_start_ex(abi::DomainHandle, const abi::EventAttributes* a) {
    return range_start_ex(a);
}
void domain_range_end(abi::DomainHandle, abi::RangeId id) {
    end(id);
}
int domain_range_push_ex(abi::DomainHandle domain, const abi::EventAttributes* a) {
    std::string storage;
    return push(domain_key(domain), message(a, storage));
}
int domain_range_pop(abi::DomainHandle domain) {
    return pop(domain_key(domain));
}
abi::StringHandle domain_register_string_a(abi::DomainHandle, const char* text) {
    return text ? register_string(bounded(text)) : nullptr;
}
abi::StringHandle domain_register_string_w(abi::DomainHandle, const wchar_t* text) {
    std::string storage;
    return text ? register_string(widen(text, storage)) : nullptr;
}
abi::DomainHandle domain_create_a(const char* name) {
    return domain_of(bounded(name));
}
abi::DomainHandle domain_create_w(const wchar_t* name) {
    std::string storage;
    return domain_of(widen(name, storage));
}

// Stores `fn` into slot `id` of a module's table; ids the module's NVTX
// version does not have are skipped.
template <typename Fn>
void attach(abi::FunctionTable table, unsigned int size, uint32_t id, Fn* fn) {
    if (table && id < size && table[id]) *table[id] = reinterpret_cast<abi::FunctionPointer>(fn);
}

bool attach_module(abi::GetExportTable get_export_table) {
    if (!get_export_table) return false;
    const auto* callbacks =
        static_cast<const abi::ExportTableCallbacks*>(get_export_table(abi::kExportTableCallbacks));
    if (!callbacks || callbacks->struct_size < sizeof(abi::ExportTableCallbacks) ||
        !callbacks->get_module_function_table) {
        return false;
    }
    abi::FunctionTable core = nullptr;
    unsigned int core_size = 0;
    if (!callbacks->get_module_function_table(abi::kModuleCore, &core, &core_size) || !core) {
        return false;
    }
    attach(core, core_size, abi::kMarkEx, mark_ex);
    attach(core, core_size, abi::kMarkA, mark_a);
    attach(core, core_size, abi::kMarkW, mark_w);
    attach(core, core_size, abi::kRangeStartEx, range_start_ex);
    attach(core, core_size, abi::kRangeStartA, range_start_a);
    attach(core, core_size, abi::kRangeStartW, range_start_w);
    attach(core, core_size, abi::kRangeEnd, range_end);
    attach(core, core_size, abi::kRangePushEx, range_push_ex);
    attach(core, core_size, abi::kRangePushA, range_push_a);
    attach(core, core_size, abi::kRangePushW, range_push_w);
    attach(core, core_size, abi::kRangePop, range_pop);

    abi::FunctionTable core2 = nullptr;
    unsigned int core2_size = 0;
    if (callbacks->get_module_function_table(abi::kModuleCore2, &core2, &core2_size)) {
        attach(core2, core2_size, abi::kDomainMarkEx, domain_mark_ex);
        attach(core2, core2_size, abi::kDomainRangeStartEx, domain_range_start_ex);
        attach(core2, core2_size, abi::kDomainRangeEnd, domain_range_end);
        attach(core2, core2_size, abi::kDomainRangePushEx, domain_range_push_ex);
        attach(core2, core2_size, abi::kDomainRangePop, domain_range_pop);
        attach(core2, core2_size, abi::kDomainRegisterStringA, domain_register_string_a);
        attach(core2, core2_size, abi::kDomainRegisterStringW, domain_register_string_w);
        attach(core2, core2_size, abi::kDomainCreateA, domain_create_a);
        attach(core2, core2_size, abi::kDomainCreateW, domain_create_w);
    }

    const auto* version = static_cast<const abi::ExportTableVersionInfo*>(
        get_export_table(abi::kExportTableVersionInfo));
    if (version && version->struct_size >= sizeof(abi::ExportTableVersionInfo) &&
        version->set_injection_nvtx_version) {
        version->set_injection_nvtx_version(abi::kInjectionVersion);
    }
    return true;
}

}  // namespace

}  // namespace allocscope::nvtx

// Called by the NVTX code of each module once, on that module's first NVTX
// call. Returns 1 when the callbacks are attached; 0 makes NVTX unload the
// library (when it loaded it) and turn that module's calls into no-ops.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    allocscope::nvtx::abi::GetExportTable get_export_table) {
    try {
        return allocscope::nvtx::attach_module(get_export_table) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}
