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

// --- event blocks ---------------------------------------------------------------

namespace {

// Bits of an encoded event's leading bytes (see trace_format.h).
enum : uint8_t {
    kB0KindMask = 0x0F,
    kB0Seq = 0x10,
    kB0Address = 0x20,
    kB0Size = 0x40,
    kB0More = 0x80,
    kB1Layer = 0x01,
    kB1Phase = 0x02,
    kB1Stack = 0x04,
    kB1Step = 0x08,
    kB1Tid = 0x10,
    kB1Aux = 0x20,
    kB1Stream = 0x40,
    kB1More = 0x80,
    kB2Device = 0x01,
    kB2Result = 0x02,
    kB2Flags = 0x04,
    kB2Level = 0x08,
    kB2Memory = 0x10,
    kB2Api = 0x20,
    kB2Reserved = 0xC0,
};

inline uint64_t zigzag64(uint64_t now, uint64_t predicted) noexcept {
    const uint64_t d = now - predicted;
    return (d << 1) ^ (0 - (d >> 63));
}
inline uint64_t unzigzag64(uint64_t z, uint64_t predicted) noexcept {
    return predicted + ((z >> 1) ^ (0 - (z & 1)));
}
inline uint32_t zigzag32(uint32_t now, uint32_t predicted) noexcept {
    const uint32_t d = now - predicted;
    return (d << 1) ^ (0u - (d >> 31));
}
inline uint32_t unzigzag32(uint32_t z, uint32_t predicted) noexcept {
    return predicted + ((z >> 1) ^ (0u - (z & 1)));
}

inline uint8_t* put_varint(uint8_t* p, uint64_t v) noexcept {
    while (v >= 0x80) {
        *p++ = static_cast<uint8_t>(v | 0x80);
        v >>= 7;
    }
    *p++ = static_cast<uint8_t>(v);
    return p;
}

// Sizes are mostly multiples of 512 (allocator rounding): those are coded as
// the varint of (size / 512) << 1, any other size as the LEB128 bytes of the
// 65-bit number (size << 1) | 1.
inline uint8_t* put_size(uint8_t* p, uint64_t size) noexcept {
    if ((size & 511) == 0) return put_varint(p, (size >> 9) << 1);
    const uint8_t low = static_cast<uint8_t>(((size << 1) | 1) & 0x7F);
    if (size < 64) {
        *p++ = low;
        return p;
    }
    *p++ = low | 0x80;
    return put_varint(p, size >> 6);
}

}  // namespace

void EventBlockEncoder::reserve() {
    if (!buffer_) {
        buffer_ = std::make_unique_for_overwrite<uint8_t[]>(2 + kBlockTargetPayload +
                                                            kMaxEncodedEventSize);
    }
}

void EventBlockEncoder::clear() noexcept {
    predictor_.reset();
    size_ = 2;
    count_ = 0;
}

std::string_view EventBlockEncoder::payload() noexcept {
    store(buffer_.get(), static_cast<uint16_t>(count_));
    return {reinterpret_cast<const char*>(buffer_.get()), size_};
}

void EventBlockEncoder::add(const Event& e) noexcept {
    const Event& prev = predictor_.prev;
    const uint8_t kind = static_cast<uint8_t>(e.kind);
    const Event& pk = predictor_.same_kind(kind);

    uint8_t b2 = 0;
    if (e.device != pk.device) b2 |= kB2Device;
    if (e.result != pk.result) b2 |= kB2Result;
    if (e.flags != pk.flags) b2 |= kB2Flags;
    if (e.level != pk.level) b2 |= kB2Level;
    if (e.memory != pk.memory) b2 |= kB2Memory;
    if (e.api != pk.api) b2 |= kB2Api;
    uint8_t b1 = b2 ? kB1More : 0;
    if (e.layer != prev.layer) b1 |= kB1Layer;
    if (e.phase != prev.phase) b1 |= kB1Phase;
    if (e.stack != pk.stack) b1 |= kB1Stack;
    if (e.step != prev.step) b1 |= kB1Step;
    if (e.tid != prev.tid) b1 |= kB1Tid;
    if (e.aux != pk.aux) b1 |= kB1Aux;
    if (e.stream != pk.stream) b1 |= kB1Stream;
    const uint8_t code = kind <= kB0KindMask ? kind : 0;
    uint8_t b0 = code;
    if (e.seq != prev.seq + 1) b0 |= kB0Seq;
    if (e.address != pk.address) b0 |= kB0Address;
    if (e.size != pk.size) b0 |= kB0Size;
    if (b1) b0 |= kB0More;

    uint8_t* p = buffer_.get() + size_;
    *p++ = b0;
    if (b1) *p++ = b1;
    if (b2) *p++ = b2;
    if (code == 0) *p++ = kind;
    if (b0 & kB0Seq) p = put_varint(p, e.seq - prev.seq);
    p = put_varint(p, zigzag64(e.t_ns, prev.t_ns));
    if (b0 & kB0Address) p = put_varint(p, zigzag64(e.address, pk.address));
    if (b0 & kB0Size) p = put_size(p, e.size);
    if (b1) {
        if (b1 & kB1Layer) p = put_varint(p, zigzag32(e.layer, prev.layer));
        if (b1 & kB1Phase) p = put_varint(p, zigzag32(e.phase, prev.phase));
        if (b1 & kB1Stack) p = put_varint(p, zigzag32(e.stack, pk.stack));
        if (b1 & kB1Step) p = put_varint(p, zigzag64(e.step, prev.step));
        if (b1 & kB1Tid) p = put_varint(p, zigzag32(e.tid, prev.tid));
        if (b1 & kB1Aux) p = put_varint(p, zigzag32(e.aux, pk.aux));
        if (b1 & kB1Stream) p = put_varint(p, zigzag64(e.stream, pk.stream));
    }
    if (b2) {
        if (b2 & kB2Device) p = put_varint(p, zigzag32(static_cast<uint32_t>(e.device), 0));
        if (b2 & kB2Result) p = put_varint(p, zigzag32(static_cast<uint32_t>(e.result), 0));
        if (b2 & kB2Flags) p = put_varint(p, e.flags);
        if (b2 & kB2Level) *p++ = static_cast<uint8_t>(e.level);
        if (b2 & kB2Memory) *p++ = static_cast<uint8_t>(e.memory);
        if (b2 & kB2Api) *p++ = static_cast<uint8_t>(e.api);
    }
    size_ = static_cast<size_t>(p - buffer_.get());
    ++count_;
    predictor_.update(e);
}

namespace {

// What a block cursor reads through its own byte() and varint() (and
// first(), the next byte without taking it, false at the end): the
// 32-bit varints, the sizes and the reason a read failed. The same values
// and the same problems for both cursors below.
template <class Cursor>
class CursorReads {
  public:
    bool varint32(uint32_t& v) noexcept {
        uint64_t wide;
        if (!self().varint(wide)) return false;
        if (wide > UINT32_MAX) return fail("a 32-bit field is out of range");
        v = static_cast<uint32_t>(wide);
        return true;
    }

    bool size(uint64_t& v) noexcept {
        uint8_t first;
        if (!self().first(first)) return false;
        if (!(first & 1)) {
            uint64_t units;
            if (!self().varint(units)) return false;
            if ((units >> 1) > (UINT64_MAX >> 9)) return fail("a size is out of range");
            v = (units >> 1) << 9;
            return true;
        }
        self().byte(first);
        const uint64_t low = (first >> 1) & 0x3F;
        if (!(first & 0x80)) {
            v = low;
            return true;
        }
        uint64_t high;
        if (!self().varint(high)) return false;
        if (high > (UINT64_MAX >> 6)) return fail("a size is out of range");
        v = (high << 6) | low;
        return true;
    }

    bool fail(const char* why) noexcept {
        problem_ = why;
        return false;
    }
    const char* problem() const noexcept { return problem_; }

  private:
    Cursor& self() noexcept { return static_cast<Cursor&>(*this); }
    const char* problem_ = "";
};

// Bounds-checked reading of one block payload. Each getter returns false
// when the payload is malformed and leaves the reason in `problem`.
class BlockCursor : public CursorReads<BlockCursor> {
  public:
    BlockCursor(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}

    bool at_end() const noexcept { return p_ == end_; }
    size_t left() const noexcept { return static_cast<size_t>(end_ - p_); }
    const uint8_t* at() const noexcept { return p_; }
    void skip_to(const uint8_t* p) noexcept { p_ = p; }

    bool byte(uint8_t& v) noexcept {
        if (p_ == end_) return fail("a value runs past the end of the block");
        v = *p_++;
        return true;
    }

    bool varint(uint64_t& v) noexcept {
        uint64_t result = 0;
        for (int shift = 0; shift < 70; shift += 7) {
            if (p_ == end_) return fail("a value runs past the end of the block");
            const uint8_t b = *p_++;
            if (shift == 63 && b > 1) return fail("a value is too large for 64 bits");
            result |= uint64_t{b & 0x7Fu} << shift;
            if (!(b & 0x80)) {
                v = result;
                return true;
            }
        }
        return fail("a value is too large for 64 bits");
    }

    bool first(uint8_t& v) noexcept {
        if (p_ == end_) return fail("a value runs past the end of the block");
        v = *p_;
        return true;
    }

  private:
    const uint8_t* p_;
    const uint8_t* end_;
};

// The most bytes one event's decoding reads, valid or not: its four
// leading bytes, three single bytes (level, memory, api), a size's first
// byte and 14 varints of at most 10 bytes each (a varint ends at its tenth
// byte, valid or not).
constexpr size_t kMaxEventBytesRead = 4 + 3 + 1 + 14 * 10;

// The same reading where at least kMaxEventBytesRead bytes are left, so
// that no byte needs a bound check: most of a block's events. The same
// values and the same problems as BlockCursor's.
class RoomyCursor : public CursorReads<RoomyCursor> {
  public:
    explicit RoomyCursor(const uint8_t* p) : p_(p) {}
    const uint8_t* at() const noexcept { return p_; }

    bool byte(uint8_t& v) noexcept {
        v = *p_++;
        return true;
    }

    bool varint(uint64_t& v) noexcept {
        // One or two bytes, most values (deltas, ids), without a loop.
        const uint64_t b0 = p_[0];
        if (b0 < 0x80) {
            v = b0;
            p_ += 1;
            return true;
        }
        const uint64_t b1 = p_[1];
        uint64_t result = (b0 & 0x7F) | (b1 & 0x7F) << 7;
        if (b1 < 0x80) {
            v = result;
            p_ += 2;
            return true;
        }
        for (int i = 2; i < 9; ++i) {
            const uint64_t b = p_[i];
            result |= (b & 0x7F) << (7 * i);
            if (b < 0x80) {
                v = result;
                p_ += i + 1;
                return true;
            }
        }
        const uint8_t b = p_[9];  // the tenth: bit 63 alone
        p_ += 10;
        if (b > 1) return fail("a value is too large for 64 bits");
        v = result | uint64_t{b} << 63;
        return true;
    }

    bool first(uint8_t& v) noexcept {
        v = *p_;
        return true;
    }

  private:
    const uint8_t* p_;
};

// The block's predictors (EventPredictor's), as the events already decoded
// into the block: no copy of each event beside its own.
struct DecodePredictor {
    const Event* prev;
    const Event* last[16];  // by kind code; valid where `seen` has the bit
    uint16_t seen = 0;

    explicit DecodePredictor(const Event* start) noexcept : prev(start) {}
    const Event& same_kind(uint8_t kind) const noexcept {
        return (seen >> (kind & 15)) & 1 ? *last[kind & 15] : *prev;
    }
    void update(const Event& e) noexcept {
        const uint8_t kind = static_cast<uint8_t>(e.kind) & 15;
        prev = &e;
        last[kind] = &e;
        seen = static_cast<uint16_t>(seen | (1u << kind));
    }
};

template <class Cursor>
bool decode_one(Cursor& in, DecodePredictor& predictor, Event& e) noexcept {
    const Event& prev = *predictor.prev;
    uint8_t b0, b1 = 0, b2 = 0, kind;
    if (!in.byte(b0)) return false;
    if ((b0 & kB0More) && !in.byte(b1)) return false;
    if ((b1 & kB1More) && !in.byte(b2)) return false;
    if (b2 & kB2Reserved) return in.fail("reserved bits are set");
    kind = b0 & kB0KindMask;
    if (kind == 0 && !in.byte(kind)) return false;
    const Event& pk = predictor.same_kind(kind);
    e = pk;
    e.kind = static_cast<EventKind>(kind);
    e.layer = prev.layer;
    e.phase = prev.phase;
    e.step = prev.step;
    e.tid = prev.tid;
    uint64_t v;
    uint32_t v32;
    if (b0 & kB0Seq) {
        if (!in.varint(v)) return false;
        e.seq = prev.seq + v;
    } else {
        e.seq = prev.seq + 1;
    }
    if (!in.varint(v)) return false;
    e.t_ns = unzigzag64(v, prev.t_ns);
    if (b0 & kB0Address) {
        if (!in.varint(v)) return false;
        e.address = unzigzag64(v, pk.address);
    }
    if ((b0 & kB0Size) && !in.size(e.size)) return false;
    if (b1) {
        if (b1 & kB1Layer) {
            if (!in.varint32(v32)) return false;
            e.layer = unzigzag32(v32, prev.layer);
        }
        if (b1 & kB1Phase) {
            if (!in.varint32(v32)) return false;
            e.phase = unzigzag32(v32, prev.phase);
        }
        if (b1 & kB1Stack) {
            if (!in.varint32(v32)) return false;
            e.stack = unzigzag32(v32, pk.stack);
        }
        if (b1 & kB1Step) {
            if (!in.varint(v)) return false;
            e.step = unzigzag64(v, prev.step);
        }
        if (b1 & kB1Tid) {
            if (!in.varint32(v32)) return false;
            e.tid = unzigzag32(v32, prev.tid);
        }
        if (b1 & kB1Aux) {
            if (!in.varint32(v32)) return false;
            e.aux = unzigzag32(v32, pk.aux);
        }
        if (b1 & kB1Stream) {
            if (!in.varint(v)) return false;
            e.stream = unzigzag64(v, pk.stream);
        }
    }
    if (b2) {
        if (b2 & kB2Device) {
            if (!in.varint32(v32)) return false;
            e.device = static_cast<int32_t>(unzigzag32(v32, 0));
        }
        if (b2 & kB2Result) {
            if (!in.varint32(v32)) return false;
            e.result = static_cast<int32_t>(unzigzag32(v32, 0));
        }
        if ((b2 & kB2Flags) && !in.varint32(e.flags)) return false;
        uint8_t raw;
        if (b2 & kB2Level) {
            if (!in.byte(raw)) return false;
            e.level = static_cast<Level>(raw);
        }
        if (b2 & kB2Memory) {
            if (!in.byte(raw)) return false;
            e.memory = static_cast<MemoryKind>(raw);
        }
        if (b2 & kB2Api) {
            if (!in.byte(raw)) return false;
            e.api = static_cast<Api>(raw);
        }
    }
    predictor.update(e);
    return true;
}

}  // namespace

uint32_t decode_event_block(std::span<const uint8_t> payload, std::span<Event> events,
                            std::string& problem) {
    if (payload.size() < 2) {
        problem = "event block too short";
        return 0;
    }
    const uint32_t count = get_u16(payload.data());
    if (count == 0 || count > kMaxBlockEvents || count > events.size()) {
        problem = "event block has an invalid event count (" + std::to_string(count) + ")";
        return 0;
    }
    BlockCursor in(payload.data() + 2, payload.data() + payload.size());
    static constexpr Event kBeforeBlock{};
    DecodePredictor predictor(&kBeforeBlock);
    uint32_t i = 0;
    // Without bound checks while an event's most bytes are left.
    while (i < count && in.left() >= kMaxEventBytesRead) {
        RoomyCursor roomy(in.at());
        const bool ok = decode_one(roomy, predictor, events[i]);
        in.skip_to(roomy.at());
        if (!ok) {
            problem = std::string("corrupt event block: ") + roomy.problem() + " (event " +
                      std::to_string(i + 1) + " of " + std::to_string(count) + ")";
            return 0;
        }
        ++i;
    }
    for (; i < count; ++i) {
        if (in.at_end()) {
            problem = "event block ends after " + std::to_string(i) + " of its " +
                      std::to_string(count) + " events";
            return 0;
        }
        if (!decode_one(in, predictor, events[i])) {
            problem = std::string("corrupt event block: ") + in.problem() + " (event " +
                      std::to_string(i + 1) + " of " + std::to_string(count) + ")";
            return 0;
        }
    }
    if (!in.at_end()) {
        problem = "event block has " + std::to_string(in.left()) + " bytes after its " +
                  std::to_string(count) + " events";
        return 0;
    }
    return count;
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
