#include "trace_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace allocscope {

namespace {
constexpr size_t kFlushThreshold = 256 * 1024;
}

TraceWriter::~TraceWriter() {
    if (fd_ >= 0) {
        flush();
        ::close(fd_);
    }
}

bool TraceWriter::open(const std::string& path, const TraceHeader& header, std::string& error) {
    block_.reserve();
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ < 0) {
        int saved = errno;
        error = "cannot create trace file " + path + ": " + std::strerror(saved);
        errno = saved;
        return false;
    }
    buffer_.reserve(kFlushThreshold + 4096);
    buffer_ = encode_header(header);
    if (header.format_version >= 4 && !header.host.empty()) {
        append_record(buffer_, RecordType::host,
                      std::string_view(header.host).substr(0, kMaxHostBytes));
    }
    flush();
    if (failed_) {
        ::close(fd_);
        fd_ = -1;
        error = error_;
        return false;
    }
    return true;
}

bool TraceWriter::put(RecordType type, std::string_view payload) {
    if (fd_ < 0 || failed_) {
        ++dropped_;
        return false;
    }
    append_record(buffer_, type, payload);
    if (buffer_.size() >= kFlushThreshold) write_buffer();
    return !failed_;
}

void TraceWriter::event(const Event& event) {
    if (fd_ < 0 || failed_) {
        ++dropped_;
        return;
    }
    block_.add(event);
    ++events_;
    if (block_.full()) end_block();
}

void TraceWriter::end_block() {
    if (block_.empty()) return;
    if (fd_ >= 0 && !failed_) put(RecordType::event_block, block_.payload());
    block_.clear();
}

void TraceWriter::string(uint32_t id, std::string_view text) {
    if (text.size() > kMaxStringBytes) text = text.substr(0, kMaxStringBytes);
    scratch_.clear();
    put_u32(scratch_, id);
    scratch_.append(text);
    put(RecordType::string, scratch_);
}

void TraceWriter::stack(uint32_t id, std::span<const uint64_t> frames) {
    if (frames.size() > kMaxStackDepth) frames = frames.first(kMaxStackDepth);
    scratch_.clear();
    put_u32(scratch_, id);
    put_u32(scratch_, static_cast<uint32_t>(frames.size()));
    for (uint64_t f : frames)
        put_u64(scratch_, f);
    put(RecordType::stack, scratch_);
}

void TraceWriter::module(const ModuleRecord& m) {
    scratch_.clear();
    put_u64(scratch_, m.base);
    put_u64(scratch_, m.size);
    std::string_view build_id = std::string_view(m.build_id).substr(0, 255);
    put_u16(scratch_, static_cast<uint16_t>(build_id.size()));
    scratch_.append(build_id);
    scratch_.append(std::string_view(m.path).substr(0, kMaxStringBytes));
    put(RecordType::module, scratch_);
}

void TraceWriter::param(const ParamRecord& p) {
    scratch_.clear();
    put_u32(scratch_, p.index);
    put_u32(scratch_, p.layer);
    put_u32(scratch_, p.name);
    put_u32(scratch_, p.dtype);
    put_u64(scratch_, p.numel);
    put_u64(scratch_, p.sharded_numel);
    put(RecordType::param, scratch_);
}

void TraceWriter::close(const FooterRecord& f) {
    if (fd_ < 0) return;
    end_block();
    scratch_.clear();
    put_u64(scratch_, f.events);
    put_u64(scratch_, f.unknown_frees);
    put_u64(scratch_, f.double_frees);
    put_u64(scratch_, f.stacks_dropped);
    put_u64(scratch_, f.events_dropped);
    put_u64(scratch_, f.end_mono_ns);
    put(RecordType::footer, scratch_);
    flush();
    ::close(fd_);
    fd_ = -1;
}

bool TraceWriter::adopt(const std::string& replacement, uint64_t bytes, uint64_t events,
                        std::string& error) {
    if (fd_ < 0 || failed_ || !buffer_.empty() || !block_.empty()) {
        error = "the trace is not flushed";
        return false;
    }
    const int fd = ::open(replacement.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        error = "cannot open " + replacement + ": " + std::strerror(errno);
        return false;
    }
    if (::rename(replacement.c_str(), path_.c_str()) != 0) {
        error = "cannot rename " + replacement + " over " + path_ + ": " + std::strerror(errno);
        ::close(fd);
        return false;
    }
    ::close(fd_);
    fd_ = fd;
    bytes_ = bytes;
    events_ = events;
    return true;
}

void TraceWriter::flush() {
    end_block();
    write_buffer();
}

void TraceWriter::write_buffer() {
    if (fd_ < 0 || failed_ || buffer_.empty()) return;
    const char* p = buffer_.data();
    size_t left = buffer_.size();
    while (left > 0) {
        ssize_t n = ::write(fd_, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int saved = errno;
            failed_ = true;
            error_ = "cannot write trace file " + path_ + ": " +
                     (n == 0 ? std::string("short write") : std::string(std::strerror(saved)));
            break;
        }
        p += n;
        left -= static_cast<size_t>(n);
        bytes_ += static_cast<uint64_t>(n);
    }
    buffer_.clear();
}

}  // namespace allocscope
