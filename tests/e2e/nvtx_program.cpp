// The program the NVTX end-to-end tests run (tests/e2e/nvtx_test.cpp): NVTX
// ranges and marks around cudaMalloc calls into the CUDA runtime it links
// (the host-memory one). Every allocation has its own size, by which the
// test finds its tag.
//
// Usage: nvtx_program MODE
//   fsdp   one step of FSDP2's range names as torch.autograd.profiler.emit_nvtx
//          emits them: root pre-forward, a layer's pre-forward with its
//          all-gather, aten ops in between, post-forward, and a backward on
//          another thread with prefetch and reduce-scatter
//   odd    what must not unbalance the tag stack: NULL, unknown, malformed
//          and unregistered names, wide and registered strings, domains
//          interleaved, ranges started and ended out of order and on another
//          thread, stray pops, nesting deeper than every stack
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "cuda_decls.h"

namespace {

int g_failures = 0;

void alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        std::fprintf(stderr, "nvtx_program: cudaMalloc(%zu) failed\n", bytes);
        ++g_failures;
        return;
    }
    cudaFree(p);
}

void push(const char* name) {
    nvtxRangePushA(name);
}
void pop() {
    nvtxRangePop();
}

nvtxEventAttributes_t attributes() {
    nvtxEventAttributes_t a;
    std::memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    return a;
}

int run_fsdp() {
    nvtxMarkA("allocscope:step=3");
    push("FSDP::root_pre_forward, op_id = 1");
    alloc(1001);
    pop();
    push("FSDP::pre_forward (layers.0), op_id = 2");
    push("FSDP::all_gather (layers.0), op_id = 3");
    push("aten::empty, seq = 1, op_id = 4, sizes = [[2048], []]");
    alloc(1002);
    pop();
    pop();
    push("FSDP::all_gather_copy_out (layers.0), op_id = 5");
    alloc(1003);
    pop();
    pop();
    push("aten::linear, seq = 2, op_id = 6");
    alloc(1004);
    pop();
    push("FSDP::post_forward (layers.0), op_id = 7");
    alloc(1005);
    pop();

    nvtxMarkA("allocscope:step=4");
    push("allocscope:loss/backward");
    alloc(1006);
    pop();
    push("allocscope:main/idle");
    // Autograd runs backward on a thread of its own, which starts untagged.
    std::thread backward([] {
        push("FSDP::pre_backward (layers.1), op_id = 8");
        alloc(1007);
        push("FSDP::backward_prefetch for layers.0, op_id = 9");
        push("FSDP::all_gather (layers.0), op_id = 10");
        alloc(1008);
        pop();
        pop();
        pop();
        push("FSDP::post_backward_reduce (layers.1), op_id = 11");
        push("FSDP::reduce_scatter");
        alloc(1009);
        pop();
        pop();
        alloc(1010);
    });
    backward.join();
    pop();
    push("allocscope:optimizer/optimizer");
    alloc(1011);
    pop();
    alloc(1012);
    return g_failures == 0 ? 0 : 1;
}

int run_odd() {
    pop();  // nothing open
    push("allocscope:layers.0/forward");
    {
        push(nullptr);
        push("aten::mm, seq = 5");
        push("FSDP::pre_forward(layers.9)");
        push("allocscope:bad\tname/forward");
        nvtxEventAttributes_t unknown = attributes();
        unknown.messageType = NVTX_MESSAGE_UNKNOWN;
        nvtxRangePushEx(&unknown);
        nvtxEventAttributes_t short_struct = attributes();
        short_struct.size = 8;
        short_struct.messageType = NVTX_MESSAGE_TYPE_ASCII;
        short_struct.message.ascii = "allocscope:short/forward";
        nvtxRangePushEx(&short_struct);
        nvtxEventAttributes_t forged = attributes();
        forged.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
        forged.message.registered = reinterpret_cast<nvtxStringHandle_t>(0xdead0000);
        nvtxRangePushEx(&forged);
        nvtxEventAttributes_t null_ascii = attributes();
        null_ascii.messageType = NVTX_MESSAGE_TYPE_ASCII;
        null_ascii.message.ascii = nullptr;
        nvtxRangePushEx(&null_ascii);
        alloc(2001);
        for (int i = 0; i < 8; ++i)
            pop();
    }
    alloc(2002);

    nvtxRangePushW(L"allocscope:layers.\u00fc/backward");
    alloc(2003);
    pop();

    nvtxDomainHandle_t domain = nvtxDomainCreateA("allocscope-test");
    nvtxEventAttributes_t registered = attributes();
    registered.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    registered.message.registered =
        nvtxDomainRegisterStringA(domain, "allocscope:layers.1/backward/dgrad");
    nvtxDomainRangePushEx(domain, &registered);
    push("allocscope:/backward/wgrad");
    alloc(2004);
    nvtxDomainRangePop(domain);  // under the default domain's range: left with it
    alloc(2005);
    pop();
    alloc(2006);

    nvtxRangeId_t first = nvtxRangeStartA("allocscope:layers.2/forward");
    alloc(2007);
    nvtxRangeId_t second = nvtxRangeStartA("allocscope:layers.3/forward");
    nvtxRangeEnd(first);  // out of order: left when `second` ends
    alloc(2008);
    nvtxRangeEnd(second);
    alloc(2009);

    nvtxRangeId_t elsewhere = nvtxRangeStartA("allocscope:layers.4/forward");
    std::thread([elsewhere] { nvtxRangeEnd(elsewhere); }).join();
    alloc(2010);                  // no NVTX call on this thread since: still tagged
    nvtxMarkA("unrelated mark");  // any NVTX call takes the ended range over
    alloc(2011);
    nvtxRangeEnd(nvtxRangeStartA("aten::add"));
    pop();  // layers.0
    alloc(2012);
    pop();  // nothing open

    nvtxMarkA("allocscope:step=9");
    nvtxMarkA("allocscope:step=oops");
    alloc(2013);
    nvtxMarkA("allocscope:odd mode done");

    constexpr int kDeep = 150;  // beyond allocscope's tag stack (64) and NVTX's (128)
    for (int i = 0; i < kDeep; ++i)
        push(i % 2 ? "allocscope:deep/forward" : "aten::deep");
    alloc(2014);
    for (int i = 0; i < kDeep; ++i)
        pop();
    alloc(2015);
    return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "fsdp") == 0) return run_fsdp();
    if (argc == 2 && std::strcmp(argv[1], "odd") == 0) return run_odd();
    std::fprintf(stderr, "usage: nvtx_program fsdp|odd\n");
    return 2;
}
