// The binary trace format: one file per traced process.
//
//   file    := header [host] record*
//   header  := 72 bytes, see TraceHeader; ends with a CRC-32C of bytes [0, 68)
//   host    := (version 4) a `host` record, the recording machine's name
//   record  := u16 type, u16 zero, u32 length, u32 crc32c(payload), payload
//
// All integers are little-endian. Invariants the writer keeps and the reader
// checks:
//   * a string, stack, module or param is defined by its record before the
//     first event that refers to it (before the event block holding it);
//   * events appear in strictly increasing `seq` order;
//   * a cleanly closed trace ends with exactly one footer record; a trace
//     without one was cut short (the process was killed or is still running)
//     and its complete records form a readable prefix.
//
// Events (format version 2) travel in event_block records of 1 to
// kMaxBlockEvents events. The writer ends a block when it is full (that many
// events or kBlockTargetPayload bytes), on flush() and on close(). Each block
// is decodable on its own, so a damaged block never affects earlier ones:
//
//   block   := u16 count, event{count}   (nothing after the last event)
//   event   := u8 b0, [u8 b1 if b0.X], [u8 b2 if b1.M], [u8 kind if b0 kind is 0],
//              fields
//
// Every field is coded against a predictor: `prev` is the block's previous
// event, `pk` the block's previous event of the same kind (`prev` while the
// kind has not occurred in the block). Before a block's first event `prev`
// is Event{} (seq 0, t_ns 0, device -1, every other field 0 or none).
// varint: unsigned LEB128, at most 10 bytes. zz(d): varint of the zigzag of
// the difference d, taken modulo 2^64 (64-bit fields) or 2^32 (32-bit ones).
// z(v): varint of the zigzag of a signed value.
//
//   b0: bits 0-3 kind (0: a full kind byte follows), bit 4 S, 5 A, 6 Z, 7 X
//   b1: bit 0 layer, 1 phase, 2 stack, 3 step, 4 tid, 5 aux, 6 stream, 7 M
//   b2: bit 0 device, 1 result, 2 flags, 3 level, 4 memory, 5 api; 6-7 zero
//
// A field whose bit is clear (or whose bit's byte is absent) equals its
// predictor; otherwise it follows, in this order:
//   seq      S: varint(seq - prev.seq)    (clear: prev.seq + 1)
//   t_ns     always: zz(t_ns - prev.t_ns)
//   address  A: zz(address - pk.address)
//   size     Z: a multiple of 512 as varint((size / 512) << 1), any other
//               size as the LEB128 bytes of the 65-bit number (size << 1) | 1
//   layer, phase, step, tid (vs prev), stack, aux, stream (vs pk): zz
//   device, result: z(v);  flags: varint(v);  level, memory, api: u8
//
// A version 1 trace holds one `event` record per event instead (84 bytes, see
// encode_event); the reader reads both versions. Version 3 is version 2 with
// one more event kind, `derived` (event.h), which a version 1 or 2 trace
// never holds. Version 4 is version 3 whose header may be followed by one
// `host` record (the machine's name, at most kMaxHostBytes): only there,
// never later. Version 5 is version 4 whose cuMemUnmap may be one free event
// for its whole range (kFlagRange, event.h; `size` is the range's length)
// where older traces hold one free per mapping; Replay (core/replay.h)
// splits it, so a reader that replays reads both alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "event.h"

namespace allocscope {

inline constexpr char kTraceMagic[8] = {'A', 'L', 'S', 'C', 'T', 'R', 'C', '\n'};
inline constexpr uint32_t kTraceFormatVersion = 5;        // the version the writer writes
inline constexpr uint32_t kOldestTraceFormatVersion = 1;  // the oldest the reader reads
inline constexpr size_t kTraceHeaderSize = 72;
inline constexpr size_t kRecordHeaderSize = 12;
inline constexpr size_t kEventPayloadSize = 84;  // a version 1 event record
// Upper bounds the reader enforces so a corrupt length can never make it
// allocate without limit.
inline constexpr uint32_t kMaxRecordPayload = 1u << 20;
inline constexpr uint32_t kMaxStringBytes = 1u << 16;
inline constexpr uint32_t kMaxStackDepth = 256;
inline constexpr uint32_t kMaxHostBytes = 255;
// An event block holds at most this many events; the writer closes a block
// once it holds that many or its payload reaches kBlockTargetPayload bytes.
inline constexpr uint32_t kMaxBlockEvents = 4096;
inline constexpr size_t kBlockTargetPayload = 64 * 1024;
// The longest encoding of one event inside a block.
inline constexpr size_t kMaxEncodedEventSize = 107;
static_assert(2 + kBlockTargetPayload + kMaxEncodedEventSize <= kMaxRecordPayload);

enum class RecordType : uint16_t {
    event = 1,  // one event (version 1 only)
    string = 2,
    stack = 3,
    module = 4,
    param = 5,
    footer = 6,
    event_block = 7,  // events, delta-coded (version 2 and later)
    host = 8,         // the machine's name, right after the header (version 4 and later)
};

struct TraceHeader {
    uint32_t format_version = kTraceFormatVersion;
    std::string tool_version;  // at most 15 bytes are stored
    uint32_t pid = 0;
    int32_t rank = -1;  // -1: the process had no rank in its environment
    int32_t world_size = -1;
    uint32_t stack_depth = 0;    // configured capture depth, 0 = stacks off
    uint64_t start_wall_ns = 0;  // CLOCK_REALTIME at trace start
    uint64_t start_mono_ns = 0;  // CLOCK_MONOTONIC at trace start (Event::t_ns origin)
    // The recording machine (gethostname): a `host` record after the 72
    // bytes (version 4), written where not empty; "" in older traces.
    std::string host;

    bool operator==(const TraceHeader&) const = default;
};

struct ModuleRecord {
    uint64_t base = 0;     // load bias (dlpi_addr)
    uint64_t size = 0;     // extent of its PT_LOAD segments from base
    std::string build_id;  // raw bytes of NT_GNU_BUILD_ID, may be empty
    std::string path;
};

struct ParamRecord {
    uint32_t index = 0;
    uint32_t layer = 0;  // string ids
    uint32_t name = 0;
    uint32_t dtype = 0;
    uint64_t numel = 0;
    uint64_t sharded_numel = 0;
};

// Counters the interposer knows only at the end.
struct FooterRecord {
    uint64_t events = 0;          // event records written
    uint64_t unknown_frees = 0;   // frees of addresses never seen allocated
    uint64_t double_frees = 0;    // frees of addresses already freed
    uint64_t stacks_dropped = 0;  // allocations whose stack did not fit the table
    uint64_t events_dropped = 0;  // events not recorded (writer stalled, see recorder)
    uint64_t end_mono_ns = 0;
};

// CRC-32C of `bytes` (hardware-accelerated where the CPU has SSE4.2).
uint32_t crc32c(std::span<const uint8_t> bytes, uint32_t seed = 0) noexcept;

// Little-endian append/read helpers used by the writer and the reader.
void put_u16(std::string& out, uint16_t v);
void put_u32(std::string& out, uint32_t v);
void put_u64(std::string& out, uint64_t v);
uint16_t get_u16(const uint8_t* p) noexcept;
uint32_t get_u32(const uint8_t* p) noexcept;
uint64_t get_u64(const uint8_t* p) noexcept;

std::string encode_header(const TraceHeader& header);
// The version 1 event record. Both work on exactly kEventPayloadSize bytes.
void encode_event(uint8_t* payload, const Event& event) noexcept;
Event decode_event(const uint8_t* payload) noexcept;

// The predictor state that block encoding and decoding share (see the top of
// this file). Starts each block afresh.
struct EventPredictor {
    Event prev;
    Event last[16];  // by kind code; valid where `seen` has the bit
    uint16_t seen = 0;

    void reset() noexcept { *this = EventPredictor(); }
    const Event& same_kind(uint8_t kind) const noexcept {
        return (seen >> (kind & 15)) & 1 ? last[kind & 15] : prev;
    }
    void update(const Event& e) noexcept {
        const uint8_t kind = static_cast<uint8_t>(e.kind) & 15;
        prev = e;
        last[kind] = e;
        seen = static_cast<uint16_t>(seen | (1u << kind));
    }
};

// Builds the payload of one event_block record. reserve() allocates its
// buffer once (it throws std::bad_alloc when that fails); add() needs that
// buffer, does not allocate and cannot fail.
class EventBlockEncoder {
  public:
    void reserve();
    bool reserved() const noexcept { return buffer_ != nullptr; }
    void add(const Event& event) noexcept;
    // True once the block should be written (kMaxBlockEvents events or
    // kBlockTargetPayload bytes).
    bool full() const noexcept { return count_ >= kMaxBlockEvents || size_ >= kBlockTargetPayload; }
    uint32_t count() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }
    // The payload (u16 count included); valid until the next add() or clear().
    std::string_view payload() noexcept;
    void clear() noexcept;

  private:
    EventPredictor predictor_;
    std::unique_ptr<uint8_t[]> buffer_;
    size_t size_ = 2;
    uint32_t count_ = 0;
};

// Decodes an event_block payload into the first events of `events`
// (kMaxBlockEvents of them hold any block), overwriting each field, and
// returns how many it holds. Returns 0 and says why in `problem` when the
// payload is malformed: a value running past the end, a field out of range,
// reserved bits set, a count of 0 or above kMaxBlockEvents (or the room
// given), or bytes left after the last event. Kinds, levels, ids and seq
// order are the caller's to check.
uint32_t decode_event_block(std::span<const uint8_t> payload, std::span<Event> events,
                            std::string& problem);

// Appends one framed record (header + payload) to `out`.
void append_record(std::string& out, RecordType type, std::string_view payload);

}  // namespace allocscope
