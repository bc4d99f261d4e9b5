#include "trace_bound.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include "trace_format.h"

namespace allocscope {

std::vector<std::pair<Pool, LiveRecord>> live_set(const Replay& replay) {
    std::vector<std::pair<Pool, LiveRecord>> out;
    for (int p = 0; p < kPoolCount; ++p) {
        for (const LiveRecord& r : replay.table(Pool(p)).snapshot())
            out.push_back({Pool(p), r});
    }
    std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
        return std::pair(int(x.first), x.second.seq) < std::pair(int(y.first), y.second.seq);
    });
    return out;
}

namespace {

bool before(const std::pair<Pool, LiveRecord>& x, const std::pair<Pool, LiveRecord>& y) {
    return std::pair(int(x.first), x.second.seq) < std::pair(int(y.first), y.second.seq);
}

// An event carried over the gap, stamped where the tail begins.
Event carried(EventKind kind, const TraceCheckpoint& cut) {
    Event e;
    e.kind = kind;
    e.t_ns = cut.t_ns;
    e.step = cut.step;
    e.flags = kFlagCarried;
    return e;
}

Event memory_event(EventKind kind, Pool pool, const LiveRecord& r, const TraceCheckpoint& cut) {
    Event e = carried(kind, cut);
    e.address = r.address;
    e.size = r.size;
    e.stream = r.stream;
    e.tid = r.tid;
    e.layer = r.layer;
    e.phase = r.phase;
    e.stack = r.stack;
    e.device = r.device;
    e.memory = r.memory;
    e.api = r.api;
    e.level = pool == Pool::device_block ? Level::block : Level::segment;
    if (kind == EventKind::alloc && r.graph_pool) e.flags |= kFlagGraphPool;
    return e;
}

Event tag_event(EventKind kind, uint32_t tid, std::pair<uint32_t, uint32_t> tag,
                const TraceCheckpoint& cut) {
    Event e = carried(kind, cut);
    e.tid = tid;
    e.layer = tag.first;
    e.phase = tag.second;
    return e;
}

}  // namespace

std::vector<Event> carried_events(const TraceCheckpoint& head, const TraceCheckpoint& cut,
                                  uint32_t mark_text, uint64_t dropped_events,
                                  uint64_t dropped_bytes) {
    std::vector<Event> out;
    // Close what was open at the head's end, innermost first; open what is
    // open at the cut, outermost first.
    for (const OpenScopes& t : head.open) {
        for (auto it = t.scopes.rbegin(); it != t.scopes.rend(); ++it)
            out.push_back(tag_event(EventKind::tag_pop, t.tid, *it, cut));
    }
    for (const OpenScopes& t : cut.open) {
        for (const auto& tag : t.scopes)
            out.push_back(tag_event(EventKind::tag_push, t.tid, tag, cut));
    }
    // Frees of what the head left live and the cut no longer has, then the
    // allocations the cut has that the head did not (both lists are sorted).
    std::vector<std::pair<Pool, LiveRecord>> gone, made;
    std::set_difference(head.live.begin(), head.live.end(), cut.live.begin(), cut.live.end(),
                        std::back_inserter(gone), before);
    std::set_difference(cut.live.begin(), cut.live.end(), head.live.begin(), head.live.end(),
                        std::back_inserter(made), before);
    for (const auto& [pool, r] : gone)
        out.push_back(memory_event(EventKind::free, pool, r, cut));
    for (const auto& [pool, r] : made) {
        out.push_back(memory_event(EventKind::alloc, pool, r, cut));
        if (pool == Pool::device_segment &&
            std::binary_search(cut.held_segments.begin(), cut.held_segments.end(), r.address))
            out.back().flags |= kFlagHeldBlock;
    }
    Event mark = carried(EventKind::mark, cut);
    mark.aux = mark_text;
    mark.address = dropped_events;
    mark.size = dropped_bytes;
    out.push_back(mark);
    // The seqs between the head's last and the tail's first.
    if (cut.last_seq < head.last_seq || out.size() > cut.last_seq - head.last_seq) return {};
    uint64_t seq = head.last_seq;
    for (Event& e : out)
        e.seq = ++seq;
    return out;
}

namespace {

struct File {
    std::FILE* f = nullptr;
    ~File() {
        if (f) std::fclose(f);
    }
};

bool copy_bytes(std::FILE* in, std::FILE* out, uint64_t n) {
    char buffer[1 << 16];
    while (n > 0) {
        const size_t want = size_t(std::min<uint64_t>(n, sizeof buffer));
        if (std::fread(buffer, 1, want, in) != want) return false;
        if (std::fwrite(buffer, 1, want, out) != want) return false;
        n -= want;
    }
    return true;
}

}  // namespace

bool write_compacted(const std::string& path, const std::string& out_path, uint64_t head_end,
                     uint64_t cut, std::span<const Event> carried, uint64_t& new_cut,
                     uint64_t& size, std::string& error) {
    File in, out;
    in.f = std::fopen(path.c_str(), "rb");
    if (!in.f) {
        error = "cannot read " + path + ": " + std::strerror(errno);
        return false;
    }
    // As the trace itself: created exclusively, never through a link, 0600.
    const int fd =
        ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    out.f = fd < 0 ? nullptr : ::fdopen(fd, "wb");
    if (fd >= 0 && !out.f) ::close(fd);
    if (!out.f) {
        error = "cannot create " + out_path + ": " + std::strerror(errno);
        return false;
    }
    auto failed = [&](const std::string& what) {
        error = what + " (" + path + ")";
        return false;
    };
    if (cut < head_end) return failed("the cut precedes the head's end");
    if (!copy_bytes(in.f, out.f, head_end)) return failed("cannot copy the head");
    // The definitions of the dropped part, in order; its event blocks go.
    uint64_t at = head_end;
    std::string record;
    while (at < cut) {
        uint8_t head[kRecordHeaderSize];
        if (std::fread(head, 1, sizeof head, in.f) != sizeof head)
            return failed("a record cut short at byte " + std::to_string(at));
        const uint16_t type = get_u16(head);
        const uint32_t length = get_u32(head + 4);
        if (length > kMaxRecordPayload || at + kRecordHeaderSize + length > cut)
            return failed("a record runs past the cut at byte " + std::to_string(at));
        if (type == uint16_t(RecordType::event_block)) {
            if (std::fseek(in.f, long(length), SEEK_CUR) != 0) return failed("cannot seek");
        } else {
            record.assign(reinterpret_cast<const char*>(head), sizeof head);
            record.resize(sizeof head + length);
            if (std::fread(record.data() + sizeof head, 1, length, in.f) != length)
                return failed("a record cut short at byte " + std::to_string(at));
            if (std::fwrite(record.data(), 1, record.size(), out.f) != record.size())
                return failed("cannot write " + out_path);
        }
        at += kRecordHeaderSize + length;
    }
    // The carried events, in blocks.
    EventBlockEncoder block;
    block.reserve();
    std::string blocks;
    for (const Event& e : carried) {
        block.add(e);
        if (block.full()) {
            append_record(blocks, RecordType::event_block, block.payload());
            block.clear();
        }
    }
    if (!block.empty()) append_record(blocks, RecordType::event_block, block.payload());
    if (std::fwrite(blocks.data(), 1, blocks.size(), out.f) != blocks.size())
        return failed("cannot write " + out_path);
    const long tail_at = std::ftell(out.f);
    if (tail_at < 0) return failed("cannot tell the offset of " + out_path);
    new_cut = uint64_t(tail_at);
    // The tail, to the end of the file.
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, in.f)) > 0) {
        if (std::fwrite(buffer, 1, n, out.f) != n) return failed("cannot write " + out_path);
    }
    if (std::ferror(in.f)) return failed("cannot read the tail");
    const long end = std::ftell(out.f);
    if (end < 0 || std::fflush(out.f) != 0) return failed("cannot write " + out_path);
    size = uint64_t(end);
    return true;
}

bool parse_size(std::string_view text, uint64_t& bytes) {
    uint64_t value = 0;
    const auto [rest, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || rest == text.data()) return false;
    std::string_view unit(rest, size_t(text.data() + text.size() - rest));
    uint64_t scale = 1;
    if (unit.empty() || unit == "B") {
        scale = 1;
    } else if (unit == "K" || unit == "KiB" || unit == "k") {
        scale = uint64_t(1) << 10;
    } else if (unit == "M" || unit == "MiB") {
        scale = uint64_t(1) << 20;
    } else if (unit == "G" || unit == "GiB") {
        scale = uint64_t(1) << 30;
    } else if (unit == "T" || unit == "TiB") {
        scale = uint64_t(1) << 40;
    } else {
        return false;
    }
    if (value > UINT64_MAX / scale) return false;
    bytes = value * scale;
    return true;
}

}  // namespace allocscope
