// The part of the NVTX v3 injection ABI allocscope implements, declared here
// so liballocscope.so builds without the NVTX headers. The values are NVTX's
// (nvtx3/nvtxDetail/nvtxTypes.h, nvtx3/nvToolsExt.h); they are frozen ABI,
// and tests/nvtx_names_test.cpp checks every one against the headers where
// the headers are installed.
//
// Protocol: the NVTX code compiled into each module (NVTX is header-only)
// initializes on its first call: it dlopen()s $NVTX_INJECTION64_PATH, calls
// its InitializeInjectionNvtx2(getExportTable) once, and from then on calls
// the function pointers the injection stored into that module's tables
// (GetModuleFunctionTable): table[id] points at the module's slot for
// callback `id`. Every module with NVTX calls in it initializes separately.
#pragma once

#include <cstddef>
#include <cstdint>

namespace allocscope::nvtx::abi {

using RangeId = uint64_t;                   // nvtxRangeId_t
using DomainHandle = struct DomainOpaque*;  // nvtxDomainHandle_t
using StringHandle = struct StringOpaque*;  // nvtxStringHandle_t

enum MessageType : int32_t {  // nvtxMessageType_t
    kMessageUnknown = 0,
    kMessageAscii = 1,
    kMessageUnicode = 2,
    kMessageRegistered = 3,
};

union MessageValue {  // nvtxMessageValue_t
    const char* ascii;
    const wchar_t* unicode;
    StringHandle registered;
};

struct EventAttributes {  // nvtxEventAttributes_v2
    uint16_t version;
    uint16_t size;  // callers set sizeof; shorter structs carry no message
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        uint32_t u32;
        int32_t i32;
        float f32;
    } payload;
    int32_t message_type;
    MessageValue message;
};
static_assert(offsetof(EventAttributes, message_type) == 32);
static_assert(offsetof(EventAttributes, message) == 40);
static_assert(sizeof(EventAttributes) == 48);

enum CallbackModule : int32_t {  // NvtxCallbackModule
    kModuleCore = 1,
    kModuleCore2 = 5,
};

enum CallbackIdCore : uint32_t {  // NvtxCallbackIdCore
    kMarkEx = 1,
    kMarkA = 2,
    kMarkW = 3,
    kRangeStartEx = 4,
    kRangeStartA = 5,
    kRangeStartW = 6,
    kRangeEnd = 7,
    kRangePushEx = 8,
    kRangePushA = 9,
    kRangePushW = 10,
    kRangePop = 11,
};

enum CallbackIdCore2 : uint32_t {  // NvtxCallbackIdCore2
    kDomainMarkEx = 1,
    kDomainRangeStartEx = 2,
    kDomainRangeEnd = 3,
    kDomainRangePushEx = 4,
    kDomainRangePop = 5,
    kDomainRegisterStringA = 10,
    kDomainRegisterStringW = 11,
    kDomainCreateA = 12,
    kDomainCreateW = 13,
};

enum ExportTableId : uint32_t {  // NvtxExportTableID
    kExportTableCallbacks = 1,
    kExportTableVersionInfo = 3,
};

using FunctionPointer = void (*)(void);   // NvtxFunctionPointer
using FunctionTable = FunctionPointer**;  // NvtxFunctionTable
using GetExportTable = const void* (*)(uint32_t export_table_id);

struct ExportTableCallbacks {  // NvtxExportTableCallbacks
    size_t struct_size;
    int (*get_module_function_table)(CallbackModule module, FunctionTable* out_table,
                                     unsigned int* out_size);
};

struct ExportTableVersionInfo {  // NvtxExportTableVersionInfo
    size_t struct_size;
    uint32_t version;
    uint32_t reserved0;
    void (*set_injection_nvtx_version)(uint32_t version);
};

inline constexpr uint32_t kInjectionVersion = 3;  // NVTX_VERSION of these declarations

}  // namespace allocscope::nvtx::abi
