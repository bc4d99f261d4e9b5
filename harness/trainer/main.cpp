// allocscope-harness: the FSDP2-style FP8 trainer (see trainer.h), one
// process per rank. Without RANK/WORLD_SIZE in the environment it launches
// --ranks processes of itself, like torchrun; with them it is one rank of an
// external launcher.
//
// This executable is the sim backend. `--backend cuda`, and `auto` on a
// machine with a GPU, exec allocscope-harness-cuda from the same directory
// with the same arguments: that one links the real CUDA runtime, while this
// one links the host-memory runtime of harness/sim_cudart (both are
// libcudart.so.13, so one process cannot hold both).
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/options.h"
#include "trainer/run.h"

namespace {

using namespace allocscope::harness;

std::string cuda_executable() {
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return {};
    std::string path(self, size_t(n));
    return path.substr(0, path.rfind('/') + 1) + "allocscope-harness-cuda";
}

// Whether the driver sees a GPU, asked without the runtime (this process's
// libcudart is the simulated one).
bool gpu_present() {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) return false;
    using Init = int (*)(unsigned);
    using Count = int (*)(int*);
    auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
    auto count = reinterpret_cast<Count>(dlsym(driver, "cuDeviceGetCount"));
    int devices = 0;
    const bool present = init && count && init(0) == 0 && count(&devices) == 0 && devices > 0;
    dlclose(driver);
    return present;
}

// The cuda executable must bind the real libcudart.so.13. In the build tree
// this executable's directory holds the simulated one, and test runners put
// it on LD_LIBRARY_PATH, which the loader searches before the real runtime's
// location: drop that directory before exec. (Installed, the simulated one
// lies in <libdir>/allocscope/sim, named only by this executable's runpath,
// which the exec does not pass on.)
void drop_own_directory_from_library_path(const std::string& cuda_executable) {
    const char* path = std::getenv("LD_LIBRARY_PATH");
    if (!path) return;
    const std::string own = cuda_executable.substr(0, cuda_executable.rfind('/'));
    std::string kept, entry;
    std::stringstream entries(path);
    while (std::getline(entries, entry, ':')) {
        char resolved[PATH_MAX];
        const std::string dir = realpath(entry.c_str(), resolved) ? resolved : entry;
        if (dir == own) continue;
        kept += (kept.empty() ? "" : ":") + entry;
    }
    setenv("LD_LIBRARY_PATH", kept.c_str(), 1);
}

}  // namespace

int main(int argc, char** argv) {
    trainer::Options options;
    if (std::optional<int> status = trainer::parse_command_line(argc, argv, options)) {
        return *status;
    }
    if (options.backend != trainer::Backend::sim) {
        const std::string cuda = cuda_executable();
        const bool built = !cuda.empty() && access(cuda.c_str(), X_OK) == 0;
        if (options.backend == trainer::Backend::cuda && !built) {
            std::fprintf(stderr,
                         "allocscope-harness: --backend cuda: this build has no cuda backend "
                         "(allocscope-harness-cuda is built where nvcc, cuBLASLt and NCCL are "
                         "found); use --backend sim\n");
            return 2;
        }
        if (built && (options.backend == trainer::Backend::cuda || gpu_present())) {
            drop_own_directory_from_library_path(cuda);
            execv(cuda.c_str(), argv);
            std::fprintf(stderr, "allocscope-harness: cannot start %s: %s\n", cuda.c_str(),
                         std::strerror(errno));
            return 2;
        }
    }
    trainer::RankBackend sim;
    sim.check = [](const trainer::Options&) { return std::string(); };
    sim.device = [](const collective::RankInfo&) { return 0; };
    sim.arch = [](const trainer::Options& o, int) { return o.arch.value_or(fp8::Arch::sm90); };
    sim.make_compute = [](const collective::RankInfo&, int, collective::Communicator& comm,
                          const trainer::Options& o) {
        return trainer::make_host_compute(comm, trainer::layer_config(o.shape));
    };
    return trainer::run_harness(options, argc, argv, sim);
}
