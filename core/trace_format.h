// The binary trace format: one file per traced process.
//
//   file    := header record*
//   header  := 72 bytes, see TraceHeader; ends with a CRC-32C of bytes [0, 68)
//   record  := u16 type, u16 zero, u32 length, u32 crc32c(payload), payload
//
// All integers are little-endian. Invariants the writer keeps and the reader
// checks:
//   * a string, stack, module or param is defined by its record before the
//     first event that refers to it;
//   * event records appear in strictly increasing `seq` order;
//   * a cleanly closed trace ends with exactly one footer record; a trace
//     without one was cut short (the process was killed or is still running)
//     and its complete records form a readable prefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "event.h"

namespace allocscope {

inline constexpr char kTraceMagic[8] = {'A', 'L', 'S', 'C', 'T', 'R', 'C', '\n'};
inline constexpr uint32_t kTraceFormatVersion = 1;
inline constexpr size_t kTraceHeaderSize = 72;
inline constexpr size_t kRecordHeaderSize = 12;
inline constexpr size_t kEventPayloadSize = 84;
// Upper bounds the reader enforces so a corrupt length can never make it
// allocate without limit.
inline constexpr uint32_t kMaxRecordPayload = 1u << 20;
inline constexpr uint32_t kMaxStringBytes = 1u << 16;
inline constexpr uint32_t kMaxStackDepth = 256;

enum class RecordType : uint16_t {
    event = 1,
    string = 2,
    stack = 3,
    module = 4,
    param = 5,
    footer = 6,
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
// Both work on exactly kEventPayloadSize bytes.
void encode_event(uint8_t* payload, const Event& event) noexcept;
Event decode_event(const uint8_t* payload) noexcept;

// Appends one framed record (header + payload) to `out`.
void append_record(std::string& out, RecordType type, std::string_view payload);

}  // namespace allocscope
