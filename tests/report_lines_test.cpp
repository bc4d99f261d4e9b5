// The text report's stack lines (analyze/report.h, stack_lines): which native
// and Python frames a stack shows, and how PyTorch's caching allocator's
// leading frames are folded into one line.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "report.h"

using namespace allocscope;

namespace {

RankReport with_stack(std::vector<std::string> frames, size_t python_from) {
    RankReport r;
    r.stacks[7] = std::move(frames);
    if (python_from != 0) r.python_from[7] = python_from;
    return r;
}

const std::vector<std::string> kBlockStack = {
    "void (anonymous namespace)::on_entry<c10::CachingDeviceAllocator::TraceEntry>(c10::"
    "CachingDeviceAllocator::TraceEntry const&) (../tools/torch_bridge/bridge.cpp:348)",
    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, "
    "CUstream_st*)",
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
    "at::detail::empty_generic(...)",
    "at::native::_to_copy(...)",
    "at::_ops::_to_copy::call(...)",
    "quantize (/src/train.py:61)",
    "Fp8Linear.forward (/src/train.py:125)",
};

}  // namespace

TEST_CASE(
    "a block's stack folds the caching allocator's frames and shows its caller, then the "
    "Python lines") {
    const RankReport r = with_stack(kBlockStack, 6);
    const std::vector<std::string> lines = stack_lines(r, 7, 2, 1);
    const std::vector<std::string> want = {
        "[3 frames of PyTorch's caching allocator]",
        "at::detail::empty_generic(...)",
        "at::native::_to_copy(...)",
        "... 1 more native frames",
        "quantize (/src/train.py:61)",
        "... 1 more Python frames",
    };
    CHECK(lines == want);
}

TEST_CASE("a stack of allocator frames alone still shows its last native frame") {
    const RankReport r = with_stack({kBlockStack[0], kBlockStack[1], kBlockStack[2]}, 0);
    const std::vector<std::string> lines = stack_lines(r, 7, 4, 4);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] == "[2 frames of PyTorch's caching allocator]");
    CHECK(lines[1] == kBlockStack[2]);
}

TEST_CASE("a stack that does not start in the allocator is shown from its first frame") {
    const RankReport r = with_stack({"main", "c10::cuda::CUDACachingAllocator::x()", "start"}, 0);
    const std::vector<std::string> lines = stack_lines(r, 7, 2, 4);
    const std::vector<std::string> want = {"main", "c10::cuda::CUDACachingAllocator::x()",
                                           "... 1 more native frames"};
    CHECK(lines == want);
    CHECK(stack_lines(r, 8, 2, 4).empty());  // an unknown stack id
}

TEST_CASE("caching-allocator frames are told by PyTorch's namespaces and the bridge's entry") {
    CHECK(caching_allocator_frame("c10::cuda::CUDACachingAllocator::Native::foo()"));
    CHECK(caching_allocator_frame("c10::CachingDeviceAllocator::bar()"));
    CHECK(caching_allocator_frame(
        "void (anonymous namespace)::on_entry<c10::cuda::CUDACachingAllocator::TraceEntry>(x)"));
    CHECK_FALSE(caching_allocator_frame("at::detail::empty_generic(...)"));
    CHECK_FALSE(caching_allocator_frame("libtorch_cuda.so+0x1234"));
    CHECK_FALSE(caching_allocator_frame("my::c10::cuda::CUDACachingAllocator::lookalike()"));
}
