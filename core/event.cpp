#include "event.h"

namespace allocscope {

std::string_view to_string(EventKind kind) noexcept {
    switch (kind) {
        case EventKind::alloc:
            return "alloc";
        case EventKind::free:
            return "free";
        case EventKind::map:
            return "map";
        case EventKind::unmap:
            return "unmap";
        case EventKind::oom:
            return "oom";
        case EventKind::tag_push:
            return "tag_push";
        case EventKind::tag_pop:
            return "tag_pop";
        case EventKind::step:
            return "step";
        case EventKind::param:
            return "param";
        case EventKind::mark:
            return "mark";
        case EventKind::derived:
            return "derived";
    }
    return "unknown";
}

std::string_view to_string(Level level) noexcept {
    switch (level) {
        case Level::none:
            return "none";
        case Level::segment:
            return "segment";
        case Level::block:
            return "block";
    }
    return "unknown";
}

std::string_view to_string(MemoryKind memory) noexcept {
    switch (memory) {
        case MemoryKind::none:
            return "none";
        case MemoryKind::device:
            return "device";
        case MemoryKind::managed:
            return "managed";
        case MemoryKind::host_pinned:
            return "host_pinned";
        case MemoryKind::physical:
            return "physical";
        case MemoryKind::address_range:
            return "address_range";
    }
    return "unknown";
}

std::string_view to_string(Api api) noexcept {
    switch (api) {
        case Api::none:
            return "none";
        case Api::cudaMalloc:
            return "cudaMalloc";
        case Api::cudaFree:
            return "cudaFree";
        case Api::cudaMallocAsync:
            return "cudaMallocAsync";
        case Api::cudaMallocAsync_ptsz:
            return "cudaMallocAsync_ptsz";
        case Api::cudaFreeAsync:
            return "cudaFreeAsync";
        case Api::cudaFreeAsync_ptsz:
            return "cudaFreeAsync_ptsz";
        case Api::cudaMallocFromPoolAsync:
            return "cudaMallocFromPoolAsync";
        case Api::cudaMallocFromPoolAsync_ptsz:
            return "cudaMallocFromPoolAsync_ptsz";
        case Api::cudaMallocManaged:
            return "cudaMallocManaged";
        case Api::cudaMallocPitch:
            return "cudaMallocPitch";
        case Api::cudaMallocHost:
            return "cudaMallocHost";
        case Api::cudaHostAlloc:
            return "cudaHostAlloc";
        case Api::cudaFreeHost:
            return "cudaFreeHost";
        case Api::block_alloc:
            return "allocscope_block_alloc";
        case Api::block_free:
            return "allocscope_block_free";
        case Api::c_api:
            return "allocscope_c_api";
        case Api::cuMemAlloc_v2:
            return "cuMemAlloc_v2";
        case Api::cuMemAllocPitch_v2:
            return "cuMemAllocPitch_v2";
        case Api::cuMemFree_v2:
            return "cuMemFree_v2";
        case Api::cuMemAllocAsync:
            return "cuMemAllocAsync";
        case Api::cuMemAllocAsync_ptsz:
            return "cuMemAllocAsync_ptsz";
        case Api::cuMemFreeAsync:
            return "cuMemFreeAsync";
        case Api::cuMemFreeAsync_ptsz:
            return "cuMemFreeAsync_ptsz";
        case Api::cuMemAllocFromPoolAsync:
            return "cuMemAllocFromPoolAsync";
        case Api::cuMemAllocFromPoolAsync_ptsz:
            return "cuMemAllocFromPoolAsync_ptsz";
        case Api::cuMemAllocManaged:
            return "cuMemAllocManaged";
        case Api::cuMemCreate:
            return "cuMemCreate";
        case Api::cuMemRelease:
            return "cuMemRelease";
        case Api::cuMemMap:
            return "cuMemMap";
        case Api::cuMemUnmap:
            return "cuMemUnmap";
        case Api::cuMemAddressReserve:
            return "cuMemAddressReserve";
        case Api::cuMemAddressFree:
            return "cuMemAddressFree";
    }
    return "unknown";
}

std::string python_frame_text(std::string_view function, std::string_view file, int line) {
    std::string text(function.empty() ? std::string_view("<module>") : function);
    text += " (";
    text += file;
    text += ':';
    text += std::to_string(line);
    text += ')';
    return text;
}

}  // namespace allocscope
