// Whose code a symbolized frame is, for the concise text report: stacks
// there start at the program's own code, with allocscope's frames and the
// allocator's and framework's internals above it folded into one line.
//
// The patterns are in one table (frames.cpp, kNativeRules and kPythonRules),
// first match wins:
//   allocscope  allocscope's own code: the interposer and the PyTorch bridge
//               (allocscope::*, allocscope_* C entry points, the bridge's
//               sources and libraries), its Python package;
//   allocator   caching allocators: PyTorch's (c10::cuda::CUDACachingAllocator,
//               c10::CachingDeviceAllocator, c10::cuda::CudaMallocAsync, the
//               rest of c10::cuda) and the sim harness's
//               (allocscope::harness::alloc);
//   framework   PyTorch's tensor plumbing: ATen (at::), c10's dispatcher and
//               boxing (the rest of c10::), torch:: and pybind11, their
//               libraries; torch's Python package (module.py's call wrappers,
//               torch/_tensor.py, FSDP, autograd, ...);
//   runtime     what starts a process or thread and runs Python: libc's
//               start, CPython's evaluation loop and call machinery, runpy,
//               and the test runner calling a test (pytest, pluggy);
//   user        everything else (the sim harness's model and trainer count
//               as the program's code).
// A std::function / std::__invoke wrapper takes the kind of what it wraps
// (its template arguments), else it is user code.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace allocscope {

enum class FrameKind { user, allocscope, allocator, framework, runtime };

std::string_view to_string(FrameKind kind) noexcept;

// What every stack of its kind has on top, above the code that asked for the
// memory: allocscope's frames and the allocator's. The text report, the
// HTML tooltips and a check's stacks leave these out first.
constexpr bool above_the_request(FrameKind kind) noexcept {
    return kind == FrameKind::allocscope || kind == FrameKind::allocator;
}

// A native frame's text as SymbolizedFrame::text writes it:
// "function (file:line)", "function", "module+0xoffset" or "0xaddress".
FrameKind native_frame_kind(std::string_view frame) noexcept;
// A Python frame's text: "qualname (file.py:line)".
FrameKind python_frame_kind(std::string_view frame) noexcept;

// The kind of each frame of a stack: native_frame_kind for the frames
// before `first_python`, python_frame_kind for the Python frames from there.
std::vector<FrameKind> frame_kinds(const std::vector<std::string>& frames, size_t first_python);

// The frame a stack starts at for its reader, as an index into `kinds`:
// the first of the program's frames (native ones before Python ones); in a
// stack with none, the first frame below those above the request, and no
// further than the last native frame. The concise text report's stacks
// start there (report.h, stack_lines); the HTML labels a stack with it.
size_t program_start(const std::vector<FrameKind>& kinds, size_t first_python) noexcept;

}  // namespace allocscope
