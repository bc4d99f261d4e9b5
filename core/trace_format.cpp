#include "trace_format.h"

#include <array>
#include <cstring>

namespace allocscope {

namespace {

// CRC-32C (Castagnoli): the polynomial x86's SSE4.2 crc32 instruction
// computes, so the writer thread checksums 8 bytes per instruction.
constexpr std::array<uint32_t, 256> make_crc_table() {
    std::array<uint32_t, 256> table{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k)
            c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    return table;
}
constexpr auto kCrcTable = make_crc_table();

uint32_t crc32c_software(const uint8_t* p, size_t n, uint32_t c) noexcept {
    while (n--)
        c = kCrcTable[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n,
                                                        uint32_t c) noexcept {
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = static_cast<uint32_t>(c64);
    for (; n > 0; --n)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

}  // namespace

uint32_t crc32c(std::span<const uint8_t> bytes, uint32_t seed) noexcept {
    uint32_t c = ~seed;
#if defined(__x86_64__)
    static const bool have_sse42 = __builtin_cpu_supports("sse4.2");
    if (have_sse42) return ~crc32c_sse42(bytes.data(), bytes.size(), c);
#endif
    return ~crc32c_software(bytes.data(), bytes.size(), c);
}

void put_u16(std::string& out, uint16_t v) {
    char b[2];
    std::memcpy(b, &v, 2);
    out.append(b, 2);
}
void put_u32(std::string& out, uint32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);
    out.append(b, 4);
}
void put_u64(std::string& out, uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out.append(b, 8);
}
uint16_t get_u16(const uint8_t* p) noexcept {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
uint32_t get_u32(const uint8_t* p) noexcept {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t get_u64(const uint8_t* p) noexcept {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

std::string encode_header(const TraceHeader& h) {
    std::string out;
    out.reserve(kTraceHeaderSize);
    out.append(kTraceMagic, sizeof kTraceMagic);
    put_u32(out, h.format_version);
    put_u32(out, static_cast<uint32_t>(kTraceHeaderSize));
    char version[16] = {};
    std::memcpy(version, h.tool_version.data(), std::min<size_t>(h.tool_version.size(), 15));
    out.append(version, sizeof version);
    put_u32(out, h.pid);
    put_u32(out, static_cast<uint32_t>(h.rank));
    put_u32(out, static_cast<uint32_t>(h.world_size));
    put_u32(out, h.stack_depth);
    put_u64(out, h.start_wall_ns);
    put_u64(out, h.start_mono_ns);
    put_u32(out, 0);  // reserved
    put_u32(out, crc32c({reinterpret_cast<const uint8_t*>(out.data()), out.size()}));
    return out;
}

namespace {
template <typename T>
void store(uint8_t* p, T v) noexcept {
    std::memcpy(p, &v, sizeof v);
}
}  // namespace

void encode_event(uint8_t* p, const Event& e) noexcept {
    store(p + 0, e.seq);
    store(p + 8, e.t_ns);
    store(p + 16, e.address);
    store(p + 24, e.size);
    store(p + 32, e.stream);
    store(p + 40, e.step);
    store(p + 48, e.tid);
    store(p + 52, e.layer);
    store(p + 56, e.phase);
    store(p + 60, e.stack);
    store(p + 64, e.aux);
    store(p + 68, e.flags);
    store(p + 72, e.device);
    store(p + 76, e.result);
    p[80] = static_cast<uint8_t>(e.kind);
    p[81] = static_cast<uint8_t>(e.level);
    p[82] = static_cast<uint8_t>(e.memory);
    p[83] = static_cast<uint8_t>(e.api);
}

Event decode_event(const uint8_t* p) noexcept {
    Event e;
    e.seq = get_u64(p + 0);
    e.t_ns = get_u64(p + 8);
    e.address = get_u64(p + 16);
    e.size = get_u64(p + 24);
    e.stream = get_u64(p + 32);
    e.step = get_u64(p + 40);
    e.tid = get_u32(p + 48);
    e.layer = get_u32(p + 52);
    e.phase = get_u32(p + 56);
    e.stack = get_u32(p + 60);
    e.aux = get_u32(p + 64);
    e.flags = get_u32(p + 68);
    e.device = static_cast<int32_t>(get_u32(p + 72));
    e.result = static_cast<int32_t>(get_u32(p + 76));
    e.kind = static_cast<EventKind>(p[80]);
    e.level = static_cast<Level>(p[81]);
    e.memory = static_cast<MemoryKind>(p[82]);
    e.api = static_cast<Api>(p[83]);
    return e;
}

void append_record(std::string& out, RecordType type, std::string_view payload) {
    const size_t at = out.size();
    out.resize(at + kRecordHeaderSize + payload.size());
    auto* p = reinterpret_cast<uint8_t*>(out.data() + at);
    store(p, static_cast<uint16_t>(type));
    store(p + 2, uint16_t{0});
    store(p + 4, static_cast<uint32_t>(payload.size()));
    store(p + 8, crc32c({reinterpret_cast<const uint8_t*>(payload.data()), payload.size()}));
    std::memcpy(p + kRecordHeaderSize, payload.data(), payload.size());
}

}  // namespace allocscope
