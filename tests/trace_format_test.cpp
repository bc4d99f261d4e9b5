#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "trace_format.h"
#include "trace_reader.h"
#include "trace_writer.h"

using namespace allocscope;
namespace fs = std::filesystem;

// The largest single heap allocation made while `g_track_allocations` is set,
// so a test can show that a corrupt length is never allocated.
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};

void* counted_allocation(size_t n) {
    if (g_track_allocations.load(std::memory_order_relaxed)) {
        size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
        while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
        }
    }
    return std::malloc(n == 0 ? 1 : n);
}
}  // namespace

void* operator new(size_t n) {
    if (void* p = counted_allocation(n)) return p;
    throw std::bad_alloc();
}
void* operator new[](size_t n) {
    if (void* p = counted_allocation(n)) return p;
    throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept {
    return counted_allocation(n);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
    return counted_allocation(n);
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
    std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}

namespace {

class TempDir {
  public:
    TempDir() {
        std::random_device rd;
        for (int attempt = 0;; ++attempt) {
            path_ =
                fs::temp_directory_path() / ("allocscope-trace-test-" + std::to_string(::getpid()) +
                                             "-" + std::to_string(rd()));
            if (fs::create_directory(path_)) break;
            REQUIRE(attempt < 100);
        }
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::string file(const std::string& name) const { return (path_ / name).string(); }

  private:
    fs::path path_;
};

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
    fs::remove(path);
    std::ofstream out(path, std::ios::binary);
    REQUIRE(out);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out);
}

TraceHeader sample_header() {
    TraceHeader h;
    h.tool_version = "9.8.7-test";
    h.pid = 424242;
    h.rank = 7;
    h.world_size = 64;
    h.stack_depth = 24;
    h.start_wall_ns = 0x1122334455667788ull;
    h.start_mono_ns = 0x0102030405060708ull;
    return h;
}

// Ids the sample trace defines, in definition order.
constexpr uint32_t kLayer = 1;
constexpr uint32_t kPhase = 2;
constexpr uint32_t kDtype = 3;
constexpr uint32_t kParamName = 4;
constexpr uint32_t kMarkText = 5;
const std::vector<std::string> kStrings = {"",       "encoder.layers.3.attn", "forward", "bf16",
                                           "weight", "checkpoint saved"};
const std::vector<std::vector<uint64_t>> kStacks = {
    {}, {0x401000, 0x402000, 0x7f0000001234}, {0x401000, 0x402000}, {0xFFFFFFFFFFFFFFF0ull}};

ModuleRecord sample_module() {
    ModuleRecord m;
    m.base = 0x7f1234500000ull;
    m.size = 0x2a000;
    m.build_id = std::string("\x01\x00\xfe\x7f\x80", 5);
    m.path = "/usr/lib/x86_64-linux-gnu/libcudart.so.12";
    return m;
}

ParamRecord sample_param() {
    ParamRecord p;
    p.index = 0;
    p.layer = kLayer;
    p.name = kParamName;
    p.dtype = kDtype;
    p.numel = 4096ull * 4096ull;
    p.sharded_numel = 4096ull * 512ull;
    return p;
}

FooterRecord sample_footer() {
    FooterRecord f;
    f.events = kEventKindCount;
    f.unknown_frees = 3;
    f.double_frees = 2;
    f.stacks_dropped = 11;
    f.events_dropped = 13;
    f.end_mono_ns = 0x0A0B0C0D0E0F1011ull;
    return f;
}

// One event of every kind; every field differs from its default and from the
// same field of the other events.
std::vector<Event> sample_events() {
    const EventKind kinds[kEventKindCount] = {
        EventKind::alloc, EventKind::free,     EventKind::map,     EventKind::unmap,
        EventKind::oom,   EventKind::tag_push, EventKind::tag_pop, EventKind::step,
        EventKind::param, EventKind::mark};
    const Level levels[] = {Level::segment, Level::block, Level::none};
    const MemoryKind memories[] = {MemoryKind::device, MemoryKind::managed, MemoryKind::host_pinned,
                                   MemoryKind::none};
    std::vector<Event> events;
    for (uint32_t i = 0; i < kEventKindCount; ++i) {
        Event e;
        e.seq = 1000 + 17 * i;
        e.t_ns = 0x100000000ull * (i + 1) + 3;
        e.address = 0x7f00dead0000ull + 0x1000ull * i;
        e.size = (uint64_t{1} << 40) + i;
        e.stream = 0x5eed0000ull + i;
        e.step = 90000 + i;
        e.tid = 31337 + i;
        e.layer = kLayer;
        e.phase = kPhase;
        e.stack = 1 + i % 3;
        e.aux = kinds[i] == EventKind::mark ? kMarkText : kinds[i] == EventKind::param ? 0 : 77 + i;
        e.flags = kFlagUnknownAddress | (i << 8);
        e.device = static_cast<int32_t>(i) - 3;
        e.result = i % 2 == 0 ? static_cast<int32_t>(i) : -static_cast<int32_t>(i) * 1000;
        e.kind = kinds[i];
        e.level = levels[i % 3];
        e.memory = memories[i % 4];
        e.api = static_cast<Api>(1 + i);
        events.push_back(e);
    }
    return events;
}

void check_same(const Event& got, const Event& want) {
    CHECK(got.seq == want.seq);
    CHECK(got.t_ns == want.t_ns);
    CHECK(got.address == want.address);
    CHECK(got.size == want.size);
    CHECK(got.stream == want.stream);
    CHECK(got.step == want.step);
    CHECK(got.tid == want.tid);
    CHECK(got.layer == want.layer);
    CHECK(got.phase == want.phase);
    CHECK(got.stack == want.stack);
    CHECK(got.aux == want.aux);
    CHECK(got.flags == want.flags);
    CHECK(got.device == want.device);
    CHECK(got.result == want.result);
    CHECK(got.kind == want.kind);
    CHECK(got.level == want.level);
    CHECK(got.memory == want.memory);
    CHECK(got.api == want.api);
}

void open_or_fail(TraceWriter& w, const std::string& path, const TraceHeader& header) {
    std::string error;
    REQUIRE_MESSAGE(w.open(path, header, error), error);
}

// Writes the definitions the sample events need, then the events.
void write_sample_body(TraceWriter& w) {
    for (uint32_t id = 1; id < kStrings.size(); ++id)
        w.string(id, kStrings[id]);
    for (uint32_t id = 1; id < kStacks.size(); ++id)
        w.stack(id, kStacks[id]);
    w.module(sample_module());
    w.param(sample_param());
    for (const Event& e : sample_events())
        w.event(e);
}

void write_sample_trace(const std::string& path, bool with_footer = true) {
    TraceWriter w;
    open_or_fail(w, path, sample_header());
    write_sample_body(w);
    if (with_footer) w.close(sample_footer());
}

// Byte offsets of every record of a valid trace, in file order.
std::vector<uint64_t> record_offsets(const std::string& path) {
    TraceReader reader(path);
    std::vector<uint64_t> offsets;
    TraceRecord r;
    while (reader.next(r))
        offsets.push_back(r.offset);
    return offsets;
}

// The TraceError a reader of `path` throws (reading every record).
TraceError read_error(const std::string& path) {
    try {
        TraceReader reader(path);
        TraceRecord r;
        while (reader.next(r)) {
        }
    } catch (const TraceError& e) {
        return e;
    }
    FAIL("reading " << path << " did not throw TraceError");
    return TraceError(path, 0, "unreachable");
}

void check_error_at(const std::string& path, uint64_t offset, const std::string& problem) {
    TraceError e = read_error(path);
    CHECK(e.offset() == offset);
    CHECK(e.file() == path);
    const std::string what = e.what();
    CHECK_MESSAGE(what.find(path) != std::string::npos, what);
    CHECK_MESSAGE(what.find("at byte " + std::to_string(offset)) != std::string::npos, what);
    CHECK_MESSAGE(what.find(problem) != std::string::npos, what);
}

std::string record(RecordType type, const std::string& payload) {
    std::string out;
    append_record(out, type, payload);
    return out;
}

std::string footer_payload() {
    std::string p;
    for (int i = 0; i < 6; ++i)
        put_u64(p, 0);
    return p;
}

}  // namespace

TEST_CASE("every record kind and every event kind survive a write and a read unchanged") {
    TempDir dir;
    const std::string path = dir.file("rank7.trace");
    write_sample_trace(path);

    Trace t = load_trace(path);
    CHECK(t.path == path);
    CHECK_FALSE(t.truncated);
    CHECK(t.truncation_message.empty());

    const TraceHeader want = sample_header();
    CHECK(t.header.format_version == kTraceFormatVersion);
    CHECK(t.header.tool_version == want.tool_version);
    CHECK(t.header.pid == want.pid);
    CHECK(t.header.rank == want.rank);
    CHECK(t.header.world_size == want.world_size);
    CHECK(t.header.stack_depth == want.stack_depth);
    CHECK(t.header.start_wall_ns == want.start_wall_ns);
    CHECK(t.header.start_mono_ns == want.start_mono_ns);

    CHECK(t.strings == kStrings);
    CHECK(t.str(kMarkText) == "checkpoint saved");
    CHECK(t.stacks == kStacks);

    REQUIRE(t.modules.size() == 1);
    const ModuleRecord m = sample_module();
    CHECK(t.modules[0].base == m.base);
    CHECK(t.modules[0].size == m.size);
    CHECK(t.modules[0].build_id == m.build_id);
    CHECK(t.modules[0].path == m.path);

    REQUIRE(t.params.size() == 1);
    const ParamRecord p = sample_param();
    CHECK(t.params[0].index == p.index);
    CHECK(t.params[0].layer == p.layer);
    CHECK(t.params[0].name == p.name);
    CHECK(t.params[0].dtype == p.dtype);
    CHECK(t.params[0].numel == p.numel);
    CHECK(t.params[0].sharded_numel == p.sharded_numel);

    const std::vector<Event> events = sample_events();
    REQUIRE(t.events.size() == events.size());
    for (size_t i = 0; i < events.size(); ++i) {
        CAPTURE(to_string(events[i].kind));
        check_same(t.events[i], events[i]);
    }

    REQUIRE(t.footer.has_value());
    const FooterRecord f = sample_footer();
    CHECK(t.footer->events == f.events);
    CHECK(t.footer->unknown_frees == f.unknown_frees);
    CHECK(t.footer->double_frees == f.double_frees);
    CHECK(t.footer->stacks_dropped == f.stacks_dropped);
    CHECK(t.footer->events_dropped == f.events_dropped);
    CHECK(t.footer->end_mono_ns == f.end_mono_ns);
}

TEST_CASE("the streaming reader reports record types and offsets in file order") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    write_sample_trace(path);

    TraceReader reader(path);
    std::vector<RecordType> types;
    std::vector<uint64_t> offsets;
    TraceRecord r;
    while (reader.next(r)) {
        types.push_back(r.type);
        offsets.push_back(r.offset);
    }
    CHECK(reader.complete());
    CHECK_FALSE(reader.truncated());
    CHECK(reader.truncation_message().empty());
    CHECK_FALSE(reader.next(r));

    std::vector<RecordType> want(kStrings.size() - 1, RecordType::string);
    want.insert(want.end(), kStacks.size() - 1, RecordType::stack);
    want.push_back(RecordType::module);
    want.push_back(RecordType::param);
    want.insert(want.end(), kEventKindCount, RecordType::event);
    want.push_back(RecordType::footer);
    CHECK(types == want);

    REQUIRE(!offsets.empty());
    CHECK(offsets.front() == kTraceHeaderSize);
    for (size_t i = 0; i < types.size(); ++i) {
        if (types[i] == RecordType::event && i + 1 < offsets.size()) {
            CHECK(offsets[i + 1] - offsets[i] == kRecordHeaderSize + kEventPayloadSize);
        }
    }
    CHECK(offsets.back() + kRecordHeaderSize + 48 == fs::file_size(path));
}

TEST_CASE("a header's tool version keeps at most 15 bytes and negative rank and world size") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    TraceHeader h;
    h.tool_version = "0123456789abcdefghij";
    h.rank = -1;
    h.world_size = -1;
    {
        TraceWriter w;
        open_or_fail(w, path, h);
        w.close({});
    }
    Trace t = load_trace(path);
    CHECK(t.header.tool_version == "0123456789abcde");
    CHECK(t.header.rank == -1);
    CHECK(t.header.world_size == -1);
    CHECK(t.events.empty());
    CHECK(t.footer.has_value());
}

TEST_CASE("the writer clips over-long strings, stacks and build ids to the reader's limits") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    {
        TraceWriter w;
        open_or_fail(w, path, sample_header());
        w.string(1, std::string(kMaxStringBytes + 100, 'x'));
        std::vector<uint64_t> deep(kMaxStackDepth + 5);
        for (size_t i = 0; i < deep.size(); ++i)
            deep[i] = 0x400000 + i;
        w.stack(1, deep);
        ModuleRecord m;
        m.build_id = std::string(300, 'b');
        m.path = "/lib/libx.so";
        w.module(m);
        w.close({});
    }
    Trace t = load_trace(path);
    REQUIRE(t.strings.size() == 2);
    CHECK(t.strings[1].size() == kMaxStringBytes);
    REQUIRE(t.stacks.size() == 2);
    CHECK(t.stacks[1].size() == kMaxStackDepth);
    CHECK(t.stacks[1].back() == 0x400000 + kMaxStackDepth - 1);
    REQUIRE(t.modules.size() == 1);
    CHECK(t.modules[0].build_id == std::string(255, 'b'));
    CHECK(t.modules[0].path == "/lib/libx.so");
}

TEST_CASE("a trace whose writer was never closed is a readable prefix without a footer") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    write_sample_trace(path, /*with_footer=*/false);  // the destructor flushes

    Trace t = load_trace(path);
    CHECK(t.truncated);
    CHECK_FALSE(t.footer.has_value());
    CHECK(t.events.size() == kEventKindCount);
    const std::string size = std::to_string(fs::file_size(path));
    CHECK(t.truncation_message.find("without a footer") != std::string::npos);
    CHECK(t.truncation_message.find("at byte " + size) != std::string::npos);
}

TEST_CASE("a trace cut inside its header is rejected with the offset where it ends") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    write_sample_trace(full_path);
    const std::string full = read_bytes(full_path);
    const std::string path = dir.file("cut.trace");
    for (size_t cut = 0; cut < kTraceHeaderSize; ++cut) {
        CAPTURE(cut);
        write_bytes(path, full.substr(0, cut));
        const uint64_t offset = cut < sizeof kTraceMagic ? 0 : cut;
        check_error_at(path, offset, cut < sizeof kTraceMagic ? "too short" : "header cut short");
    }
}

TEST_CASE("a trace cut at a record boundary keeps every complete record") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    write_sample_trace(full_path);
    const std::string full = read_bytes(full_path);
    const std::vector<uint64_t> offsets = record_offsets(full_path);
    const std::string path = dir.file("cut.trace");

    // Each record start is a boundary; so is the end of the header.
    for (size_t kept = 0; kept < offsets.size(); ++kept) {
        const uint64_t cut = offsets[kept];
        CAPTURE(cut);
        write_bytes(path, full.substr(0, cut));

        TraceReader reader(path);
        size_t records = 0;
        TraceRecord r;
        while (reader.next(r))
            ++records;
        CHECK(records == kept);
        CHECK(reader.truncated());
        CHECK_FALSE(reader.complete());
        CHECK(reader.truncation_offset() == cut);
        CHECK(reader.truncation_message().find("without a footer") != std::string::npos);

        Trace t = load_trace(path);
        CHECK(t.truncated);
        CHECK_FALSE(t.footer.has_value());
    }
}

TEST_CASE("a trace cut inside a record keeps the records before it and points at the cut one") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    write_sample_trace(full_path);
    const std::string full = read_bytes(full_path);
    const std::vector<uint64_t> offsets = record_offsets(full_path);
    const std::string path = dir.file("cut.trace");

    // Every cut position inside every record, the last ones included.
    size_t cut_record = 0;
    for (uint64_t cut = kTraceHeaderSize; cut < full.size(); ++cut) {
        while (cut_record + 1 < offsets.size() && offsets[cut_record + 1] <= cut)
            ++cut_record;
        if (cut == offsets[cut_record]) continue;  // a boundary, see above
        CAPTURE(cut);
        write_bytes(path, full.substr(0, cut));

        TraceReader reader(path);
        std::vector<uint64_t> seen;
        TraceRecord r;
        while (reader.next(r))
            seen.push_back(r.offset);
        CHECK(seen.size() == cut_record);
        CHECK(reader.truncated());
        CHECK_FALSE(reader.complete());
        CHECK(reader.truncation_offset() == offsets[cut_record]);
        const std::string message = reader.truncation_message();
        CHECK(message.find("inside a record") != std::string::npos);
        CHECK(message.find(path) != std::string::npos);
        CHECK(message.find("at byte " + std::to_string(offsets[cut_record])) != std::string::npos);
    }
}

TEST_CASE("a flipped byte in any record's payload names the file and that record's offset") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    write_sample_trace(full_path);
    const std::string full = read_bytes(full_path);
    std::vector<uint64_t> offsets = record_offsets(full_path);
    offsets.push_back(full.size());
    const std::string path = dir.file("corrupt.trace");

    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        const uint64_t payload = offsets[i] + kRecordHeaderSize;
        for (uint64_t at = payload; at < offsets[i + 1]; at += 5) {
            CAPTURE(at);
            std::string bytes = full;
            bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
            write_bytes(path, bytes);
            check_error_at(path, offsets[i], "checksum mismatch");
        }
    }
}

TEST_CASE("a file that does not start with the magic is rejected at byte 0") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    write_sample_trace(path);
    std::string bytes = read_bytes(path);
    bytes[3] = 'X';
    write_bytes(path, bytes);
    check_error_at(path, 0, "bad magic");

    write_bytes(path, std::string(4096, '\0'));
    check_error_at(path, 0, "bad magic");
}

TEST_CASE("a trace of an unsupported format version is rejected naming the version") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    TraceHeader h = sample_header();
    h.format_version = kTraceFormatVersion + 1;  // a valid header of a newer format
    std::string bytes = encode_header(h);
    append_record(bytes, RecordType::footer, footer_payload());
    write_bytes(path, bytes);
    check_error_at(path, 8,
                   "unsupported trace format version " + std::to_string(kTraceFormatVersion + 1));
}

TEST_CASE("a header whose checksum does not match is rejected") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    write_sample_trace(path);
    const std::string good = read_bytes(path);
    for (size_t at : {size_t{12}, size_t{20}, size_t{33}, size_t{40}, size_t{50}, size_t{64},
                      kTraceHeaderSize - 1}) {
        CAPTURE(at);
        std::string bytes = good;
        bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
        write_bytes(path, bytes);
        check_error_at(path, 0, "corrupt header");
    }
}

TEST_CASE("a record of an unknown type is rejected at its offset") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    const std::string header = encode_header(sample_header());
    const std::string string_record = record(RecordType::string, std::string("\x01\0\0\0ab", 6));
    for (uint16_t type : {uint16_t{0}, uint16_t{7}, uint16_t{0xFFFF}}) {
        CAPTURE(type);
        std::string bad = record(RecordType::string, "");  // a valid empty record...
        bad[0] = static_cast<char>(type & 0xFF);           // ...of another type
        bad[1] = static_cast<char>(type >> 8);
        write_bytes(path, header + string_record + bad);
        check_error_at(path, kTraceHeaderSize + string_record.size(),
                       "unknown record type " + std::to_string(type));
    }
    // The reserved half-word after the type must be zero.
    std::string bad = record(RecordType::footer, footer_payload());
    bad[2] = 1;
    write_bytes(path, header + bad);
    check_error_at(path, kTraceHeaderSize, "unknown record type");
}

TEST_CASE("an absurd record length is rejected without allocating it") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    const std::string header = encode_header(sample_header());
    for (uint32_t length : {kMaxRecordPayload + 1, 0xFFFFFFFFu}) {
        CAPTURE(length);
        std::string bad;
        put_u16(bad, static_cast<uint16_t>(RecordType::string));
        put_u16(bad, 0);
        put_u32(bad, length);
        put_u32(bad, 0);
        bad += std::string(64, 'z');
        write_bytes(path, header + bad);

        g_largest_allocation = 0;
        g_track_allocations = true;
        TraceError e = read_error(path);
        g_track_allocations = false;
        CHECK(e.offset() == kTraceHeaderSize);
        CHECK(std::string(e.what()).find("exceeds the limit") != std::string::npos);
        CHECK(g_largest_allocation.load() < kMaxRecordPayload);
    }
}

TEST_CASE("events whose seq does not strictly increase are rejected at the offending event") {
    TempDir dir;
    for (uint64_t second_seq : {uint64_t{4}, uint64_t{5}}) {
        CAPTURE(second_seq);
        const std::string path = dir.file("seq" + std::to_string(second_seq) + ".trace");
        {
            TraceWriter w;
            open_or_fail(w, path, sample_header());
            Event e;
            e.seq = 5;
            w.event(e);
            e.seq = second_seq;
            w.event(e);
            w.close({});
        }
        const uint64_t second = kTraceHeaderSize + kRecordHeaderSize + kEventPayloadSize;
        check_error_at(path, second, "sequence goes backwards");
    }
}

TEST_CASE("an event that refers to an undefined string, stack or param is rejected") {
    TempDir dir;
    struct Case {
        const char* name;
        Event event;
    };
    std::vector<Case> cases;
    auto add = [&](const char* name, auto&& mutate) {
        Event e;
        e.seq = 1;
        mutate(e);
        cases.push_back({name, e});
    };
    // The trace below defines strings 1..2, stack 1 and param 0.
    add("layer", [](Event& e) { e.layer = 3; });
    add("phase", [](Event& e) { e.phase = 99; });
    add("stack", [](Event& e) { e.stack = 2; });
    add("mark text", [](Event& e) {
        e.kind = EventKind::mark;
        e.aux = 3;
    });
    add("param", [](Event& e) {
        e.kind = EventKind::param;
        e.aux = 1;
    });
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const std::string path = dir.file(std::string("undefined-") + c.name + ".trace");
        uint64_t event_offset = 0;
        {
            TraceWriter w;
            open_or_fail(w, path, sample_header());
            w.string(1, "a");
            w.string(2, "b");
            w.stack(1, std::vector<uint64_t>{1, 2, 3});
            ParamRecord p;
            p.layer = 1;
            p.name = 2;
            w.param(p);
            Event ok = c.event;  // the same event with every reference defined
            ok.layer = 2;
            ok.phase = 2;
            ok.stack = 1;
            ok.aux = ok.kind == EventKind::param ? 0 : 2;
            w.event(ok);
            w.flush();
            event_offset = fs::file_size(path);
            Event bad = c.event;
            bad.seq = 2;
            w.event(bad);
            w.close({});
        }
        check_error_at(path, event_offset, "undefined string, stack or param");
    }
}

TEST_CASE("definitions out of order or referring to undefined strings are rejected") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    const std::string header = encode_header(sample_header());

    std::string string2;
    put_u32(string2, 2);
    write_bytes(path, header + record(RecordType::string, string2 + "skips id 1"));
    check_error_at(path, kTraceHeaderSize, "string ids out of order");

    std::string stack2;
    put_u32(stack2, 2);
    put_u32(stack2, 0);
    write_bytes(path, header + record(RecordType::stack, stack2));
    check_error_at(path, kTraceHeaderSize, "stack ids out of order");

    std::string lying_depth;
    put_u32(lying_depth, 1);
    put_u32(lying_depth, 3);
    put_u64(lying_depth, 0x1000);
    write_bytes(path, header + record(RecordType::stack, lying_depth));
    check_error_at(path, kTraceHeaderSize, "invalid depth");

    std::string param;
    for (uint32_t v : {0u, 1u, 0u, 0u})
        put_u32(param, v);  // layer string 1 is undefined
    put_u64(param, 1);
    put_u64(param, 1);
    write_bytes(path, header + record(RecordType::param, param));
    check_error_at(path, kTraceHeaderSize, "param refers to an undefined string");
}

TEST_CASE("bytes after the footer are rejected at the first extra byte") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    write_sample_trace(path);
    const uint64_t end = fs::file_size(path);
    {
        std::ofstream out(path, std::ios::binary | std::ios::app);
        out << "x";
    }
    check_error_at(path, end, "data after the footer");
}

TEST_CASE("opening a trace refuses an existing file and leaves it untouched") {
    TempDir dir;
    const std::string path = dir.file("existing.trace");
    write_bytes(path, "precious");
    TraceWriter w;
    std::string error;
    errno = 0;
    CHECK_FALSE(w.open(path, sample_header(), error));
    CHECK(errno == EEXIST);
    CHECK_FALSE(w.is_open());
    CHECK(error.find(path) != std::string::npos);
    CHECK(error.find(std::strerror(EEXIST)) != std::string::npos);
    CHECK(read_bytes(path) == "precious");
}

TEST_CASE("opening a trace refuses a planted symlink, dangling or not") {
    TempDir dir;
    const std::string victim = dir.file("victim");
    write_bytes(victim, "precious");
    const std::string dangling_target = dir.file("not-created");
    for (const std::string& target : {victim, dangling_target}) {
        CAPTURE(target);
        const std::string link = dir.file("link.trace");
        fs::remove(link);
        fs::create_symlink(target, link);
        TraceWriter w;
        std::string error;
        CHECK_FALSE(w.open(link, sample_header(), error));
        CHECK_FALSE(w.is_open());
        CHECK(error.find(link) != std::string::npos);
    }
    CHECK(read_bytes(victim) == "precious");
    CHECK_FALSE(fs::exists(dangling_target));
}

TEST_CASE("a trace file is created readable and writable by its owner only") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    const mode_t old_umask = ::umask(0);  // the mode must not depend on the umask
    {
        TraceWriter w;
        std::string error;
        const bool opened = w.open(path, sample_header(), error);
        ::umask(old_umask);
        REQUIRE_MESSAGE(opened, error);
        CHECK(w.is_open());
        CHECK(w.path() == path);
        w.close({});
        CHECK_FALSE(w.is_open());
    }
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
}

TEST_CASE("opening a trace under a path whose parent is a regular file fails with ENOTDIR") {
    TempDir dir;
    const std::string parent = dir.file("plain-file");
    write_bytes(parent, "x");
    const std::string path = parent + "/t.trace";
    TraceWriter w;
    std::string error;
    errno = 0;
    CHECK_FALSE(w.open(path, sample_header(), error));
    CHECK(errno == ENOTDIR);
    CHECK(error.find("cannot create trace file " + path) != std::string::npos);
    CHECK(error.find(std::strerror(ENOTDIR)) != std::string::npos);
    // Records handed to a writer that never opened are dropped, not written.
    w.event(Event{});
    w.string(1, "x");
    CHECK(w.dropped_records() == 2);
    CHECK(w.events_written() == 0);
}

TEST_CASE("records after close are dropped and the file keeps exactly one footer") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    TraceWriter w;
    open_or_fail(w, path, sample_header());
    Event e;
    e.seq = 1;
    w.event(e);
    CHECK(w.events_written() == 1);
    w.close({});
    e.seq = 2;
    w.event(e);
    w.close({});
    CHECK(w.dropped_records() == 1);
    CHECK(w.events_written() == 1);
    Trace t = load_trace(path);
    CHECK(t.events.size() == 1);
    CHECK(t.footer.has_value());
}

TEST_CASE("a failed write marks the writer failed, names the file and drops later records") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    // Works as root too: a file size limit makes write() fail with EFBIG once
    // SIGXFSZ is ignored.
    constexpr rlim_t kLimit = 4096;
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_limit;
    small.rlim_cur = kLimit;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);

    TraceWriter w;
    std::string error;
    const bool opened = w.open(path, sample_header(), error);
    constexpr int kEvents = 100;  // 9600 bytes of records, more than the limit
    for (int i = 0; i < kEvents; ++i) {
        Event e;
        e.seq = static_cast<uint64_t>(i + 1);
        w.event(e);
    }
    w.flush();
    const bool failed = w.failed();
    w.event(Event{});
    w.close({});
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);

    REQUIRE_MESSAGE(opened, error);
    CHECK(failed);
    CHECK(w.error().find("cannot write trace file " + path) != std::string::npos);
    CHECK(w.error().find(std::strerror(EFBIG)) != std::string::npos);
    CHECK(w.dropped_records() == 2);  // the event and the footer after the failure
    CHECK(fs::file_size(path) == kLimit);

    // What reached the disk is still a readable prefix.
    Trace t = load_trace(path);
    CHECK(t.truncated);
    const size_t record = kRecordHeaderSize + kEventPayloadSize;
    CHECK(t.events.size() == (kLimit - kTraceHeaderSize) / record);
    CHECK(t.truncation_message.find("inside a record") != std::string::npos);
}

TEST_CASE("an open whose header cannot be written fails and leaves the writer closed") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit tiny = old_limit;
    tiny.rlim_cur = 16;  // less than a header
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &tiny) == 0);
    TraceWriter w;
    std::string error;
    const bool opened = w.open(path, sample_header(), error);
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);

    CHECK_FALSE(opened);
    CHECK_FALSE(w.is_open());
    CHECK(w.failed());
    CHECK(error.find("cannot write trace file " + path) != std::string::npos);
    w.event(Event{});
    CHECK(w.events_written() == 0);
    CHECK(w.dropped_records() == 1);
}
