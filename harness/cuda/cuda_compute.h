// The cuda backend's Compute (trainer/compute.h): blocks are device memory
// of this rank's GPU, work is queued on one stream per rank, GEMMs run
// through cuBLASLt (device_layer.h), quantization on the device
// (device_quantize.h), and FSDP2's collectives through NCCL.
#pragma once

#include <memory>

#include "collective/communicator.h"
#include "trainer/compute.h"

namespace allocscope::harness::cuda {

// Selects `device`, creates the rank's stream, cuBLASLt handle and NCCL
// communicator (its unique id travels through `bootstrap`, the ranks'
// shared-memory communicator). Throws std::runtime_error on a CUDA or NCCL
// error.
std::unique_ptr<trainer::Compute> make_cuda_compute(int device, collective::Communicator& bootstrap,
                                                    const model::LayerConfig& config);

}  // namespace allocscope::harness::cuda
