// The text report's lines (analyze/report.h): whose code a frame is
// (core/frames.h), the stacks the concise report prints from the
// program's code, all frames under --full, and findings of several ranks
// shown once; the HTML report's stack labels and findings, which agree with
// the text; the JSON report's timeline at the HTML one's detail.
// Longer than 600 lines: one specification of what the renderings print,
// each case built from its own small trace.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "frames.h"
#include "json.h"
#include "report.h"

using namespace allocscope;

namespace {

RankReport with_stack(std::vector<std::string> frames, size_t python_from) {
    RankReport r;
    r.stacks[7] = std::move(frames);
    if (python_from != 0) r.python_from[7] = python_from;
    return r;
}

// A PyTorch block's stack as the bridge records it: the bridge's handler,
// the caching allocator, ATen's empty and the dispatcher, autograd, the
// Python binding, CPython; then the Python frames.
const std::vector<std::string> kTorchNative = {
    "std::_Function_handler<void (c10::cuda::CUDACachingAllocator::TraceEntry const&), "
    "allocscope_torch_bridge_attach::{lambda()#1}::operator()() const::{lambda(auto:1 "
    "const&)#1}>::_M_invoke(std::_Any_data const&, c10::cuda::CUDACachingAllocator::TraceEntry "
    "const&)",
    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
    "unsigned long, CUstream_st*)",
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed "
    "char, unsigned long, CUstream_st*)",
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
    "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
    "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
    "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, "
    "std::optional<c10::MemoryFormat>)",
    "at::(anonymous namespace)::(anonymous namespace)::wrapper_CUDA_memory_format_empty(c10::"
    "ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, "
    "std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::Tensor c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::"
    "WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<at::Tensor (c10::ArrayRef<c10::"
    "SymInt>), &at::(anonymous namespace)::wrapper_CUDA_memory_format_empty>, at::Tensor, "
    "c10::guts::typelist::typelist<c10::ArrayRef<c10::SymInt> > >, at::Tensor (c10::ArrayRef<"
    "c10::SymInt>)>::call(c10::OperatorKernel*, c10::DispatchKeySet, c10::ArrayRef<c10::"
    "SymInt>)",
    "at::_ops::empty_memory_format::redispatch(c10::DispatchKeySet, c10::ArrayRef<c10::SymInt>, "
    "std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, "
    "std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, bool, "
    "std::optional<c10::MemoryFormat>) (/pytorch/aten/src/ATen/native/TensorConversions.cpp:"
    "294)",
    "torch::autograd::VariableType::(anonymous namespace)::_to_copy(c10::DispatchKeySet, "
    "at::Tensor const&, bool, std::optional<c10::MemoryFormat>)",
    "torch::autograd::THPVariable_to(_object*, _object*, _object*)",
    "cfunction_call (Objects/methodobject.c:537)",
    "_PyObject_MakeTpCall (Objects/call.c:240)",
    "_PyEval_EvalFrameDefault (Python/bytecodes.c:2715)",
};
const std::vector<std::string> kTorchPython = {
    "Linear.forward (/usr/local/lib/python3.12/dist-packages/torch/nn/modules/linear.py:125)",
    "Module._call_impl (/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py:1773)",
    "Module._wrapped_call_impl "
    "(/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py:1762)",
    "Block.forward (/home/me/train.py:41)",
    "Module._call_impl (/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py:1773)",
    "Model.forward (/home/me/train.py:77)",
    "main (/home/me/train.py:120)",
    "<module> (/home/me/train.py:140)",
    "_run_module_as_main (<frozen runpy>:198)",
};

std::vector<std::string> torch_stack() {
    std::vector<std::string> frames = kTorchNative;
    frames.insert(frames.end(), kTorchPython.begin(), kTorchPython.end());
    return frames;
}

// The sim harness's: its caching allocator, then the trainer (the program).
const std::vector<std::string> kHarnessStack = {
    "allocscope::harness::alloc::CachingAllocator::allocate(unsigned long, void*) "
    "(../harness/alloc/caching_allocator.cpp:124)",
    "allocscope::harness::trainer::Trainer::State::quantize_weight(allocscope::harness::trainer::"
    "(anonymous namespace)::Param&, bool, bool) (../harness/trainer/trainer.cpp:502)",
    "allocscope::harness::trainer::Trainer::State::forward(allocscope::harness::trainer::"
    "StepMemory&)",
    "allocscope::harness::trainer::Trainer::step(int) (../harness/trainer/trainer.cpp:780)",
    "main (../harness/trainer/main.cpp:105)",
    "__libc_start_call_main (../sysdeps/nptl/libc_start_call_main.h:58)",
    "__libc_start_main (../csu/libc-start.c:360)",
    "_start",
};

Finding finding(int32_t rank, Severity severity, std::string summary, uint64_t bytes,
                std::vector<uint64_t> evidence_steps = {5}) {
    Finding f;
    f.plugin = "weight-copy-accumulation";
    f.severity = severity;
    f.rank = rank;
    f.layer = "layers.0";
    f.phase = "forward";
    f.bytes = bytes;
    f.count = 1;
    f.summary = std::move(summary);
    for (uint64_t step : evidence_steps) {
        Evidence e;
        e.size = bytes;
        e.step = step;
        e.alloc_seq = 100 + step + uint64_t(rank);  // seqs differ between ranks
        e.layer = "layers.0";
        e.phase = "forward";
        f.evidence.push_back(e);
    }
    return f;
}

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

}  // namespace

TEST_CASE("PyTorch's native frames: the bridge is allocscope's, then allocator, ATen, runtime") {
    std::vector<FrameKind> kinds;
    for (const std::string& f : kTorchNative)
        kinds.push_back(native_frame_kind(f));
    const std::vector<FrameKind> want = {
        FrameKind::allocscope, FrameKind::allocator, FrameKind::allocator, FrameKind::allocator,
        FrameKind::framework,  FrameKind::framework, FrameKind::framework, FrameKind::framework,
        FrameKind::framework,  FrameKind::framework, FrameKind::framework, FrameKind::framework,
        FrameKind::runtime,    FrameKind::runtime,   FrameKind::runtime,
    };
    CHECK(kinds == want);
}

TEST_CASE("allocscope's own frames are told by namespace, C entry, source file and library") {
    CHECK(native_frame_kind("allocscope::TraceWriter::append(allocscope::Event const&)") ==
          FrameKind::allocscope);
    CHECK(native_frame_kind("allocscope_block_alloc") == FrameKind::allocscope);
    CHECK(native_frame_kind("void (anonymous namespace)::on_entry<c10::CachingDeviceAllocator::"
                            "TraceEntry>(c10::CachingDeviceAllocator::TraceEntry const&)") ==
          FrameKind::allocscope);
    CHECK(native_frame_kind("(anonymous namespace)::forward_post(_object*, _object* const*, long) "
                            "(../tools/torch_bridge/tag_hooks.cpp:230)") == FrameKind::allocscope);
    CHECK(native_frame_kind("/usr/lib/x86_64-linux-gnu/liballocscope.so+0x1f2e") ==
          FrameKind::allocscope);
    CHECK(native_frame_kind("/opt/as/lib/allocscope/liballocscope_torch_bridge.so+0x99") ==
          FrameKind::allocscope);
}

TEST_CASE("the sim harness's caching allocator is an allocator, its trainer the program") {
    CHECK(native_frame_kind(kHarnessStack[0]) == FrameKind::allocator);
    CHECK(native_frame_kind(kHarnessStack[1]) == FrameKind::user);
    CHECK(native_frame_kind(kHarnessStack[2]) == FrameKind::user);
    CHECK(native_frame_kind(kHarnessStack[4]) == FrameKind::user);  // main
    CHECK(native_frame_kind(kHarnessStack[5]) == FrameKind::runtime);
    CHECK(native_frame_kind(kHarnessStack[7]) == FrameKind::runtime);
}

TEST_CASE("a frame is the program's unless its own name, file or library says otherwise") {
    // Lookalikes: the pattern inside another name, or in the arguments.
    CHECK(native_frame_kind("my::c10::cuda::CUDACachingAllocator::lookalike()") == FrameKind::user);
    CHECK(native_frame_kind("void my::fill<at::Tensor>(at::Tensor const&, c10::Scalar)") ==
          FrameKind::user);
    CHECK(native_frame_kind("transformer_engine::pytorch::cast_to_fp8(at::Tensor const&)") ==
          FrameKind::user);
    CHECK(native_frame_kind("Pyramid::build(int)") == FrameKind::user);  // not CPython's Py*
    CHECK(native_frame_kind("0x7f3a00001234") == FrameKind::user);
    CHECK(native_frame_kind("/home/me/libmodel.so+0x10") == FrameKind::user);
    CHECK(native_frame_kind("/opt/torch/lib/libtorch_cuda.so+0x1234") == FrameKind::framework);
    CHECK(native_frame_kind("/opt/torch/lib/libc10_cuda.so+0x1234") == FrameKind::allocator);
    CHECK(native_frame_kind("/usr/lib/libpython3.12.so.1.0+0x55") == FrameKind::runtime);
    // A std::function calling the program's lambda is the program's; one
    // calling the allocator's is the allocator's.
    CHECK(native_frame_kind("std::_Function_handler<void (at::Tensor const&), "
                            "mymodel::hook()::{lambda(at::Tensor const&)#1}>::_M_invoke("
                            "std::_Any_data const&, at::Tensor const&)") == FrameKind::user);
    CHECK(native_frame_kind("std::_Function_handler<void (), c10::cuda::CUDACachingAllocator::"
                            "Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
                            "CUstream_st*)::{lambda()#1}>::_M_invoke(std::_Any_data const&)") ==
          FrameKind::allocator);
    CHECK(native_frame_kind("std::function<void (c10::cuda::CUDACachingAllocator::TraceEntry "
                            "const&)>::operator()(c10::cuda::CUDACachingAllocator::TraceEntry "
                            "const&) const") == FrameKind::allocator);
    CHECK(native_frame_kind("c10::function_ref<void (char**, long const*, long, long)>::"
                            "operator()(char**, long const*, long, long) const") ==
          FrameKind::framework);
    CHECK(native_frame_kind("at::Tensor::operator<(at::Tensor const&) const") ==
          FrameKind::framework);
}

TEST_CASE("Python frames: torch's package is framework, allocscope's package its own") {
    std::vector<FrameKind> kinds;
    for (const std::string& f : kTorchPython)
        kinds.push_back(python_frame_kind(f));
    const std::vector<FrameKind> want = {
        FrameKind::framework, FrameKind::framework, FrameKind::framework,
        FrameKind::user,      FrameKind::framework, FrameKind::user,
        FrameKind::user,      FrameKind::user,      FrameKind::runtime,
    };
    CHECK(kinds == want);
    CHECK(python_frame_kind("Tensor.backward (/usr/lib/python3/dist-packages/torch/_tensor.py:"
                            "626)") == FrameKind::framework);
    CHECK(python_frame_kind("FSDPParamGroup.unshard (/venv/lib/python3.12/site-packages/torch/"
                            "distributed/fsdp/_fully_shard/_fsdp_param_group.py:300)") ==
          FrameKind::framework);
    CHECK(python_frame_kind("_pre_forward (/opt/as/share/allocscope/python/allocscope/torch/"
                            "_hooks.py:80)") == FrameKind::allocscope);
    // The package as `meson install` puts it into the interpreter's path.
    CHECK(python_frame_kind("_pre_forward (/usr/local/lib/python3/dist-packages/allocscope/torch/"
                            "_hooks.py:80)") == FrameKind::allocscope);
    CHECK(python_frame_kind("check.__exit__ (/opt/as/lib/python3.11/site-packages/allocscope/"
                            "__init__.py:400)") == FrameKind::allocscope);
    CHECK(python_frame_kind("Float8Quantizer.quantize (/venv/lib/python3.12/site-packages/"
                            "transformer_engine/pytorch/tensor/float8_tensor.py:120)") ==
          FrameKind::user);
    CHECK(python_frame_kind("train (/home/me/allocscope/tests/gpu/fsdp2_fp8_train.py:408)") ==
          FrameKind::user);
    // torch.compile's generated modules, in inductor's default cache
    // directory and in one of the user's (TORCHINDUCTOR_CACHE_DIR).
    CHECK(python_frame_kind("Runner.call (/tmp/torchinductor_root/c5/"
                            "c5in52gkxnq3bfpdbsdcrxj7mvxz6e6ymlgxyu5xk2mqlvdnuhdj.py:1036)") ==
          FrameKind::framework);
    CHECK(python_frame_kind("call (/scratch/ind/c5/"
                            "c5in52gkxnq3bfpdbsdcrxj7mvxz6e6ymlgxyu5xk2mqlvdnuhdj.py:88)") ==
          FrameKind::framework);
    CHECK(python_frame_kind("triton_poi_fused_0 (/tmp/torchinductor_me/ab/"
                            "cabcdefghij.py:12)") == FrameKind::framework);
    CHECK(python_frame_kind("call (/home/me/c5in52gkxnq3bfpdbsdcrxj7mvxz6e6ymlgxyu5xk2m.py:8)") ==
          FrameKind::user);  // a name of another length is the program's
    // pytest running the program's test is the runtime, not the program.
    CHECK(python_frame_kind("pytest_pyfunc_call (/usr/lib/python3/dist-packages/_pytest/"
                            "python.py:195)") == FrameKind::runtime);
    CHECK(python_frame_kind("_multicall (/venv/lib/python3.12/site-packages/pluggy/"
                            "_callers.py:39)") == FrameKind::runtime);
    CHECK(python_frame_kind("test_step (/home/me/proj/tests/test_pytest_like.py:12)") ==
          FrameKind::user);
}

TEST_CASE("a PyTorch stack starts at the program's first Python line, the rest folded") {
    const RankReport r = with_stack(torch_stack(), kTorchNative.size());
    const std::vector<std::string> lines = stack_lines(r, 7, 4, 2);
    const std::vector<std::string> want = {
        "... 4 allocator frames, 11 framework frames, 3 runtime frames",
        "Block.forward (/home/me/train.py:41)",
        "... 1 framework frame",
        "Model.forward (/home/me/train.py:77)",
        "... 3 more Python frames",
    };
    CHECK(lines == want);
    // No frame is lost: --full has them all, in order.
    CHECK(all_stack_lines(r, 7) == torch_stack());
}

TEST_CASE("a C++ stack starts at the program's first frame after the allocator") {
    const RankReport r = with_stack(kHarnessStack, 0);
    const std::vector<std::string> want = {
        "... 1 allocator frame",
        kHarnessStack[1],
        kHarnessStack[2],
        "... 5 more native frames",
    };
    CHECK(stack_lines(r, 7, 2, 4) == want);
}

TEST_CASE("the program's C++ inside a PyTorch stack shows with its Python lines") {
    std::vector<std::string> frames = {kTorchNative[0], kTorchNative[1],
                                       "transformer_engine::pytorch::cast_to_fp8(at::Tensor "
                                       "const&)",
                                       kTorchNative[11], kTorchNative[14]};
    const size_t python_from = frames.size();
    frames.insert(frames.end(), kTorchPython.begin(), kTorchPython.end());
    const RankReport r = with_stack(frames, python_from);
    const std::vector<std::string> want = {
        "... 2 allocator frames",
        "transformer_engine::pytorch::cast_to_fp8(at::Tensor const&)",
        "... 2 more native frames",
        "... 3 framework frames",
        "Block.forward (/home/me/train.py:41)",
        "... 5 more Python frames",
    };
    CHECK(stack_lines(r, 7, 3, 1) == want);
}

TEST_CASE("a stack with none of the program's frames shows its first frame past the allocator") {
    const RankReport r = with_stack({kTorchNative[0], kTorchNative[1], kTorchNative[3]}, 0);
    const std::vector<std::string> lines = stack_lines(r, 7, 4, 4);
    const std::vector<std::string> want = {"... 2 allocator frames", kTorchNative[3]};
    CHECK(lines == want);
    CHECK(stack_lines(r, 8, 2, 4).empty());  // an unknown stack id
}

namespace {

// The stacks above, as one rank's: 7 the sim harness's, 8 PyTorch's with
// Python frames, 9 one with none of the program's frames, 10 the program's
// C++ inside a PyTorch stack.
RankReport every_kind_of_stack() {
    RankReport r = with_stack(kHarnessStack, 0);
    r.stacks[8] = torch_stack();
    r.python_from[8] = kTorchNative.size();
    r.stacks[9] = {kTorchNative[0], kTorchNative[1], kTorchNative[3]};
    r.stacks[10] = {kTorchNative[0], kTorchNative[1],
                    "transformer_engine::pytorch::cast_to_fp8(at::Tensor const&)",
                    kTorchNative[14]};
    r.stacks[10].insert(r.stacks[10].end(), kTorchPython.begin(), kTorchPython.end());
    r.python_from[10] = 4;
    return r;
}

// The frame each of them starts at.
const std::map<uint32_t, std::string> kStackStarts = {
    {7, kHarnessStack[1]},
    {8, "Block.forward (/home/me/train.py:41)"},
    {9, kTorchNative[3]},
    {10, "transformer_engine::pytorch::cast_to_fp8(at::Tensor const&)"},
};

}  // namespace

TEST_CASE("a stack starts at the frame its text lines show first, never the allocator's") {
    const RankReport r = every_kind_of_stack();
    for (const auto& [id, frame] : kStackStarts) {
        CAPTURE(id);
        CHECK(stack_start(r, id) == frame);
        const std::vector<std::string> lines = stack_lines(r, id, 4, 4);
        const auto shown = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
            return !line.starts_with("... ");
        });
        REQUIRE(shown != lines.end());
        CHECK(*shown == frame);
    }
    CHECK(stack_start(r, 11).empty());  // an unknown stack id
}

TEST_CASE("the HTML labels each stack with the frame its text starts at, the program's") {
    Report report;
    report.ranks.push_back(every_kind_of_stack());
    report.ranks[0].analysis.header.rank = 0;
    report.findings_found = true;
    for (const auto& [id, frame] : kStackStarts) {
        Finding f = finding(0, Severity::error, "copies #" + std::to_string(id), 1536);
        f.evidence[0].stack_id = id;
        report.findings.findings.push_back(f);
    }
    const std::string html = render_html(report);
    for (const auto& [id, frame] : kStackStarts) {
        CAPTURE(id);
        CHECK(count(html, "<summary>stack " + std::to_string(id) + ": " + html_escape(frame) +
                              "</summary>") == 1);
    }
    CHECK(count(html, "<summary>stack 7: allocscope::harness::alloc::") == 0);
    CHECK(count(html, "<summary>stack 8: std::_Function_handler") == 0);
}

TEST_CASE("findings two ranks share are one group, shown once as ranks 0–1") {
    FindingsFile file;
    file.findings.push_back(finding(0, Severity::error, "copies outlive forward (step 5)", 1536));
    file.findings.push_back(finding(0, Severity::info, "owns 32.0 MiB", 4096));
    file.findings.push_back(finding(1, Severity::error, "copies outlive forward (step 5)", 1536));
    file.findings.push_back(finding(1, Severity::info, "owns 32.0 MiB", 4096));
    const std::vector<FindingGroup> groups = collapse_findings(file);
    REQUIRE(groups.size() == 2);
    REQUIRE(groups[0].members.size() == 2);
    CHECK(groups[0].members[0]->rank == 0);
    CHECK(groups[0].members[1]->rank == 1);
    const std::vector<std::string> lines = group_lines(groups[0]);
    REQUIRE(lines.size() == 1);  // the same evidence on both: nothing more to say
    CHECK(lines[0] ==
          "error   weight-copy-accumulation  ranks 0–1  layers.0/forward  1.50 KiB  "
          "copies outlive forward (step 5)");
}

TEST_CASE("a shared finding whose ranks differ says how: the other rank's bytes and summary") {
    FindingsFile file;
    file.findings.push_back(finding(0, Severity::error, "copies outlive forward (step 5)", 1536));
    file.findings.push_back(finding(1, Severity::error, "copies outlive forward (step 4)", 2048));
    const std::vector<FindingGroup> groups = collapse_findings(file);
    REQUIRE(groups.size() == 1);
    const std::vector<std::string> lines = group_lines(groups[0]);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].find("ranks 0–1") != std::string::npos);
    CHECK(lines[0].ends_with("copies outlive forward (step 5)"));
    CHECK(lines[1] == "  rank 1: 2.00 KiB  copies outlive forward (step 4)");
}

TEST_CASE("a shared finding with the same summary but other evidence shows both evidences") {
    FindingsFile file;
    file.findings.push_back(finding(0, Severity::warning, "kept", 1024, {3, 4, 5}));
    file.findings.push_back(finding(1, Severity::warning, "kept", 1024, {5}));
    const std::vector<FindingGroup> groups = collapse_findings(file);
    REQUIRE(groups.size() == 1);
    const std::vector<std::string> lines = group_lines(groups[0]);
    REQUIRE(lines.size() == 2);
    CHECK(lines[1] ==
          "  rank 1: evidence 1 allocation(s), 1.00 KiB, step 5 (rank 0: 3 "
          "allocation(s), 3.00 KiB, steps 3–5)");
}

TEST_CASE("findings are never grouped across severities, within a rank, or without a rank") {
    FindingsFile file;
    file.findings.push_back(finding(0, Severity::error, "copies (step 5)", 1536));
    file.findings.push_back(finding(0, Severity::error, "copies (step 6)", 1536));  // same rank
    file.findings.push_back(finding(1, Severity::warning, "copies (step 5)", 1536));
    file.findings.push_back(finding(-1, Severity::info, "owns", 10));
    file.findings.push_back(finding(-1, Severity::info, "owns", 10));  // another process
    const std::vector<FindingGroup> groups = collapse_findings(file);
    REQUIRE(groups.size() == 5);
    for (const FindingGroup& g : groups)
        CHECK(g.members.size() == 1);
}

TEST_CASE("rank lists read as ranges") {
    CHECK(ranks_text({0}) == "rank 0");
    CHECK(ranks_text({1, 0}) == "ranks 0–1");
    CHECK(ranks_text({0, 1, 2, 5, 7, 8}) == "ranks 0–2, 5, 7–8");
    CHECK(ranks_text({-1}) == "no rank");
}

namespace {

// Two ranks that found the same: one error, five infos each.
Report two_ranks_alike() {
    Report report;
    for (int32_t rank : {0, 1}) {
        RankReport r;
        r.analysis.header.rank = rank;
        r.analysis.path = "/runs/a/rank" + std::to_string(rank) + ".trace";
        report.ranks.push_back(std::move(r));
    }
    report.findings_found = true;
    report.findings.findings.push_back(finding(0, Severity::error, "copies (step 5)", 1536));
    report.findings.findings.push_back(finding(1, Severity::error, "copies (step 5)", 1536));
    for (int i = 0; i < 5; ++i) {
        for (int32_t rank : {0, 1}) {
            Finding f = finding(rank, Severity::info, "owns #" + std::to_string(i), 100);
            f.plugin = "peak-owner";
            report.findings.findings.push_back(f);
        }
    }
    return report;
}

// Text between `from` and the next `to` after it, "" when absent.
std::string between(const std::string& text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    if (at == std::string::npos) return {};
    const size_t begin = at + from.size();
    return text.substr(begin, text.find(to, begin) - begin);
}

}  // namespace

TEST_CASE("the concise text shows a finding of two ranks once, --full once per rank") {
    const Report report = two_ranks_alike();
    const std::string concise = render_text(report);
    CHECK(count(concise, "weight-copy-accumulation") == 1);
    CHECK(count(concise, "ranks 0–1  layers.0/forward  1.50 KiB  copies (step 5)") == 1);
    CHECK(concise.find("findings: 1 error, 0 warnings, 5 infos on ranks 0–1 (2, 0 and 10 "
                       "counting each rank's); what several ranks found alike is one finding, "
                       "shown once\n") != std::string::npos);
    CHECK(concise.find("info: 10 finding(s), 5 distinct: peak-owner 10") != std::string::npos);
    CHECK(count(concise, "info    peak-owner") == 3);  // the largest few
    CHECK(concise.find("... 2 more distinct info findings (--full)") != std::string::npos);
    CHECK(concise.find("allocscope report --full /runs/a") != std::string::npos);
    const std::string full = render_text(report, TextDetail::full);
    CHECK(count(full, "weight-copy-accumulation  rank 0") == 1);
    CHECK(count(full, "weight-copy-accumulation  rank 1") == 1);
    CHECK(count(full, "info    peak-owner") == 10);
}

TEST_CASE("the HTML shows a finding of two ranks once, naming both, and counts as the text") {
    const Report report = two_ranks_alike();
    const std::string html = render_html(report);
    // One row per finding the text counts: the error and the five infos.
    CHECK(count(html, "<details class=finding>") == 6);
    CHECK(count(html, "</b> ranks 0–1 layers.0 forward &mdash; ") == 6);
    CHECK(count(html, "</b> rank 0 ") == 0);
    CHECK(count(html, "</b> rank 1 ") == 0);
    CHECK(count(html, "<details class=infos><summary>5 info finding(s)") == 1);
    // The text's count line, word for word.
    const std::string counted = between(render_text(report), "\nfindings: ", "\n");
    REQUIRE_FALSE(counted.empty());
    CHECK(count(html, "<p>" + html_escape(counted) + "</p>") == 1);
    // Each rank's evidence is there, marked with its rank.
    CHECK(count(html, "<th>rank</th>") == 6);
    CHECK(count(html, "<td class=n>0</td><td class=n>1.50 KiB</td>") == 1);
    CHECK(count(html, "<td class=n>1</td><td class=n>1.50 KiB</td>") == 1);
}

TEST_CASE("in the HTML a rank whose finding differs gets its own line under the shared one") {
    Report report;
    report.findings_found = true;
    report.findings.findings.push_back(
        finding(0, Severity::error, "copies outlive forward (step 5)", 1536));
    report.findings.findings.push_back(
        finding(1, Severity::error, "copies outlive forward (step 4)", 2048));
    Finding other = finding(1, Severity::error, "copies outlive forward (step 5)", 1536);
    other.plugin = "transpose-cache-retention";  // another detector: never grouped
    report.findings.findings.push_back(other);
    const std::string html = render_html(report);
    CHECK(count(html, "<details class=finding>") == collapse_findings(report.findings).size());
    CHECK(count(html, "<details class=finding>") == 2);
    CHECK(count(html, "<b>weight-copy-accumulation</b> ranks 0–1 ") == 1);
    CHECK(count(html,
                "<span class=differs>rank 1: 2.00 KiB  copies outlive forward (step "
                "4)</span></summary>") == 1);
    CHECK(count(html, "<b>transpose-cache-retention</b> rank 1 ") == 1);
}

TEST_CASE("every detector's problems show a stack, however many another detector has") {
    Report report;
    RankReport r = with_stack(kHarnessStack, 0);
    r.stacks[8] = {kHarnessStack[0],
                   "allocscope::harness::trainer::Trainer::State::backward() "
                   "(../harness/trainer/trainer.cpp:640)",
                   kHarnessStack[4]};
    r.analysis.header.rank = 0;
    r.analysis.path = "/runs/a/rank0.trace";
    report.ranks.push_back(std::move(r));
    report.findings_found = true;
    // Twelve weight-copy errors from one site, more than the report details.
    for (int i = 0; i < 12; ++i) {
        Finding f = finding(0, Severity::error, "copies of layers." + std::to_string(i), 1536);
        f.layer = "layers." + std::to_string(i);
        f.evidence[0].stack_id = 7;
        report.findings.findings.push_back(f);
    }
    // Then one transpose-cache error from another site.
    Finding t = finding(0, Severity::error, "transposes alive after backward", 4096);
    t.plugin = "transpose-cache-retention";
    t.phase = "backward";
    t.evidence[0].stack_id = 8;
    t.evidence[0].phase = "backward";
    report.findings.findings.push_back(t);

    const std::string text = render_text(report);
    // The transpose cache's site is shown...
    CHECK(count(text, "Trainer::State::backward() (../harness/trainer/trainer.cpp:640)") == 1);
    // ...and the weight copies' one site once, not once per layer.
    CHECK(count(text, "quantize_weight") == 1);
    CHECK(count(text, "      evidence: ") == 2);
    CHECK(count(text, "error   weight-copy-accumulation") == 12);
}

namespace {

// A size-only finding of `plugin` on `rank`, attributed to `layer`.
Finding size_only(const char* plugin, int32_t rank, const char* layer) {
    Finding f;
    f.plugin = plugin;
    f.severity = Severity::info;
    f.rank = rank;
    f.layer = layer;
    f.basis = "size-only";
    f.summary = "sizes match";
    return f;
}

RankRun stream(int32_t rank, std::string provenance) {
    RankRun r;
    r.rank = rank;
    r.trace = "rank" + std::to_string(rank) + ".trace";
    r.plugins = {"weight-copy-accumulation", "transpose-cache-retention", "peak-owner"};
    r.provenance = std::move(provenance);
    return r;
}

}  // namespace

TEST_CASE("without provenance the summary line counts each detector's layers matched by size") {
    FindingsFile file;
    file.ranks = {stream(0, "off: the PyTorch bridge is not built"),
                  stream(1, "off: the PyTorch bridge is not built")};
    for (int32_t rank : {0, 1}) {
        for (const char* layer : {"layers.0", "layers.1", "layers.2"})
            file.findings.push_back(size_only("weight-copy-accumulation", rank, layer));
        // The end-of-forward total, at the layers' common prefix: not a layer of its own.
        file.findings.push_back(size_only("weight-copy-accumulation", rank, "layers"));
        file.findings.push_back(size_only("transpose-cache-retention", rank, "layers.1"));
    }
    CHECK(unproven_weights_line(file) ==
          "weight-copy / transpose detectors had sizes only (provenance was off on ranks 0–1: "
          "the PyTorch bridge is not built): 3 layers match the FP8 weight-copy pattern, 1 layer "
          "matches the transpose-cache pattern, not proven, so not errors; to prove them, run "
          "with provenance (on by default under allocscope run when the PyTorch bridge loads; "
          "C/C++ programs declare allocscope_derived()) or compare against a baseline "
          "(allocscope diff BASE CAND)");
}

TEST_CASE("with provenance on, no summary line, whatever matched by size") {
    FindingsFile file;
    file.ranks = {stream(0, "on")};
    file.findings.push_back(size_only("weight-copy-accumulation", 0, "layers.0"));
    CHECK(unproven_weights_line(file).empty());
}

TEST_CASE("a program that declares nothing gets the line only when its layers match by size") {
    FindingsFile file;
    file.ranks = {stream(-1, "")};
    CHECK(unproven_weights_line(file).empty());  // a CUDA program that is not training
    file.findings.push_back(size_only("transpose-cache-retention", -1, "blocks.3"));
    CHECK(unproven_weights_line(file).rfind(
              "weight-copy / transpose detectors had sizes only (no provenance was declared): 1 "
              "layer matches the transpose-cache pattern, not proven",
              0) == 0);
}

TEST_CASE("provenance said off but nothing matched: the line says the detectors had sizes only") {
    FindingsFile file;
    file.ranks = {stream(0,
                         "off: turned off (ALLOCSCOPE_PROVENANCE=0, or allocscope run "
                         "--no-provenance)"),
                  stream(1, "on")};
    file.findings.push_back(size_only("weight-copy-accumulation", 1, "layers.0"));  // rank 1: on
    CHECK(unproven_weights_line(file) ==
          "provenance was off on rank 0: turned off (ALLOCSCOPE_PROVENANCE=0, or allocscope run "
          "--no-provenance); the weight-copy and transpose detectors had sizes only, and no "
          "layer matched their patterns");
}

TEST_CASE("streams whose weight detectors did not run need no line") {
    FindingsFile file;
    RankRun r = stream(0, "off: the PyTorch bridge is not built");
    r.plugins = {"peak-owner"};
    file.ranks = {r};
    CHECK(unproven_weights_line(file).empty());
}

TEST_CASE("provenance in some steps: no line about sizes, one line naming the steps observed") {
    FindingsFile file;
    file.ranks = {stream(0, "on in steps 0–3, 100–101 of 0–240"),
                  stream(1, "on in steps 0–3, 100–101 of 0–240")};
    file.findings.push_back(size_only("weight-copy-accumulation", 0, "layers.0"));
    CHECK(unproven_weights_line(file).empty());  // provenance ran
    CHECK(provenance_steps_line(file) ==
          "provenance observed steps 0–3, 100–101 of 0–240 (ALLOCSCOPE_PROVENANCE_STEPS, by "
          "default the first 4 steps, then 2 in every 100): the weight detectors judged those "
          "steps; --provenance-steps all observes every step");
    // Ranks that differ are named with their steps; every step observed: no line.
    file.ranks[1].provenance = "on in steps 0–3 of 0–7";
    CHECK(provenance_steps_line(file).rfind(
              "provenance observed steps 0–3, 100–101 of 0–240 on rank 0; 0–3 of 0–7 on rank 1 (",
              0) == 0);
    file.ranks = {stream(0, "on")};
    CHECK(provenance_steps_line(file).empty());
}

namespace {

RankReport run_rank(int32_t rank, uint64_t events, uint64_t span_ns, uint64_t peak) {
    RankReport r;
    r.analysis.header.rank = rank;
    r.analysis.path = "/runs/b/rank" + std::to_string(rank) + ".trace";
    r.analysis.events = events;
    r.analysis.span_ns = span_ns;
    r.analysis.steps = 4;
    r.analysis.owner = Pool::device_block;
    PoolSummary p;
    p.pool = Pool::device_block;
    p.allocations = 10;
    p.peak_bytes = peak;
    p.peak_step = 1;
    p.peak_layer = "layers.7";
    p.peak_phase = "forward";
    r.analysis.pools.push_back(p);
    return r;
}

}  // namespace

TEST_CASE("the run section prints alike ranks once, their numbers as ranges, others apart") {
    Report report;
    for (int32_t rank = 0; rank < 6; ++rank)
        report.ranks.push_back(
            run_rank(rank, 6721 + uint64_t(rank % 2), 110'300'000'000 + rank, 40 << 20));
    // Rank 6 peaks in another layer: not alike.
    report.ranks.push_back(run_rank(6, 6721, 110'300'000'000, 40 << 20));
    report.ranks.back().analysis.pools[0].peak_layer = "layers.3";
    const std::string text = render_text(report);
    CHECK(text.find("== run ==\nranks 0–5 (6 alike): 6721–6722 events over 110.300 s, 4 steps; "
                    "tensors are caching-allocator blocks\n  peak block 40.0 MiB at step 1, "
                    "layers.7 forward\n") != std::string::npos);
    CHECK(text.find("\nrank 6: 6721 events over 110.300 s, 4 steps;") != std::string::npos);
    CHECK(count(text, " events over ") == 2);
    // --full keeps a section per rank.
    CHECK(count(render_text(report, TextDetail::full), " events over ") >= 7);
}

namespace {

// A rank over one second: samples at its start and end, `steps` steps
// evenly spread, forward and backward bands of 10 µs in turn, and the
// forward ends of every step.
RankReport long_run(uint64_t steps) {
    constexpr uint64_t kSecond = 1'000'000'000;
    RankReport r;
    TraceAnalysis& a = r.analysis;
    a.span_ns = kSecond;
    a.timeline.points.resize(2);
    a.timeline.points[1].t_ns = kSecond;
    for (uint64_t k = 0; k < steps; ++k) {
        const uint64_t t = k * kSecond / steps;
        a.timeline.steps.push_back({k, k * 100, t});
        a.timeline.bands.push_back({"forward", k * 100, k * 100 + 50, t, t + 10'000});
        a.timeline.bands.push_back(
            {"backward", k * 100 + 50, k * 100 + 99, t + 10'000, t + 20'000});
        r.steps.push_back({k, {{"layers.0", 100 + k}, {"layers.1", 200 + k}}, {}, {}});
    }
    // One wide band, a tenth of the second.
    a.timeline.bands.push_back({"optimizer", 0, 0, kSecond / 2, kSecond / 2 + kSecond / 10});
    std::stable_sort(
        a.timeline.bands.begin(), a.timeline.bands.end(),
        [](const PhaseBand& x, const PhaseBand& y) { return x.t_start_ns < y.t_start_ns; });
    return r;
}

}  // namespace

TEST_CASE("the JSON report's timeline is the HTML one's: a pixel's detail, the last 100 steps") {
    for (const uint64_t steps : {20'000u, 40'000u}) {
        Report report;
        report.ranks.push_back(long_run(steps));
        const std::string text = render_json(report);
        const json::Value doc = json::parse(text);
        const json::Value& rank = doc.at("ranks").items.at(0);
        const json::Value& timeline = rank.at("timeline");
        // One step mark a pixel of 1000: at most 1001, whatever the steps.
        CHECK(timeline.at("steps").items.size() <= 1001);
        CHECK(timeline.at("steps").items.size() >= 900);
        CHECK(timeline.at("steps").items.size() == shown_steps(report.ranks[0].analysis).size());
        // Bands of 10 µs (a hundredth of a pixel) merge; the optimizer's
        // tenth of the second stays, from its start to its end.
        const std::vector<json::Value>& bands = timeline.at("bands").items;
        CHECK(bands.size() <= 1000);
        CHECK(bands.size() == shown_bands(report.ranks[0].analysis).size());
        CHECK(std::any_of(bands.begin(), bands.end(), [](const json::Value& b) {
            return b.at("phase").text == "optimizer" &&
                   b.at("t_start_ns").as_u64() == 500'000'000 &&
                   b.at("t_end_ns").as_u64() == 600'000'000;
        }));
        // The forward ends of the last 100 steps.
        const std::vector<json::Value>& ends = rank.at("forward_ends").items;
        REQUIRE(ends.size() == 100);
        CHECK(ends.front().at("step").as_u64() == steps - 100);
        CHECK(ends.back().at("step").as_u64() == steps - 1);
        CHECK(ends.back().at("live").items.at(1).as_u64() == 200 + steps - 1);
        // Twice the steps, hardly a larger report: under 200 kB either way.
        CHECK(text.size() < 200'000);
    }
}
