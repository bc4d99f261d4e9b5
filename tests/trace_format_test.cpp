// The trace format (core/trace_format.h, trace_writer.h, trace_reader.h):
// round trips of every record and event kind, event blocks, versions 1 and
// 2 still read, and every way a damaged or hostile file is rejected with its
// offset. Longer than 600 lines: it is the format's whole specification,
// and its cases share one set of sample records and damage helpers.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "support.h"
#include "trace_format.h"
#include "trace_reader.h"
#include "trace_writer.h"

using namespace allocscope;
using allocscope::test::TempDir;
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
// Not inlined: GCC would otherwise see free() of operator new's memory and
// warn (-Wmismatched-new-delete).
__attribute__((noinline)) void operator delete(void* p) noexcept {
    std::free(p);
}
__attribute__((noinline)) void operator delete[](void* p) noexcept {
    std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept {
    std::free(p);
}
__attribute__((noinline)) void operator delete[](void* p, size_t) noexcept {
    std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}
__attribute__((noinline)) void operator delete[](void* p, const std::nothrow_t&) noexcept {
    std::free(p);
}

namespace {

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
        EventKind::param, EventKind::mark,     EventKind::derived};
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
        // A derived event's stream is its text: a defined string.
        e.stream = kinds[i] == EventKind::derived ? kMarkText : 0x5eed0000ull + i;
        e.step = 90000 + i;
        e.tid = 31337 + i;
        e.layer = kLayer;
        e.phase = kPhase;
        e.stack = 1 + i % 3;
        e.aux = kinds[i] == EventKind::mark                                      ? kMarkText
                : kinds[i] == EventKind::param || kinds[i] == EventKind::derived ? 0
                                                                                 : 77 + i;
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

// Writes the definitions the sample events need.
void write_sample_definitions(TraceWriter& w) {
    for (uint32_t id = 1; id < kStrings.size(); ++id)
        w.string(id, kStrings[id]);
    for (uint32_t id = 1; id < kStacks.size(); ++id)
        w.stack(id, kStacks[id]);
    w.module(sample_module());
    w.param(sample_param());
}

// Writes the definitions the sample events need, then the events.
void write_sample_body(TraceWriter& w) {
    write_sample_definitions(w);
    for (const Event& e : sample_events())
        w.event(e);
}

// A complete trace of `header`, the sample definitions and `events`.
void write_trace_of(const std::string& path, const TraceHeader& header,
                    const std::vector<Event>& events) {
    TraceWriter w;
    open_or_fail(w, path, header);
    write_sample_definitions(w);
    for (const Event& e : events)
        w.event(e);
    w.close(sample_footer());
}

void write_sample_trace(const std::string& path, bool with_footer = true) {
    TraceWriter w;
    open_or_fail(w, path, sample_header());
    write_sample_body(w);
    if (with_footer) w.close(sample_footer());
}

// Byte offsets of every record of a valid trace, in file order (the events
// of one block share its offset: it is listed once).
std::vector<uint64_t> record_offsets(const std::string& path) {
    TraceReader reader(path);
    std::vector<uint64_t> offsets;
    TraceRecord r;
    while (reader.next(r)) {
        if (offsets.empty() || offsets.back() != r.offset) offsets.push_back(r.offset);
    }
    return offsets;
}

// How many distinct records the reader reports before it stops.
size_t count_records(TraceReader& reader) {
    size_t records = 0;
    uint64_t last = 0;
    TraceRecord r;
    while (reader.next(r)) {
        if (records == 0 || r.offset != last) ++records;
        last = r.offset;
    }
    return records;
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
    // The events, written without a flush, share one block: its offset.
    const size_t first_event = types.size() - 1 - kEventKindCount;
    for (size_t i = first_event; i < first_event + kEventKindCount; ++i)
        CHECK(offsets[i] == offsets[first_event]);
    CHECK(offsets[first_event] > offsets[first_event - 1]);
    CHECK(offsets.back() > offsets[first_event]);
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
        CHECK(count_records(reader) == kept);
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
        CHECK(count_records(reader) == cut_record);
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
    // Type 1 (a single event) exists in version 1 traces only.
    for (uint16_t type : {uint16_t{0}, uint16_t{1}, uint16_t{8}, uint16_t{0xFFFF}}) {
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

TEST_CASE("events whose seq does not strictly increase are rejected at the offending block") {
    TempDir dir;
    for (bool same_block : {true, false}) {
        for (uint64_t second_seq : {uint64_t{4}, uint64_t{5}}) {
            CAPTURE(same_block);
            CAPTURE(second_seq);
            const std::string path = dir.file("seq" + std::to_string(second_seq) +
                                              (same_block ? "same" : "next") + ".trace");
            uint64_t second = kTraceHeaderSize;
            {
                TraceWriter w;
                open_or_fail(w, path, sample_header());
                Event e;
                e.seq = 5;
                w.event(e);
                if (!same_block) {
                    w.flush();
                    second = fs::file_size(path);
                    CHECK(second > kTraceHeaderSize);
                }
                e.seq = second_seq;
                w.event(e);
                w.close({});
            }
            check_error_at(path, second, "sequence goes backwards");
        }
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
    add("derived param", [](Event& e) {
        e.kind = EventKind::derived;
        e.aux = 1;
    });
    add("derived text", [](Event& e) {
        e.kind = EventKind::derived;
        e.stream = 3;
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
            ok.aux = ok.kind == EventKind::param || ok.kind == EventKind::derived ? 0 : 2;
            if (ok.kind == EventKind::derived) ok.stream = 2;
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

// Events whose addresses, sizes and times do not compress well (about 20
// bytes each in a block), `seq` 1, 2, ...
std::vector<Event> noisy_events(size_t n) {
    std::mt19937_64 rng(12345);
    std::vector<Event> events(n);
    for (size_t i = 0; i < n; ++i) {
        events[i].seq = i + 1;
        events[i].t_ns = rng() >> 20;
        events[i].address = rng();
        events[i].size = rng() >> 30;
    }
    return events;
}

TEST_CASE("a failed write marks the writer failed, names the file and drops later records") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    // 10 blocks of 25 events, flushed one by one as the interposer does.
    constexpr size_t kEvents = 250;
    constexpr size_t kPerFlush = 25;
    const std::vector<Event> events = noisy_events(kEvents);
    // The same trace without a size limit: where its blocks end.
    const std::string reference = dir.file("reference.trace");
    {
        TraceWriter w;
        open_or_fail(w, reference, sample_header());
        for (size_t i = 0; i < kEvents; ++i) {
            w.event(events[i]);
            if ((i + 1) % kPerFlush == 0) w.flush();
        }
        w.close({});
    }
    std::vector<uint64_t> block_ends = record_offsets(reference);
    block_ends.erase(block_ends.begin());  // the end of a block is the next record's start
    REQUIRE(block_ends.size() == kEvents / kPerFlush);

    // Works as root too: a file size limit makes write() fail with EFBIG once
    // SIGXFSZ is ignored.
    constexpr rlim_t kLimit = 4096;
    REQUIRE(block_ends.back() > kLimit);
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_limit;
    small.rlim_cur = kLimit;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);

    TraceWriter w;
    std::string error;
    const bool opened = w.open(path, sample_header(), error);
    size_t failed_after = 0;  // events handed over when the failure showed
    for (size_t i = 0; i < kEvents; ++i) {
        w.event(events[i]);
        if ((i + 1) % kPerFlush == 0) w.flush();
        if (w.failed() && failed_after == 0) failed_after = i + 1;
    }
    w.close({});
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);

    REQUIRE_MESSAGE(opened, error);
    CHECK(w.failed());
    CHECK(w.error().find("cannot write trace file " + path) != std::string::npos);
    CHECK(w.error().find(std::strerror(EFBIG)) != std::string::npos);
    // The events after the failing flush and the footer were dropped.
    REQUIRE(failed_after > 0);
    CHECK(failed_after % kPerFlush == 0);
    CHECK(w.dropped_records() == kEvents - failed_after + 1);
    CHECK(w.events_written() == failed_after);
    CHECK(fs::file_size(path) == kLimit);

    // What reached the disk is still a readable prefix: every block that fit.
    size_t complete_blocks = 0;
    while (block_ends[complete_blocks] <= kLimit)
        ++complete_blocks;
    Trace t = load_trace(path);
    CHECK(t.truncated);
    REQUIRE(t.events.size() == complete_blocks * kPerFlush);
    for (size_t i = 0; i < t.events.size(); ++i)
        CHECK(t.events[i].address == events[i].address);
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

// --- event blocks (format version 2) and version 1 compatibility ------------------

namespace {

bool same_event(const Event& a, const Event& b) {
    return a.seq == b.seq && a.t_ns == b.t_ns && a.address == b.address && a.size == b.size &&
           a.stream == b.stream && a.step == b.step && a.tid == b.tid && a.layer == b.layer &&
           a.phase == b.phase && a.stack == b.stack && a.aux == b.aux && a.flags == b.flags &&
           a.device == b.device && a.result == b.result && a.kind == b.kind && a.level == b.level &&
           a.memory == b.memory && a.api == b.api;
}

// Compares field by field; reports the first differing event in detail.
void check_same_events(const std::vector<Event>& got, const std::vector<Event>& want) {
    REQUIRE(got.size() == want.size());
    size_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (same_event(got[i], want[i])) continue;
        if (differing++ == 0) {
            CAPTURE(i);
            check_same(got[i], want[i]);
        }
    }
    CHECK(differing == 0);
}

// Offsets of the event blocks of a valid trace and how many events each holds.
std::vector<std::pair<uint64_t, size_t>> event_blocks(const std::string& path) {
    TraceReader reader(path);
    std::vector<std::pair<uint64_t, size_t>> blocks;
    TraceRecord r;
    while (reader.next(r)) {
        if (r.type != RecordType::event) continue;
        if (blocks.empty() || blocks.back().first != r.offset) blocks.emplace_back(r.offset, 0);
        ++blocks.back().second;
    }
    return blocks;
}

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> values) {
    return values.begin()[rng() % values.size()];
}

// Random events over the whole range of every field: extreme values, seq
// gaps, big and negative deltas, every kind, level, memory kind and api.
// References stay below `strings`, `stacks` and `params`.
Event random_event(std::mt19937_64& rng, const Event& prev, uint32_t strings, uint32_t stacks,
                   uint32_t params) {
    auto u64 = [&](const Event& p, uint64_t Event::*field) -> uint64_t {
        switch (rng() % 8) {
            case 0:
                return 0;
            case 1:
                return UINT64_MAX;
            case 2:
                return rng();  // any 64 bits
            case 3:
                return p.*field - (rng() % 100000);  // backwards, wrapping below 0
            case 4:
                return uint64_t{1} << (rng() % 64);
            case 5:
                return (rng() % 100000) << 9;  // allocator-rounded
            case 6:
                return p.*field;
            default:
                return p.*field + (rng() % 4096);
        }
    };
    auto i32 = [&]() -> int32_t {
        return pick<int32_t>(rng, {0, -1, 1, 7, -2, INT32_MIN, INT32_MAX,
                                   static_cast<int32_t>(static_cast<uint32_t>(rng()))});
    };
    Event e = prev;
    e.seq = prev.seq + pick<uint64_t>(rng, {1, 1, 1, 2, 1000, uint64_t{1} << 40});
    e.t_ns = u64(prev, &Event::t_ns);
    e.address = u64(prev, &Event::address);
    e.size = rng() % 7 == 0 ? (uint64_t{1} << 63) + 5 : u64(prev, &Event::size);
    if (rng() % 4 == 0) e.stream = u64(prev, &Event::stream);
    if (rng() % 4 == 0) e.step = u64(prev, &Event::step);
    if (rng() % 4 == 0) e.tid = pick<uint32_t>(rng, {0, 1, UINT32_MAX, uint32_t(rng())});
    if (rng() % 3 == 0) e.layer = static_cast<uint32_t>(rng() % strings);
    if (rng() % 3 == 0) e.phase = rng() % 2 ? 0 : static_cast<uint32_t>(strings - 1);
    if (rng() % 3 == 0) e.stack = static_cast<uint32_t>(rng() % stacks);
    if (rng() % 4 == 0) e.flags = pick<uint32_t>(rng, {0, 1, 7, UINT32_MAX, uint32_t(rng())});
    if (rng() % 4 == 0) e.device = i32();
    if (rng() % 4 == 0) e.result = i32();
    e.kind = static_cast<EventKind>(1 + rng() % kEventKindCount);
    if (rng() % 3 == 0) e.level = static_cast<Level>(rng() % 3);
    if (rng() % 3 == 0) e.memory = static_cast<MemoryKind>(rng() % 4);
    if (rng() % 3 == 0) e.api = static_cast<Api>(rng() % kApiCount);
    if (e.kind == EventKind::param || e.kind == EventKind::derived) {
        e.aux = static_cast<uint32_t>(rng() % params);
        // A derived event's stream is its text's string id.
        if (e.kind == EventKind::derived) e.stream = rng() % strings;
    } else if (e.kind == EventKind::mark) {
        e.aux = static_cast<uint32_t>(rng() % strings);
    } else if (rng() % 4 == 0) {
        e.aux = pick<uint32_t>(rng, {0, UINT32_MAX, uint32_t(rng())});
    }
    return e;
}

}  // namespace

TEST_CASE("random events with extreme values survive blocks and flushes field by field") {
    TempDir dir;
    const std::string path = dir.file("random.trace");
    std::mt19937_64 rng(20240611);
    std::vector<Event> written;
    uint32_t strings = 1, stacks = 1, params = 0;
    size_t flushes = 0;
    {
        TraceWriter w;
        open_or_fail(w, path, sample_header());
        Event prev;
        prev.seq = 0;
        for (int round = 0; round < 40; ++round) {
            // New definitions between events, used from then on; every
            // fourth round they come while a block is open (no flush before).
            for (int k = 0; k < 3; ++k) {
                w.string(strings, "s" + std::to_string(strings));
                ++strings;
            }
            w.stack(stacks++, std::vector<uint64_t>{rng(), rng()});
            ParamRecord p;
            p.index = params++;
            w.param(p);
            // Mostly short runs between flushes; one run long enough to fill
            // several blocks without a flush.
            const size_t run = round == 20 ? 3 * kMaxBlockEvents + 17 : 1 + rng() % 300;
            for (size_t i = 0; i < run; ++i) {
                Event e = random_event(rng, prev, strings, stacks, params);
                w.event(e);
                written.push_back(e);
                prev = e;
            }
            if (round % 4 != 3) {
                w.flush();
                ++flushes;
            }
        }
        // The largest seq there is, right after a huge gap.
        Event last = written.back();
        last.seq = UINT64_MAX;
        last.t_ns = 0;
        w.event(last);
        written.push_back(last);
        CHECK(w.events_written() == written.size());
        w.close({});
    }
    Trace t = load_trace(path);
    CHECK_FALSE(t.truncated);
    check_same_events(t.events, written);

    // The long run took at least 4 blocks; these events are so noisy that a
    // block reaches its byte limit before its event limit.
    const auto blocks = event_blocks(path);
    CHECK(blocks.size() >= flushes + 4);
    const std::vector<uint64_t> offsets = record_offsets(path);  // blocks, then the footer
    REQUIRE(offsets.size() >= blocks.size() + 1);
    size_t total = 0, by_bytes = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        const auto& [offset, count] = blocks[i];
        CHECK(count <= kMaxBlockEvents);
        total += count;
        const auto next = std::upper_bound(offsets.begin(), offsets.end(), offset);
        REQUIRE(next != offsets.end());
        const uint64_t payload = *next - offset - kRecordHeaderSize;
        CHECK(payload <= 2 + kBlockTargetPayload + kMaxEncodedEventSize);
        if (payload >= kBlockTargetPayload) ++by_bytes;
    }
    CHECK(total == written.size());
    CHECK(by_bytes >= 1);
}

TEST_CASE("a block of 4096 events is written as soon as it is full") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    {
        TraceWriter w;
        open_or_fail(w, path, sample_header());
        Event e;
        for (uint32_t i = 1; i <= 2 * kMaxBlockEvents + 1; ++i) {
            e.seq = i;
            e.t_ns = 1000ull * i;
            w.event(e);
        }
        w.close({});
    }
    const auto blocks = event_blocks(path);
    REQUIRE(blocks.size() == 3);
    CHECK(blocks[0].second == kMaxBlockEvents);
    CHECK(blocks[1].second == kMaxBlockEvents);
    CHECK(blocks[2].second == 1);
    CHECK(blocks[0].first == kTraceHeaderSize);
}

TEST_CASE("a trace cut anywhere inside its last block keeps the events of the blocks before") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    std::mt19937_64 rng(7);
    std::vector<Event> events;
    uint64_t last_block = 0, footer = 0;
    size_t before_last = 0;
    {
        TraceWriter w;
        open_or_fail(w, full_path, sample_header());
        w.string(1, "layer");
        w.stack(1, std::vector<uint64_t>{0x401000});
        w.param(ParamRecord{0, 1, 1, 1, 10, 10});
        Event prev;
        for (int block = 0; block < 4; ++block) {
            if (block == 3) {
                w.flush();
                last_block = fs::file_size(full_path);
                before_last = events.size();
            }
            for (int i = 0; i < 40; ++i) {
                prev = random_event(rng, prev, 2, 2, 1);
                events.push_back(prev);
                w.event(prev);
            }
        }
        w.flush();
        footer = fs::file_size(full_path);
        w.close({});
    }
    REQUIRE(before_last == 120);
    REQUIRE(last_block > kTraceHeaderSize);
    REQUIRE(footer > last_block + kRecordHeaderSize + 40);
    const std::vector<Event> prefix(events.begin(), events.begin() + before_last);
    const std::string full = read_bytes(full_path);
    const std::string path = dir.file("cut.trace");

    for (uint64_t cut = last_block; cut <= footer; ++cut) {
        CAPTURE(cut);
        write_bytes(path, full.substr(0, cut));
        Trace t = load_trace(path);
        CHECK(t.truncated);
        CHECK_FALSE(t.footer.has_value());
        if (cut < footer) {
            check_same_events(t.events, prefix);
            CHECK(t.truncation_message.find(cut == last_block
                                                ? "without a footer"
                                                : "cut off inside a record") != std::string::npos);
            CHECK(t.truncation_message.find("at byte " + std::to_string(last_block)) !=
                  std::string::npos);
        } else {
            check_same_events(t.events, events);  // the last block is complete
        }
    }
}

TEST_CASE("a flipped byte in an event block is a checksum error at the block's offset") {
    TempDir dir;
    const std::string full_path = dir.file("full.trace");
    std::mt19937_64 rng(99);
    {
        TraceWriter w;
        open_or_fail(w, full_path, sample_header());
        Event prev;
        for (int i = 0; i < 200; ++i) {
            prev = random_event(rng, prev, 1, 1, 1);
            if (prev.kind == EventKind::param || prev.kind == EventKind::derived)
                prev.kind = EventKind::alloc;
            w.event(prev);
            if (i == 99) w.flush();
        }
        w.close({});
    }
    const auto blocks = event_blocks(full_path);
    REQUIRE(blocks.size() == 2);
    const uint64_t second = blocks[1].first;
    const std::string full = read_bytes(full_path);
    const std::string path = dir.file("flipped.trace");
    // The checksum and the payload (the count, then events).
    for (uint64_t at = second + 8; at < second + 400 && at < full.size() - 60; at += 3) {
        CAPTURE(at);
        std::string bytes = full;
        bytes[at] = static_cast<char>(bytes[at] ^ 0x04);
        write_bytes(path, bytes);
        check_error_at(path, second, "checksum mismatch");
        // The block before it still reads.
        TraceReader reader(path);
        TraceRecord r;
        size_t events = 0;
        try {
            while (reader.next(r))
                ++events;
        } catch (const TraceError&) {
        }
        CHECK(events == blocks[0].second);
    }
}

TEST_CASE("a malformed event block with a valid checksum is an error naming its offset") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    const std::string header = encode_header(sample_header());
    // Two valid events as the encoder writes them.
    EventBlockEncoder encoder;
    encoder.reserve();
    Event e;
    e.seq = 1;
    e.t_ns = 1000;
    e.address = 0x7f0000001000;
    e.size = 4096;
    e.level = Level::block;
    e.memory = MemoryKind::device;
    e.api = Api::block_alloc;
    e.device = 0;
    encoder.add(e);
    e.seq = 2;
    e.kind = EventKind::free;
    e.api = Api::block_free;
    encoder.add(e);
    const std::string valid(encoder.payload());
    REQUIRE(valid.size() > 6);
    {
        write_bytes(path, header + record(RecordType::event_block, valid));
        Trace t = load_trace(path);
        REQUIRE(t.events.size() == 2);
        CHECK(t.events[1].kind == EventKind::free);
        CHECK(t.events[1].address == 0x7f0000001000);
    }
    auto with_count = [](std::string payload, uint16_t count) {
        payload[0] = static_cast<char>(count & 0xFF);
        payload[1] = static_cast<char>(count >> 8);
        return payload;
    };
    struct Case {
        const char* name;
        std::string payload;
        const char* problem;
    };
    const std::string ok_count = valid.substr(0, 2);
    const std::vector<Case> cases = {
        {"empty", "", "event block too short"},
        {"count 0", with_count(valid, 0), "invalid event count (0)"},
        {"count above the limit", with_count(valid, kMaxBlockEvents + 1),
         "invalid event count (4097)"},
        {"more events counted than held", with_count(valid, 3),
         "event block ends after 2 of its 3 events"},
        {"fewer events counted than held", with_count(valid, 1), "bytes after its 1 events"},
        {"the last value cut short", valid.substr(0, valid.size() - 1),
         "runs past the end of the block (event 2 of 2)"},
        // b0: alloc with b1; b1: layer; t_ns 0; layer: a 35-bit value.
        {"a 32-bit field out of range",
         with_count(std::string("xx\x81\x01\x00\xFF\xFF\xFF\xFF\x1F", 10), 1),
         "a 32-bit field is out of range (event 1 of 1)"},
        // b0: alloc, t_ns: 11 bytes of continuation.
        {"a varint longer than 10 bytes",
         with_count("xx\x01" + std::string(10, '\xFF') + "\x01", 1), "too large for 64 bits"},
        // b0: alloc with b1 and b2; b2 has a reserved bit.
        {"reserved bits", with_count(std::string("xx\x81\x80\x40\x00", 6), 1),
         "reserved bits are set"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const std::string string_record = record(RecordType::string, std::string("\x01\0\0\0a", 5));
        write_bytes(path, header + string_record + record(RecordType::event_block, c.payload));
        check_error_at(path, kTraceHeaderSize + string_record.size(), c.problem);
    }
}

TEST_CASE("a version 1 trace with one record per event still reads") {
    TempDir dir;
    const std::string path = dir.file("v1.trace");
    TraceHeader h = sample_header();
    h.format_version = 1;
    std::string bytes = encode_header(h);
    for (uint32_t id = 1; id < kStrings.size(); ++id) {
        std::string p;
        put_u32(p, id);
        append_record(bytes, RecordType::string, p + kStrings[id]);
    }
    for (uint32_t id = 1; id < kStacks.size(); ++id) {
        std::string p;
        put_u32(p, id);
        put_u32(p, static_cast<uint32_t>(kStacks[id].size()));
        for (uint64_t f : kStacks[id])
            put_u64(p, f);
        append_record(bytes, RecordType::stack, p);
    }
    {
        const ParamRecord param = sample_param();
        std::string p;
        for (uint32_t v : {param.index, param.layer, param.name, param.dtype})
            put_u32(p, v);
        put_u64(p, param.numel);
        put_u64(p, param.sharded_numel);
        append_record(bytes, RecordType::param, p);
    }
    std::vector<uint64_t> event_offsets;
    // Every kind but derived, which came with version 3.
    std::vector<Event> events = sample_events();
    const Event derived = events.back();
    REQUIRE(derived.kind == EventKind::derived);
    events.pop_back();
    for (const Event& e : events) {
        event_offsets.push_back(bytes.size());
        uint8_t payload[kEventPayloadSize];
        encode_event(payload, e);
        append_record(bytes, RecordType::event, {reinterpret_cast<char*>(payload), sizeof payload});
    }
    const std::string footer = footer_payload();
    append_record(bytes, RecordType::footer, footer);
    write_bytes(path, bytes);

    Trace t = load_trace(path);
    CHECK(t.header.format_version == 1);
    CHECK(t.header.pid == h.pid);
    CHECK_FALSE(t.truncated);
    CHECK(t.footer.has_value());
    CHECK(t.strings == kStrings);
    CHECK(t.stacks == kStacks);
    REQUIRE(t.params.size() == 1);
    check_same_events(t.events, events);

    // One record per event, each at its own offset.
    TraceReader reader(path);
    std::vector<uint64_t> offsets;
    TraceRecord r;
    while (reader.next(r)) {
        if (r.type == RecordType::event) offsets.push_back(r.offset);
    }
    CHECK(offsets == event_offsets);

    // Its checks still hold: an event record cut short is a truncated trace.
    write_bytes(path, bytes.substr(0, event_offsets[3] + 40));
    Trace cut = load_trace(path);
    CHECK(cut.truncated);
    CHECK(cut.events.size() == 3);
    CHECK(cut.truncation_message.find("at byte " + std::to_string(event_offsets[3])) !=
          std::string::npos);

    // A derived event is not a version 1 kind.
    {
        std::string with_derived = bytes.substr(0, event_offsets.back());
        const uint64_t offset = with_derived.size();
        uint8_t payload[kEventPayloadSize];
        Event e = derived;
        e.seq = events.back().seq + 1;
        encode_event(payload, events.back());
        append_record(with_derived, RecordType::event,
                      {reinterpret_cast<char*>(payload), sizeof payload});
        encode_event(payload, e);
        append_record(with_derived, RecordType::event,
                      {reinterpret_cast<char*>(payload), sizeof payload});
        write_bytes(path, with_derived);
        check_error_at(path, offset + kRecordHeaderSize + kEventPayloadSize,
                       "event of kind derived in a version 1 trace");
    }

    // Event blocks belong to version 2 only.
    std::string with_block = bytes.substr(0, event_offsets[0]);
    EventBlockEncoder encoder;
    encoder.reserve();
    encoder.add(events[0]);
    append_record(with_block, RecordType::event_block, encoder.payload());
    write_bytes(path, with_block);
    check_error_at(path, event_offsets[0], "unknown record type 7");
}

TEST_CASE("a trace of format version 0 or above the current one is rejected") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    for (uint32_t version : {0u, kTraceFormatVersion + 1, 0xFFFFFFFFu}) {
        CAPTURE(version);
        TraceHeader h = sample_header();
        h.format_version = version;
        std::string bytes = encode_header(h);
        append_record(bytes, RecordType::footer, footer_payload());
        write_bytes(path, bytes);
        check_error_at(path, 8, "unsupported trace format version " + std::to_string(version));
    }
    CHECK(kTraceFormatVersion == 5);
}

TEST_CASE("a version 2 trace still reads, and a derived event in one is rejected") {
    TempDir dir;
    const std::string path = dir.file("v2.trace");
    TraceHeader h = sample_header();
    h.format_version = 2;
    std::vector<Event> events = sample_events();
    const Event derived = events.back();
    REQUIRE(derived.kind == EventKind::derived);
    events.pop_back();
    write_trace_of(path, h, events);
    Trace t = load_trace(path);
    CHECK(t.header.format_version == 2);
    CHECK_FALSE(t.truncated);
    check_same_events(t.events, events);

    uint64_t offset = 0;
    {
        TraceWriter w;
        fs::remove(path);
        open_or_fail(w, path, h);
        write_sample_definitions(w);
        w.flush();
        offset = fs::file_size(path);
        Event e = derived;
        e.seq = 1;
        w.event(e);
        w.close({});
    }
    check_error_at(path, offset, "event of kind derived in a version 2 trace");
}

namespace {

// A training loop as the interposer sees it: per step, a forward and a
// backward pass over layers with tags pushed and popped, block allocations
// from a caching allocator (sizes rounded to 512 bytes, addresses reused
// within a few segments), their frees, an optimizer phase and a step event;
// one stack per (layer, phase). The writer is flushed every 1 to 40 events,
// as the interposer's writer thread does when it drains its ring.
struct TrainingLoop {
    static constexpr uint32_t kLayers = 24;
    std::mt19937_64 rng{4242};
    TraceWriter& w;
    uint64_t seq = 0;
    uint64_t t = 5'000'000;
    uint64_t step = 0;
    uint32_t tid = 31337;
    size_t since_flush = 0;
    size_t flush_every = 10;
    size_t events = 0;
    uint32_t strings = 1, stacks = 1;
    std::vector<uint32_t> layer_ids;
    uint32_t forward = 0, backward = 0, optimizer = 0;
    std::vector<uint64_t> free_addresses;  // the allocator's cache

    explicit TrainingLoop(TraceWriter& writer) : w(writer) {
        forward = define("forward");
        backward = define("backward");
        optimizer = define("optimizer");
        for (uint32_t l = 0; l < kLayers; ++l)
            layer_ids.push_back(define("model.layers." + std::to_string(l)));
        for (int s = 0; s < 4; ++s) {
            const uint64_t segment = 0x7f0000000000ull + (uint64_t(s) << 32);
            for (uint64_t off = 0; off < (64u << 20); off += 1u << 20)
                free_addresses.push_back(segment + off);
        }
    }
    uint32_t define(const std::string& text) {
        w.string(strings, text);
        return strings++;
    }
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> stack_ids;  // interned per call site
    uint32_t stack_for(uint32_t layer, uint32_t phase_id) {
        auto [it, is_new] = stack_ids.try_emplace({layer, phase_id}, stacks);
        if (is_new) {
            w.stack(stacks, std::vector<uint64_t>{0x401000 + 16 * stacks, 0x402000 + phase_id,
                                                  0x7f1234500000, 0x7f1234501000});
            ++stacks;
        }
        return it->second;
    }
    void emit(Event e) {
        e.seq = ++seq;
        t += 300 + rng() % 3000;
        if (rng() % 50 == 0) t += rng() % 5'000'000;  // a kernel or a collective
        e.t_ns = t;
        e.step = step;
        e.tid = tid;
        w.event(e);
        ++events;
        if (++since_flush >= flush_every) {
            w.flush();
            since_flush = 0;
            flush_every = 1 + rng() % 40;
        }
    }
    Event tag(EventKind kind, uint32_t layer, uint32_t phase) {
        Event e;
        e.kind = kind;
        e.layer = layer;
        e.phase = phase;
        e.api = Api::c_api;
        return e;
    }
    void phase(uint32_t layer, uint32_t phase_id, std::vector<Event>& live, int allocs, int frees) {
        emit(tag(EventKind::tag_push, layer, phase_id));
        const uint32_t stack = stack_for(layer, phase_id);
        for (int i = 0; i < allocs && !free_addresses.empty(); ++i) {
            Event e;
            e.kind = EventKind::alloc;
            e.level = Level::block;
            e.memory = MemoryKind::device;
            e.api = Api::block_alloc;
            e.device = 0;
            e.layer = layer;
            e.phase = phase_id;
            e.stack = stack;
            const size_t pick = rng() % std::min<size_t>(free_addresses.size(), 8);
            e.address = free_addresses[pick] + 512 * (rng() % 64);
            free_addresses.erase(free_addresses.begin() + long(pick));
            e.size = 512 * pick_size();
            emit(e);
            live.push_back(e);
        }
        for (int i = 0; i < frees && !live.empty(); ++i) {
            Event e = live.front();
            live.erase(live.begin());
            e.kind = EventKind::free;
            e.api = Api::block_free;
            e.stack = 0;
            e.layer = layer;
            e.phase = phase_id;
            free_addresses.push_back(e.address & ~uint64_t{(1u << 20) - 1});
            emit(e);
        }
        emit(tag(EventKind::tag_pop, layer, phase_id));
    }
    uint64_t pick_size() {
        switch (rng() % 4) {
            case 0:
                return 1;
            case 1:
                return 64;
            case 2:
                return 3 * 256;
            default:
                return 1 + rng() % 4096;
        }
    }
    void run(int steps) {
        for (; step < uint64_t(steps); ++step) {
            std::vector<Event> activations;
            for (uint32_t l : layer_ids)
                phase(l, forward, activations, 6, 2);
            for (auto it = layer_ids.rbegin(); it != layer_ids.rend(); ++it)
                phase(*it, backward, activations, 4, 8);
            phase(0, optimizer, activations, 8, int(activations.size()));
            Event s;
            s.kind = EventKind::step;
            s.api = Api::c_api;
            emit(s);
        }
    }
};

}  // namespace

TEST_CASE("a training-loop-like stream averages at most 16 bytes per event") {
    TempDir dir;
    const std::string path = dir.file("loop.trace");
    size_t events = 0, blocks = 0;
    {
        TraceWriter w;
        open_or_fail(w, path, sample_header());
        TrainingLoop loop(w);
        loop.run(20);
        events = loop.events;
        w.close({});
    }
    REQUIRE(events > 10000);
    blocks = event_blocks(path).size();
    const double bytes_per_event = double(fs::file_size(path)) / double(events);
    MESSAGE(events << " events in " << blocks << " blocks, " << fs::file_size(path)
                   << " bytes: " << bytes_per_event << " bytes per event");
    CHECK(blocks > events / 40);  // small blocks, as the interposer writes them
    CHECK(bytes_per_event <= 16.0);
    Trace t = load_trace(path);
    CHECK(t.events.size() == events);
    CHECK(t.footer.has_value());
}

TEST_CASE("ends_with_footer tells a closed trace from one cut short, reading only its ends") {
    TempDir dir;
    const std::string closed = dir.file("closed.trace");
    const std::string open = dir.file("open.trace");
    write_sample_trace(closed, /*with_footer=*/true);
    write_sample_trace(open, /*with_footer=*/false);
    CHECK(ends_with_footer(closed));
    CHECK_FALSE(ends_with_footer(open));
    CHECK_FALSE(ends_with_footer(dir.file("missing.trace")));

    // A damaged footer (its checksum fails) is no footer.
    const std::string bytes = read_bytes(closed);
    std::string damaged = bytes;
    damaged[damaged.size() - 1] = static_cast<char>(damaged.back() ^ 0x5a);
    write_bytes(dir.file("damaged.trace"), damaged);
    CHECK_FALSE(ends_with_footer(dir.file("damaged.trace")));
    // The same last 60 bytes in a file that is not a trace do not count.
    write_bytes(dir.file("other.bin"), std::string(100, 'x') + bytes.substr(bytes.size() - 60));
    CHECK_FALSE(ends_with_footer(dir.file("other.bin")));
    // A trace cut one byte short of its end.
    write_bytes(dir.file("cut.trace"), bytes.substr(0, bytes.size() - 1));
    CHECK_FALSE(ends_with_footer(dir.file("cut.trace")));
}

TEST_CASE("the recording host's name follows the header; traces without one read as before") {
    TempDir dir;
    const std::string path = dir.file("t.trace");
    TraceHeader h = sample_header();
    h.host = "node-17.cluster";
    std::vector<Event> events = sample_events();
    write_trace_of(path, h, events);
    Trace t = load_trace(path);
    CHECK(t.header.host == "node-17.cluster");
    CHECK_FALSE(t.truncated);
    check_same_events(t.events, events);
    // The record sits right after the 72 bytes: a flipped byte in its name
    // makes the header unreadable, at the record's offset.
    std::string bytes = read_bytes(path);
    REQUIRE(bytes.compare(kTraceHeaderSize + kRecordHeaderSize, 7, "node-17") == 0);
    bytes[kTraceHeaderSize + kRecordHeaderSize] ^= 1;
    write_bytes(path, bytes);
    check_error_at(path, kTraceHeaderSize, "corrupt host record");

    // No host (an empty name is not written): the events follow the header.
    h.host.clear();
    const std::string bare = dir.file("bare.trace");
    write_trace_of(bare, h, events);
    Trace b = load_trace(bare);
    CHECK(b.header.host.empty());
    check_same_events(b.events, events);
    // A trace cut right after its header, or inside the host record, reads
    // as an empty trace cut short.
    bytes = read_bytes(path);
    for (size_t cut : {kTraceHeaderSize, kTraceHeaderSize + 5, kTraceHeaderSize + 14}) {
        CAPTURE(cut);
        write_bytes(bare, bytes.substr(0, cut));
        Trace c = load_trace(bare);
        CHECK(c.truncated);
        CHECK(c.events.empty());
        CHECK(c.header.host.empty());
    }
}
