// The NVTX naming rules (interposer/nvtx_names.h), and the injection ABI of
// interposer/nvtx_abi.h checked against the NVTX headers where they are
// installed.
#include "nvtx_names.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "nvtx_abi.h"

#if defined(ALLOCSCOPE_HAVE_NVTX)
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#endif

using namespace allocscope::nvtx;

namespace {

constexpr const char* kKeep = "<keep>";  // the enclosing tag's value

struct Mapped {
    std::string name;
    std::string layer;  // kKeep: keep_layer
    std::string phase;  // kKeep: keep_phase
    bool sub_phase = false;
};

void check_mapped(const std::vector<Mapped>& table) {
    for (const Mapped& m : table) {
        CAPTURE(m.name);
        const RangeTag t = map_range(m.name);
        CHECK(t.mapped);
        CHECK_FALSE(t.step.has_value());
        CHECK(t.keep_layer == (m.layer == kKeep));
        if (m.layer != kKeep) CHECK(t.layer == m.layer);
        CHECK(t.keep_phase == (m.phase == kKeep));
        if (m.phase != kKeep) CHECK(t.phase == m.phase);
        CHECK(t.sub_phase == m.sub_phase);
    }
}

}  // namespace

TEST_CASE("allocscope: ranges name layer and phase, the layer ending at the first slash") {
    check_mapped({
        {"allocscope:layers.3/forward", "layers.3", "forward"},
        {"allocscope:layers.3.mlp.fc1/backward/dgrad", "layers.3.mlp.fc1", "backward/dgrad"},
        {"allocscope:optimizer/optimizer", "optimizer", "optimizer"},
        {"allocscope:/forward/all_gather", kKeep, "forward/all_gather"},
        {"allocscope:layers.4/", "layers.4", kKeep},
        {"allocscope:layers.4", "layers.4", kKeep},
        {"allocscope:", kKeep, kKeep},
        {"allocscope:/", kKeep, kKeep},
        {"allocscope:model.layers.0.self_attn.q_proj/forward", "model.layers.0.self_attn.q_proj",
         "forward"},
        {"allocscope:layers.\xc3\xbc/forward", "layers.\xc3\xbc", "forward"},
        {"allocscope:a b (c)/idle", "a b (c)", "idle"},
    });
}

TEST_CASE("emit_nvtx's suffixes are not part of a name") {
    check_mapped({
        {"allocscope:layers.3/forward, op_id = 12", "layers.3", "forward"},
        {"allocscope:layers.3/forward, seq = 4, op_id = 9, sizes = [[2, 3], []]", "layers.3",
         "forward"},
        {"allocscope:layers.3/forward, input_op_ids = [(1, 0)]", "layers.3", "forward"},
        {"FSDP::pre_forward (layers.3), seq = 17", "layers.3", "forward"},
        {"FSDP::all_gather (layers.3), op_id = 5, sizes = []", "layers.3", "all_gather", true},
    });
    CHECK(strip_profiler_suffix("aten::mm, seq = 5") == "aten::mm");
    CHECK(strip_profiler_suffix("x, stashed seq = 5") == "x");
    CHECK(strip_profiler_suffix("a, b") == "a, b");
    CHECK(strip_profiler_suffix("a,b = 1") == "a,b = 1");
    CHECK(strip_profiler_suffix("a, = 1") == "a, = 1");
    CHECK(strip_profiler_suffix("a,  seq = 1") == "a,  seq = 1");
    CHECK(strip_profiler_suffix("a, Seq = 1") == "a, Seq = 1");
    CHECK(strip_profiler_suffix("a, seq =") == "a, seq =");
    CHECK(strip_profiler_suffix("") == "");
}

TEST_CASE("FSDP2's range names map to the module's fqn and a phase") {
    check_mapped({
        {"FSDP::pre_forward (layers.3)", "layers.3", "forward"},
        {"FSDP::post_forward (layers.3)", "layers.3", "forward"},
        {"FSDP::pre_backward (layers.3)", "layers.3", "backward"},
        {"FSDP::post_backward (layers.3)", "layers.3", "backward"},
        {"FSDP::post_backward_accumulate (layers.3)", "layers.3", "backward/accumulate"},
        {"FSDP::post_backward_reshard (layers.3)", "layers.3", "backward/reshard"},
        {"FSDP::post_backward_reduce (layers.3)", "layers.3", "backward/reduce"},
        {"FSDP::root_pre_forward", kKeep, "forward"},
        {"FSDP::root_post_backward_callback", kKeep, "backward/callback"},
        {"FSDP::pre_forward", kKeep, "forward"},  // the root module: empty fqn
        {"FSDP::forward_prefetch for layers.4", "layers.4", "forward/prefetch"},
        {"FSDP::backward_prefetch for layers.2", "layers.2", "backward/prefetch"},
        {"FSDP::backward_prefetch for None", kKeep, "backward/prefetch"},
        {"FSDP::all_gather (layers.3)", "layers.3", "all_gather", true},
        {"FSDP::all_gather", kKeep, "all_gather", true},
        {"FSDP::all_gather_copy_in (model.layers.0)", "model.layers.0", "all_gather_copy_in", true},
        {"FSDP::all_gather_copy_out (model.layers.0)", "model.layers.0", "all_gather_copy_out",
         true},
        {"FSDP::reduce_scatter", kKeep, "reduce_scatter", true},
        {"FSDP::cast_forward_inputs", kKeep, "cast_forward_inputs", true},
        {"FSDP::inputs_to_device", kKeep, "inputs_to_device", true},
        {"FSDP::pre_forward_hook (layers.1)", "layers.1", "forward/hook"},
        {"FSDP::pre_forwardx (layers.1)", "layers.1", "pre_forwardx", true},
    });
}

TEST_CASE("a sub-phase goes under the base of the thread's current phase") {
    CHECK(sub_phase_of("forward", "all_gather") == "forward/all_gather");
    CHECK(sub_phase_of("forward/prefetch", "all_gather") == "forward/all_gather");
    CHECK(sub_phase_of("backward/reduce", "reduce_scatter") == "backward/reduce_scatter");
    CHECK(sub_phase_of("", "all_gather") == "all_gather");
    CHECK(sub_phase_of("/odd", "all_gather") == "all_gather");
}

TEST_CASE("hostile and unknown range names tag nothing") {
    const std::string huge_layer(2000, 'a');
    const std::vector<std::string> names = {
        "",
        "allocscope",
        "Allocscope:layers.0/forward",
        " allocscope:layers.0/forward",
        "ALLOCSCOPE:layers.0/forward",
        "aten::mm, seq = 5",
        "fsdp::all_gather_copy_in, seq = 3, op_id = 7",
        "FSDP::",
        "FSDP:: (layers.0)",
        "FSDP::pre_forward(layers.3)",
        "FSDP::pre_forward (layers.3",
        "FSDP::pre_forward  (layers.3)",
        "FSDP::pre_forward [layers.3]",
        "FSDP::pre_forward for",
        "FSDP::pr\xc3\xa9_forward (layers.3)",
        "FSDP::pre_forward (lay\x7f"
        "ers.3)",
        "FSDP::pre_forward (layers.3\n)",
        "allocscope:layers.0/for\nward",
        "allocscope:lay\x01"
        "ers/forward",
        "allocscope:layers.0\t/forward",
        std::string("allocscope:a\0b/forward", 22),
        "allocscope:" + huge_layer + "/forward",
        "FSDP::pre_forward (" + huge_layer + ")",
    };
    for (const std::string& name : names) {
        CAPTURE(name);
        const RangeTag t = map_range(name);
        CHECK_FALSE(t.mapped);
        CHECK_FALSE(t.step.has_value());
    }
}

TEST_CASE("allocscope:step=<n> sets the step, as a range or a mark") {
    CHECK(map_range("allocscope:step=12").step == 12u);
    CHECK_FALSE(map_range("allocscope:step=12").mapped);
    CHECK(map_range("allocscope:step=0, op_id = 3").step == 0u);
    for (const char* bad :
         {"allocscope:step=", "allocscope:step=-1", "allocscope:step=+1", "allocscope:step=1x",
          "allocscope:step= 1", "allocscope:step=99999999999999999999999"}) {
        CAPTURE(bad);
        CHECK_FALSE(map_range(bad).step.has_value());
        CHECK_FALSE(map_range(bad).mapped);
        CHECK(map_mark(bad).kind == MarkAction::Kind::none);
    }
    const MarkAction step = map_mark("allocscope:step=18446744073709551615");
    CHECK(step.kind == MarkAction::Kind::step);
    CHECK(step.step == UINT64_MAX);
}

TEST_CASE("allocscope:<text> marks are notes; other marks do nothing") {
    const MarkAction note = map_mark("allocscope:optimizer step");
    CHECK(note.kind == MarkAction::Kind::note);
    CHECK(note.note == "optimizer step");
    CHECK(map_mark("allocscope:x, seq = 3").note == "x");
    for (const char* ignored :
         {"", "allocscope:", "optimizer step", "FSDP::pre_forward (a)", "allocscope:bad\ttab"}) {
        CAPTURE(ignored);
        CHECK(map_mark(ignored).kind == MarkAction::Kind::none);
    }
    CHECK(map_mark("allocscope:" + std::string(2000, 'x')).kind == MarkAction::Kind::none);
}

#if defined(ALLOCSCOPE_HAVE_NVTX)
TEST_CASE("the injection ABI allocscope declares is the NVTX headers'") {
    namespace abi = allocscope::nvtx::abi;
    CHECK(abi::kInjectionVersion == NVTX_VERSION);
    CHECK(sizeof(abi::EventAttributes) == sizeof(nvtxEventAttributes_t));
    CHECK(sizeof(abi::EventAttributes) == NVTX_EVENT_ATTRIB_STRUCT_SIZE);
    CHECK(offsetof(abi::EventAttributes, size) == offsetof(nvtxEventAttributes_t, size));
    CHECK(offsetof(abi::EventAttributes, message_type) ==
          offsetof(nvtxEventAttributes_t, messageType));
    CHECK(offsetof(abi::EventAttributes, message) == offsetof(nvtxEventAttributes_t, message));
    CHECK(sizeof(abi::MessageValue) == sizeof(nvtxMessageValue_t));
    CHECK(sizeof(abi::RangeId) == sizeof(nvtxRangeId_t));
    CHECK(abi::kMessageAscii == NVTX_MESSAGE_TYPE_ASCII);
    CHECK(abi::kMessageUnicode == NVTX_MESSAGE_TYPE_UNICODE);
    CHECK(abi::kMessageRegistered == NVTX_MESSAGE_TYPE_REGISTERED);
    CHECK(abi::kMessageUnknown == NVTX_MESSAGE_UNKNOWN);

    CHECK(abi::kModuleCore == NVTX_CB_MODULE_CORE);
    CHECK(abi::kModuleCore2 == NVTX_CB_MODULE_CORE2);
    CHECK(abi::kMarkEx == NVTX_CBID_CORE_MarkEx);
    CHECK(abi::kMarkA == NVTX_CBID_CORE_MarkA);
    CHECK(abi::kMarkW == NVTX_CBID_CORE_MarkW);
    CHECK(abi::kRangeStartEx == NVTX_CBID_CORE_RangeStartEx);
    CHECK(abi::kRangeStartA == NVTX_CBID_CORE_RangeStartA);
    CHECK(abi::kRangeStartW == NVTX_CBID_CORE_RangeStartW);
    CHECK(abi::kRangeEnd == NVTX_CBID_CORE_RangeEnd);
    CHECK(abi::kRangePushEx == NVTX_CBID_CORE_RangePushEx);
    CHECK(abi::kRangePushA == NVTX_CBID_CORE_RangePushA);
    CHECK(abi::kRangePushW == NVTX_CBID_CORE_RangePushW);
    CHECK(abi::kRangePop == NVTX_CBID_CORE_RangePop);
    CHECK(abi::kDomainMarkEx == NVTX_CBID_CORE2_DomainMarkEx);
    CHECK(abi::kDomainRangeStartEx == NVTX_CBID_CORE2_DomainRangeStartEx);
    CHECK(abi::kDomainRangeEnd == NVTX_CBID_CORE2_DomainRangeEnd);
    CHECK(abi::kDomainRangePushEx == NVTX_CBID_CORE2_DomainRangePushEx);
    CHECK(abi::kDomainRangePop == NVTX_CBID_CORE2_DomainRangePop);
    CHECK(abi::kDomainRegisterStringA == NVTX_CBID_CORE2_DomainRegisterStringA);
    CHECK(abi::kDomainRegisterStringW == NVTX_CBID_CORE2_DomainRegisterStringW);
    CHECK(abi::kDomainCreateA == NVTX_CBID_CORE2_DomainCreateA);
    CHECK(abi::kDomainCreateW == NVTX_CBID_CORE2_DomainCreateW);

    CHECK(abi::kExportTableCallbacks == NVTX_ETID_CALLBACKS);
    CHECK(abi::kExportTableVersionInfo == NVTX_ETID_VERSIONINFO);
    CHECK(sizeof(abi::ExportTableCallbacks) == sizeof(NvtxExportTableCallbacks));
    CHECK(offsetof(abi::ExportTableCallbacks, get_module_function_table) ==
          offsetof(NvtxExportTableCallbacks, GetModuleFunctionTable));
    CHECK(sizeof(abi::ExportTableVersionInfo) == sizeof(NvtxExportTableVersionInfo));
    CHECK(offsetof(abi::ExportTableVersionInfo, set_injection_nvtx_version) ==
          offsetof(NvtxExportTableVersionInfo, SetInjectionNvtxVersion));
    CHECK(sizeof(abi::FunctionTable) == sizeof(NvtxFunctionTable));
}
#endif
