// allocscope-harness-cuda: the harness's cuda backend. allocscope-harness
// execs it for `--backend cuda` (and for `auto` where a GPU is present); it
// takes the same arguments and launches its ranks as copies of itself. Rank
// r uses GPU LOCAL_RANK.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda_compute.h"
#include "trainer/options.h"
#include "trainer/run.h"

namespace {

using namespace allocscope::harness;

// Visible GPUs, or the runtime's reason there are none.
int gpu_count(std::string& why) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        why = cudaGetErrorString(err);
        (void)cudaGetLastError();
        return 0;
    }
    if (count == 0) why = "no device";
    return count;
}

}  // namespace

int main(int argc, char** argv) {
    trainer::Options options;
    if (std::optional<int> status = trainer::parse_command_line(argc, argv, options)) {
        return *status;
    }
    if (options.backend == trainer::Backend::sim) {
        std::fprintf(stderr,
                     "allocscope-harness: --backend sim runs in allocscope-harness, not in "
                     "allocscope-harness-cuda\n");
        return 2;
    }
    trainer::RankBackend cuda;
    cuda.check = [](const trainer::Options& o) -> std::string {
        std::string why;
        const int count = gpu_count(why);
        if (count == 0) return "--backend cuda: no usable CUDA device (" + why + ")";
        return trainer::check_devices(o, trainer::Backend::cuda, count);
    };
    cuda.device = [](const collective::RankInfo& rank) { return rank.local_rank; };
    cuda.arch = [](const trainer::Options& o, int device) {
        if (o.arch) return *o.arch;
        int major = 0;
        (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        // Blackwell's FP8 GEMM takes every layout; Hopper's only TN.
        return major >= 10 ? fp8::Arch::sm100 : fp8::Arch::sm90;
    };
    cuda.make_compute = [](const collective::RankInfo&, int device, collective::Communicator& comm,
                           const trainer::Options& o) {
        return cuda::make_cuda_compute(device, comm, trainer::layer_config(o.shape));
    };
    return trainer::run_harness(options, argc, argv, cuda);
}
