#include "collective/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>

namespace allocscope::harness::collective {

namespace {

constexpr size_t kPage = 4096;
constexpr auto kRetryPause = std::chrono::milliseconds(1);

size_t round_up(size_t value, size_t to) {
    return (value + to - 1) / to * to;
}

size_t records_offset() {
    return round_up(sizeof(SegmentHeader), kPage);
}

size_t slots_offset(int world_size) {
    return round_up(records_offset() + sizeof(RankRecord) * static_cast<size_t>(world_size), kPage);
}

std::runtime_error system_error(const std::string& what, const std::string& name, int err) {
    return std::runtime_error(what + " " + name + ": " + std::strerror(err));
}

// Closes the descriptor on every path; the mapping keeps the segment alive.
struct FileDescriptor {
    int fd;
    ~FileDescriptor() {
        if (fd >= 0) close(fd);
    }
};

void* map_segment(int fd, size_t size, const std::string& name) {
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) throw system_error("cannot map", name, errno);
    return base;
}

void init_alive_mutex(pthread_mutex_t* mutex) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(mutex, &attr);
    pthread_mutexattr_destroy(&attr);
}

}  // namespace

std::string SharedSegment::name_for(std::string_view rendezvous) {
    std::string name = "/allocscope-coll-";
    for (char c : rendezvous) {
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        name += plain ? c : '_';
    }
    return name;
}

size_t SharedSegment::total_bytes(int world_size, size_t slot_bytes) {
    return slots_offset(world_size) + slot_bytes * static_cast<size_t>(world_size);
}

SharedSegment SharedSegment::create(const std::string& name, int world_size, size_t slot_bytes) {
    const size_t size = total_bytes(world_size, slot_bytes);
    FileDescriptor file{shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600)};
    if (file.fd < 0) {
        if (errno == EEXIST) {
            throw std::runtime_error(
                "shared-memory segment " + name +
                " exists already: another run uses the same rendezvous id, or a crashed run "
                "left it behind (remove /dev/shm" +
                name + ")");
        }
        throw system_error("cannot create shared-memory segment", name, errno);
    }
    // From here on the name is ours: the returned object (or the unwinding
    // below) removes it.
    SharedSegment segment(name, nullptr, size, true);
    if (ftruncate(file.fd, static_cast<off_t>(size)) != 0) {
        throw system_error("cannot size", name, errno);
    }
    if (int err = posix_fallocate(file.fd, 0, static_cast<off_t>(size)); err != 0) {
        throw std::runtime_error("cannot reserve " + std::to_string(size) + " bytes for " + name +
                                 " in /dev/shm: " + std::strerror(err) +
                                 " (is /dev/shm too small? use a smaller slot size)");
    }
    segment.base_ = map_segment(file.fd, size, name);

    auto* header = new (segment.base_) SegmentHeader{};
    header->version = kSegmentVersion;
    header->world_size = static_cast<uint32_t>(world_size);
    header->slot_bytes = slot_bytes;
    header->records_offset = records_offset();
    header->slots_offset = slots_offset(world_size);
    header->total_bytes = size;
    for (int r = 0; r < world_size; ++r) {
        RankRecord* record = new (&segment.record(r)) RankRecord{};
        init_alive_mutex(&record->alive);
    }
    std::atomic_ref(header->magic).store(kSegmentMagic, std::memory_order_release);
    return segment;
}

SharedSegment SharedSegment::attach(const std::string& name, int world_size, size_t slot_bytes,
                                    Deadline deadline) {
    const size_t size = total_bytes(world_size, slot_bytes);
    const auto not_in_time = [&](const std::string& what) {
        return std::runtime_error("rank 0 did not " + what + " " + name + " in time");
    };

    FileDescriptor file{-1};
    while ((file.fd = shm_open(name.c_str(), O_RDWR, 0)) < 0) {
        if (errno != ENOENT) throw system_error("cannot open shared-memory segment", name, errno);
        if (std::chrono::steady_clock::now() >= deadline) throw not_in_time("create");
        std::this_thread::sleep_for(kRetryPause);
    }
    // The creator sizes the file in one ftruncate; until then it is empty and
    // touching a mapping of it would raise SIGBUS.
    for (;;) {
        struct stat st {};
        if (fstat(file.fd, &st) != 0) throw system_error("cannot stat", name, errno);
        if (static_cast<size_t>(st.st_size) == size) break;
        if (st.st_size != 0) {
            throw std::runtime_error(name + " has " + std::to_string(st.st_size) +
                                     " bytes where this rank expects " + std::to_string(size) +
                                     ": ranks disagree on world size or slot size");
        }
        if (std::chrono::steady_clock::now() >= deadline) throw not_in_time("size");
        std::this_thread::sleep_for(kRetryPause);
    }
    SharedSegment segment(name, map_segment(file.fd, size, name), size, false);

    SegmentHeader& header = segment.header();
    while (std::atomic_ref(header.magic).load(std::memory_order_acquire) != kSegmentMagic) {
        if (std::chrono::steady_clock::now() >= deadline) throw not_in_time("initialise");
        std::this_thread::sleep_for(kRetryPause);
    }
    if (header.version != kSegmentVersion ||
        header.world_size != static_cast<uint32_t>(world_size) || header.slot_bytes != slot_bytes) {
        throw std::runtime_error(
            name + " has version " + std::to_string(header.version) + ", world size " +
            std::to_string(header.world_size) + ", slot size " + std::to_string(header.slot_bytes) +
            "; this rank expects version " + std::to_string(kSegmentVersion) + ", " +
            std::to_string(world_size) + ", " + std::to_string(slot_bytes));
    }
    return segment;
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(other.size_),
      linked_(std::exchange(other.linked_, false)) {}

SharedSegment::~SharedSegment() {
    unlink();
    if (base_) munmap(base_, size_);
}

RankRecord& SharedSegment::record(int rank) const {
    auto* records = static_cast<std::byte*>(base_) + records_offset();
    return reinterpret_cast<RankRecord*>(records)[rank];
}

std::byte* SharedSegment::slot(int rank) const {
    return static_cast<std::byte*>(base_) + header().slots_offset +
           header().slot_bytes * static_cast<size_t>(rank);
}

void SharedSegment::unlink() {
    if (!linked_) return;
    linked_ = false;
    shm_unlink(name_.c_str());
}

}  // namespace allocscope::harness::collective
