#include "trace_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace allocscope {

TraceError::TraceError(std::string file, uint64_t offset, const std::string& problem)
    : std::runtime_error(file + ": " + problem + " at byte " + std::to_string(offset)),
      file_(std::move(file)),
      offset_(offset) {}

TraceReader::TraceReader(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) {
        throw std::runtime_error(path + ": cannot open trace: " + std::strerror(errno));
    }
    uint8_t raw[kTraceHeaderSize];
    size_t got = std::fread(raw, 1, sizeof raw, file_);
    if (got < sizeof kTraceMagic || std::memcmp(raw, kTraceMagic, sizeof kTraceMagic) != 0) {
        std::fclose(file_);
        file_ = nullptr;
        fail(0, got < sizeof kTraceMagic ? "too short to be an allocscope trace"
                                         : "not an allocscope trace (bad magic)");
    }
    if (got < sizeof raw) {
        std::fclose(file_);
        file_ = nullptr;
        fail(got, "header cut short (" + std::to_string(got) + " of " +
                      std::to_string(kTraceHeaderSize) + " bytes)");
    }
    uint32_t version = get_u32(raw + 8);
    uint32_t header_size = get_u32(raw + 12);
    if (version < kOldestTraceFormatVersion || version > kTraceFormatVersion) {
        std::fclose(file_);
        file_ = nullptr;
        fail(8, "unsupported trace format version " + std::to_string(version) +
                    " (this build reads versions " + std::to_string(kOldestTraceFormatVersion) +
                    " to " + std::to_string(kTraceFormatVersion) + ")");
    }
    if (header_size != kTraceHeaderSize ||
        crc32c({raw, kTraceHeaderSize - 4}) != get_u32(raw + kTraceHeaderSize - 4)) {
        std::fclose(file_);
        file_ = nullptr;
        fail(0, "corrupt header (checksum mismatch)");
    }
    header_.format_version = version;
    header_.tool_version.assign(reinterpret_cast<const char*>(raw + 16),
                                strnlen(reinterpret_cast<const char*>(raw + 16), 16));
    header_.pid = get_u32(raw + 32);
    header_.rank = static_cast<int32_t>(get_u32(raw + 36));
    header_.world_size = static_cast<int32_t>(get_u32(raw + 40));
    header_.stack_depth = get_u32(raw + 44);
    header_.start_wall_ns = get_u64(raw + 48);
    header_.start_mono_ns = get_u64(raw + 56);
    offset_ = kTraceHeaderSize;
    if (version >= 4) read_host();
}

void TraceReader::read_host() {
    // A host record, if the trace has one, comes first; anything else is
    // left for next(): the file goes back to the end of the header.
    uint8_t head[kRecordHeaderSize];
    std::string name;
    bool found = false;
    if (std::fread(head, 1, sizeof head, file_) == sizeof head &&
        get_u16(head) == static_cast<uint16_t>(RecordType::host) && get_u16(head + 2) == 0) {
        const uint32_t length = get_u32(head + 4);
        if (length > kMaxHostBytes) {
            std::fclose(file_);
            file_ = nullptr;
            fail(kTraceHeaderSize, "host record length " + std::to_string(length) +
                                       " exceeds the limit of " + std::to_string(kMaxHostBytes));
        }
        name.resize(length);
        if (std::fread(name.data(), 1, length, file_) == length) {
            if (crc32c({reinterpret_cast<const uint8_t*>(name.data()), length}) !=
                get_u32(head + 8)) {
                std::fclose(file_);
                file_ = nullptr;
                fail(kTraceHeaderSize, "corrupt host record (checksum mismatch)");
            }
            found = true;
        } else {  // cut inside the host record: nothing follows
            mid_record_ = true;
            truncated_ = true;
            truncation_offset_ = kTraceHeaderSize;
            return;
        }
    }
    if (found) {
        header_.host = std::move(name);
        offset_ = kTraceHeaderSize + kRecordHeaderSize + header_.host.size();
        return;
    }
    // No host record (or one cut short, which next() then reports as a cut).
    std::clearerr(file_);
    if (std::fseek(file_, static_cast<long>(kTraceHeaderSize), SEEK_SET) != 0) {
        const int saved = errno;
        std::fclose(file_);
        file_ = nullptr;
        fail(kTraceHeaderSize, std::string("cannot seek: ") + std::strerror(saved));
    }
}

TraceReader::~TraceReader() {
    if (file_) std::fclose(file_);
}

void TraceReader::fail(uint64_t offset, const std::string& problem) const {
    throw TraceError(path_, offset, problem);
}

bool TraceReader::read_exact(void* dst, size_t n) {
    size_t got = std::fread(dst, 1, n, file_);
    offset_ += got;
    if (got == n) return true;
    if (std::ferror(file_)) fail(offset_, std::string("read error: ") + std::strerror(errno));
    mid_record_ = got > 0;
    return false;
}

std::string TraceReader::truncation_message() const {
    if (!truncated_) return {};
    return path_ + ": trace " +
           (mid_record_ ? std::string("cut off inside a record")
                        : std::string("ends without a footer (the process did not finish)")) +
           " at byte " + std::to_string(truncation_offset_);
}

bool TraceReader::next(TraceRecord& record) {
    if (block_next_ < block_size_) {
        record.type = RecordType::event;
        record.offset = block_offset_;
        record.event = block_[block_next_++];
        if (block_next_ > block_valid_) check_event(record.event, block_offset_);
        return true;
    }
    if (footer_seen_ || truncated_) return false;
    const uint64_t start = offset_;
    uint8_t head[kRecordHeaderSize];
    if (!read_exact(head, sizeof head)) {
        if (offset_ != start) mid_record_ = true;
        truncated_ = true;
        truncation_offset_ = start;
        return false;
    }
    uint16_t type = get_u16(head);
    uint32_t length = get_u32(head + 4);
    uint32_t crc = get_u32(head + 8);
    // Version 1 holds single events, version 2 event blocks.
    const bool v1 = header_.format_version == 1;
    const auto first = v1 ? RecordType::event : RecordType::string;
    const auto last = v1 ? RecordType::footer : RecordType::event_block;
    if (type < static_cast<uint16_t>(first) || type > static_cast<uint16_t>(last) ||
        get_u16(head + 2) != 0) {
        fail(start, "unknown record type " + std::to_string(type));
    }
    if (length > kMaxRecordPayload) {
        fail(start, "record length " + std::to_string(length) + " exceeds the limit of " +
                        std::to_string(kMaxRecordPayload));
    }
    payload_.resize(length);
    if (!read_exact(payload_.data(), length)) {
        mid_record_ = true;
        truncated_ = true;
        truncation_offset_ = start;
        return false;
    }
    if (crc32c({reinterpret_cast<const uint8_t*>(payload_.data()), length}) != crc) {
        fail(start, "corrupt record (checksum mismatch)");
    }
    record.type = static_cast<RecordType>(type);
    record.offset = start;
    decode(record, payload_);
    if (record.type == RecordType::footer) {
        uint8_t extra;
        if (std::fread(&extra, 1, 1, file_) == 1) fail(offset_, "data after the footer");
        footer_seen_ = true;
    }
    return true;
}

void TraceReader::decode(TraceRecord& r, const std::string& payload) {
    const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
    const size_t n = payload.size();
    auto need = [&](size_t min, const char* what) {
        if (n < min) fail(r.offset, std::string(what) + " record too short");
    };
    switch (r.type) {
        case RecordType::event: {
            if (n != kEventPayloadSize) fail(r.offset, "event record has the wrong size");
            r.event = decode_event(p);
            check_event(r.event, r.offset);
            break;
        }
        case RecordType::event_block: {
            if (!block_) block_ = std::make_unique<Event[]>(kMaxBlockEvents);
            block_size_ = block_next_ = block_valid_ = 0;
            const uint32_t count =
                decode_event_block({p, n}, {block_.get(), kMaxBlockEvents}, block_problem_);
            if (count == 0) fail(r.offset, block_problem_);
            block_size_ = count;
            block_offset_ = r.offset;
            check_block();
            // Yield the block's first event now, the others from next().
            r.type = RecordType::event;
            r.event = block_[0];
            block_next_ = 1;
            break;
        }
        case RecordType::string: {
            need(4, "string");
            r.id = get_u32(p);
            if (r.id != strings_defined_) fail(r.offset, "string ids out of order");
            r.text.assign(payload, 4);
            ++strings_defined_;
            break;
        }
        case RecordType::stack: {
            need(8, "stack");
            r.id = get_u32(p);
            uint32_t depth = get_u32(p + 4);
            if (r.id != stacks_defined_) fail(r.offset, "stack ids out of order");
            if (depth > kMaxStackDepth || n != 8 + size_t{depth} * 8) {
                fail(r.offset, "stack record has an invalid depth");
            }
            r.frames.resize(depth);
            for (uint32_t i = 0; i < depth; ++i)
                r.frames[i] = get_u64(p + 8 + size_t{i} * 8);
            ++stacks_defined_;
            break;
        }
        case RecordType::module: {
            need(18, "module");
            r.module.base = get_u64(p);
            r.module.size = get_u64(p + 8);
            uint16_t id_len = get_u16(p + 16);
            if (18 + size_t{id_len} > n) fail(r.offset, "module record has an invalid build id");
            r.module.build_id.assign(payload, 18, id_len);
            r.module.path.assign(payload, 18 + id_len);
            break;
        }
        case RecordType::param: {
            if (n != 32) fail(r.offset, "param record has the wrong size");
            r.param.index = get_u32(p);
            r.param.layer = get_u32(p + 4);
            r.param.name = get_u32(p + 8);
            r.param.dtype = get_u32(p + 12);
            r.param.numel = get_u64(p + 16);
            r.param.sharded_numel = get_u64(p + 24);
            if (r.param.index != params_defined_) fail(r.offset, "param indices out of order");
            if (r.param.layer >= strings_defined_ || r.param.name >= strings_defined_ ||
                r.param.dtype >= strings_defined_) {
                fail(r.offset, "param refers to an undefined string");
            }
            ++params_defined_;
            break;
        }
        case RecordType::footer: {
            if (n != 48) fail(r.offset, "footer record has the wrong size");
            r.footer.events = get_u64(p);
            r.footer.unknown_frees = get_u64(p + 8);
            r.footer.double_frees = get_u64(p + 16);
            r.footer.stacks_dropped = get_u64(p + 24);
            r.footer.events_dropped = get_u64(p + 32);
            r.footer.end_mono_ns = get_u64(p + 40);
            break;
        }
        case RecordType::host:  // never reaches decode: read_host reads it
            break;
    }
}

TraceReader::EventProblem TraceReader::event_problem(const Event& e, bool ordered,
                                                     uint64_t last_seq) const noexcept {
    if (ordered && e.seq <= last_seq) return EventProblem::backwards;
    if (static_cast<uint8_t>(e.kind) < 1 || static_cast<uint8_t>(e.kind) > kEventKindCount ||
        static_cast<uint8_t>(e.level) > 2 || static_cast<uint8_t>(e.memory) > kMemoryKindMax ||
        static_cast<uint8_t>(e.api) >= kApiCount)
        return EventProblem::bad_enum;
    if (e.kind == EventKind::derived && header_.format_version < 3)
        return EventProblem::derived_too_old;
    if (e.layer >= strings_defined_ || e.phase >= strings_defined_ || e.stack >= stacks_defined_ ||
        (e.kind == EventKind::mark && e.aux >= strings_defined_) ||
        (e.kind == EventKind::param && e.aux >= params_defined_) ||
        (e.kind == EventKind::derived &&
         (e.aux >= params_defined_ || e.stream >= strings_defined_)))
        return EventProblem::undefined;
    return EventProblem::none;
}

void TraceReader::check_block() {
    check_event(block_[0], block_offset_);
    size_t i = 1;
    while (i < block_size_ &&
           event_problem(block_[i], true, block_[i - 1].seq) == EventProblem::none)
        ++i;
    // check_event records the last event yielded: next() checks the first
    // invalid one again when it comes to it.
    block_valid_ = i;
    last_seq_ = block_[i - 1].seq;
}

void TraceReader::check_event(const Event& e, uint64_t offset) {
    switch (event_problem(e, any_event_, last_seq_)) {
        case EventProblem::none:
            break;
        case EventProblem::backwards:
            fail(offset, "event sequence goes backwards (" + std::to_string(e.seq) + " after " +
                             std::to_string(last_seq_) + ")");
        case EventProblem::bad_enum:
            fail(offset, "event has an invalid kind, level, memory kind or api");
        case EventProblem::derived_too_old:
            fail(offset, "event of kind derived in a version " +
                             std::to_string(header_.format_version) + " trace");
        case EventProblem::undefined:
            fail(offset, "event refers to an undefined string, stack or param");
    }
    any_event_ = true;
    last_seq_ = e.seq;
}

TraceStream::TraceStream(const std::string& path) : reader_(std::make_unique<TraceReader>(path)) {
    tables_.path = path;
    tables_.header = reader_->header();
    reader_fresh_ = true;
}

TraceStream::~TraceStream() = default;

std::optional<uint64_t> TraceStream::expected_size() const {
    if (counted()) return size();
    if (const std::optional<FooterRecord> footer = read_footer(tables_.path)) return footer->events;
    return std::nullopt;
}

void TraceStream::start_pass() {
    given_ = 0;
    if (!counted_) {  // the first pass, or one given up before its end
        TraceTables fresh;
        fresh.path = std::move(tables_.path);
        fresh.header = tables_.header;
        tables_ = std::move(fresh);
        count_ = 0;
    }
    // A pass reads from the start: the constructor's reader, else a new one.
    if (!reader_ || !reader_fresh_) reader_ = std::make_unique<TraceReader>(tables_.path);
    reader_fresh_ = false;
}

void TraceStream::finish_first_pass() {
    tables_.truncated = tables_.corrupt || reader_->truncated();
    if (!tables_.corrupt) tables_.truncation_message = reader_->truncation_message();
    counted_ = true;
    reader_.reset();
}

const Event* TraceStream::next() {
    if (counted_) {
        if (given_ == count_) {
            reader_.reset();
            return nullptr;
        }
        if (const Event* e = reader_->next_block_event()) {
            ++given_;
            return e;
        }
        while (reader_->next(record_)) {
            if (record_.type == RecordType::event) {
                ++given_;
                return &record_.event;
            }
        }
        throw TraceError(tables_.path, reader_->truncation_offset(),
                         "the trace has " + std::to_string(given_) + " events, " +
                             std::to_string(count_) + " when it was first read");
    }
    if (const Event* e = reader_->next_block_event()) {
        ++count_;
        return e;
    }
    for (;;) {
        // A corrupt record (a flipped byte, a torn write) ends the trace
        // there, as a cut does: what came before it is kept, and
        // truncation_message says where and what. Before any event there is
        // nothing to keep: the trace is unreadable, and the error is thrown
        // (a later pass starts afresh, this one having never ended).
        bool more = false;
        try {
            more = reader_->next(record_);
        } catch (const TraceError& e) {
            if (count_ == 0) {
                reader_.reset();
                throw;
            }
            tables_.corrupt = true;
            tables_.truncation_message = e.what();
        }
        if (!more) {
            finish_first_pass();
            return nullptr;
        }
        switch (record_.type) {
            case RecordType::event:
                ++count_;
                return &record_.event;
            case RecordType::event_block:  // next() reports its events one by one
            case RecordType::host:         // read with the header (header().host)
                break;
            case RecordType::string:
                tables_.strings.push_back(std::move(record_.text));
                break;
            case RecordType::stack:
                tables_.stacks.push_back(std::move(record_.frames));
                break;
            case RecordType::module:
                tables_.modules.push_back(std::move(record_.module));
                break;
            case RecordType::param:
                tables_.params.push_back(record_.param);
                break;
            case RecordType::footer:
                tables_.footer = record_.footer;
                break;
        }
    }
}

Trace load_trace(const std::string& path) {
    TraceStream stream(path);
    Trace trace;
    stream.for_each([&](const Event& e) { trace.events.push_back(e); });
    static_cast<TraceTables&>(trace) = stream.tables();
    return trace;
}

bool ends_with_footer(const std::string& path) noexcept {
    return read_footer(path).has_value();
}

std::optional<FooterRecord> read_footer(const std::string& path) noexcept {
    constexpr size_t kFooterPayload = 48;
    constexpr size_t kFooterRecord = kRecordHeaderSize + kFooterPayload;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return std::nullopt;
    uint8_t magic[sizeof kTraceMagic] = {};
    uint8_t tail[kFooterRecord] = {};
    bool ok = std::fread(magic, 1, sizeof magic, f) == sizeof magic &&
              std::memcmp(magic, kTraceMagic, sizeof magic) == 0 && std::fseek(f, 0, SEEK_END) == 0;
    const long size = ok ? std::ftell(f) : -1;
    ok = ok && size >= static_cast<long>(kTraceHeaderSize + kFooterRecord) &&
         std::fseek(f, size - static_cast<long>(kFooterRecord), SEEK_SET) == 0 &&
         std::fread(tail, 1, sizeof tail, f) == sizeof tail;
    std::fclose(f);
    if (!ok || get_u16(tail) != static_cast<uint16_t>(RecordType::footer) ||
        get_u16(tail + 2) != 0 || get_u32(tail + 4) != kFooterPayload ||
        get_u32(tail + 8) != crc32c({tail + kRecordHeaderSize, kFooterPayload}))
        return std::nullopt;
    const uint8_t* p = tail + kRecordHeaderSize;
    FooterRecord footer;
    footer.events = get_u64(p);
    footer.unknown_frees = get_u64(p + 8);
    footer.double_frees = get_u64(p + 16);
    footer.stacks_dropped = get_u64(p + 24);
    footer.events_dropped = get_u64(p + 32);
    footer.end_mono_ns = get_u64(p + 40);
    return footer;
}

}  // namespace allocscope
