// Single-threaded fp32 matrix multiply for the CPU simulation backend. One
// process per rank shares the machine's cores, so the kernel does not spawn
// threads; it packs cache-sized panels into fixed stack buffers (no heap).
#pragma once

#include <cstddef>

namespace allocscope::harness::model {

enum class Trans : bool { kNo, kYes };

// Row-major operand: element (r, c) of the stored matrix is data[r * ld + c].
// With Trans::kYes the operand used in the product is the stored matrix's
// transpose, as in BLAS.
struct MatrixRef {
    const float* data;
    std::size_t ld;
    Trans trans = Trans::kNo;
};

// C[m × n] = alpha · op(A)[m × k] · op(B)[k × n] + beta · C, C row-major with
// leading dimension ldc. beta == 0 overwrites C without reading it (so C may
// hold garbage). C must not overlap A or B.
void gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, MatrixRef a, MatrixRef b,
          float beta, float* c, std::size_t ldc);

}  // namespace allocscope::harness::model
