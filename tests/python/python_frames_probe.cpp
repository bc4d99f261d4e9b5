// The PyTorch bridge's Python frame walk (tools/torch_bridge/python_frames.h)
// without torch, for tests/python/python_frames_test.py: a library loaded
// with ctypes, whose CDLL calls run without the GIL (the walk's raw path,
// as under an operator that released it) and whose PyDLL calls hold it.
// Frames are named by a stand-in for the interposer's
// allocscope_python_frame: "function (file:line)" kept in a table, id =
// index + 1.
#include <time.h>

#include <vector>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "python_frames.h"

#define PROBE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mutex;
std::vector<std::string> g_names;

[[maybe_unused]] uint64_t name_frame(const char* function, const char* file, int line) {
    std::lock_guard lock(g_mutex);
    g_names.push_back(std::string(function) + " (" + file + ":" + std::to_string(line) + ")");
    return g_names.size();
}

[[maybe_unused]] double now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

}  // namespace

// The calling thread's frames, innermost first (ids for probe_name); -1
// where this Python has no frame walk (before 3.12).
PROBE_EXPORT long probe_walk(uint64_t* out, size_t max) {
#if PY_VERSION_HEX >= 0x030C0000
    uint64_t frames[allocscope::pyframes::kPythonFrames];
    const size_t n = allocscope::pyframes::python_frames(frames, name_frame);
    const size_t kept = n < max ? n : max;
    std::memcpy(out, frames, kept * sizeof(uint64_t));
    return static_cast<long>(kept);
#else
    (void)out;
    (void)max;
    return -1;
#endif
}

// With the GIL (a PyDLL call): names and pins the calling thread's frames,
// as the bridge's module hooks do. 0, or -1 where this Python has no raw
// walk (the frames are then named with the GIL only, and pinned then).
PROBE_EXPORT int probe_pin() {
#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
    allocscope::pyframes::pin_python_frames(name_frame);
    return 0;
#else
    return -1;
#endif
}

// The name of frame `id` into `out` (NUL-terminated); its length, 0 for an
// unknown id.
PROBE_EXPORT size_t probe_name(uint64_t id, char* out, size_t size) {
    std::lock_guard lock(g_mutex);
    if (id == 0 || id > g_names.size() || size == 0) return 0;
    const std::string& name = g_names[id - 1];
    const size_t n = name.size() < size - 1 ? name.size() : size - 1;
    std::memcpy(out, name.data(), n);
    out[n] = '\0';
    return name.size();
}

// How many names were made (cache misses of the walk, all threads).
PROBE_EXPORT size_t probe_names_made() {
    std::lock_guard lock(g_mutex);
    return g_names.size();
}

// Average ns of one walk over `iterations` walks from the caller's frames.
PROBE_EXPORT double probe_walk_ns(long iterations) {
#if PY_VERSION_HEX >= 0x030C0000
    uint64_t frames[allocscope::pyframes::kPythonFrames];
    size_t sink = 0;
    const double start = now_ns();
    for (long i = 0; i < iterations; ++i)
        sink += allocscope::pyframes::python_frames(frames, name_frame);
    const double ns = (now_ns() - start) / static_cast<double>(iterations > 0 ? iterations : 1);
    asm volatile("" : : "r"(sink));
    return ns;
#else
    (void)iterations;
    return -1;
#endif
}

// As probe_walk_ns, with `pollute_kib` KiB of other memory written between
// walks (as a training step's own work does between its allocations), only
// the walks timed: what a walk costs when its data is out of the caches.
PROBE_EXPORT double probe_walk_cold_ns(long iterations, long pollute_kib) {
#if PY_VERSION_HEX >= 0x030C0000
    std::vector<unsigned char> other(static_cast<size_t>(pollute_kib) * 1024 + 64);
    uint64_t frames[allocscope::pyframes::kPythonFrames];
    size_t sink = 0;
    double ns = 0;
    for (long i = 0; i < iterations; ++i) {
        for (size_t b = 0; b < other.size(); b += 64)
            other[b] = static_cast<unsigned char>(other[b] + 1);
        asm volatile("" : : : "memory");
        const double start = now_ns();
        sink += allocscope::pyframes::python_frames(frames, name_frame);
        ns += now_ns() - start;
    }
    asm volatile("" : : "r"(sink));
    return ns / static_cast<double>(iterations > 0 ? iterations : 1);
#else
    (void)iterations;
    (void)pollute_kib;
    return -1;
#endif
}
