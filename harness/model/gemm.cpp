#include "model/gemm.h"

#include <algorithm>
#include <cstring>

namespace allocscope::harness::model {
namespace {

// Register tile kMr × kNr, computed by the micro-kernel from packed panels.
// Each tile row is two 16-byte vectors (the baseline x86-64 / NEON width, so
// no target flags are needed): 8 accumulators + 2 B vectors + 1 broadcast fit
// the 16 SSE registers without spilling.
constexpr std::size_t kMr = 4;
constexpr std::size_t kNr = 8;
// Cache blocking: a kKc × kNc panel of B (64 KiB) stays in L2 while every
// kMc-row block of A (32 KiB) streams past it. Both live on the stack.
constexpr std::size_t kMc = 64;
constexpr std::size_t kKc = 128;
constexpr std::size_t kNc = 128;
static_assert(kMc % kMr == 0 && kNc % kNr == 0);

using Vec4 = float __attribute__((vector_size(4 * sizeof(float))));
static_assert(kNr == 2 * 4);

float element(const MatrixRef& ref, std::size_t row, std::size_t col) {
    return ref.trans == Trans::kNo ? ref.data[row * ref.ld + col] : ref.data[col * ref.ld + row];
}

// Packs op(A)[i0 .. i0+mc) × [p0 .. p0+kc) into kMr-row micro-panels, each
// stored k-major (kMr consecutive values per k), rows past m zero-filled.
void pack_a(const MatrixRef& a, std::size_t m, std::size_t i0, std::size_t mc, std::size_t p0,
            std::size_t kc, float* out) {
    for (std::size_t ir = 0; ir < mc; ir += kMr) {
        for (std::size_t p = 0; p < kc; ++p) {
            for (std::size_t r = 0; r < kMr; ++r) {
                const std::size_t i = i0 + ir + r;
                *out++ = i < m ? element(a, i, p0 + p) : 0.0f;
            }
        }
    }
}

// Packs op(B)[p0 .. p0+kc) × [j0 .. j0+nc) into kNr-column micro-panels, each
// stored k-major (kNr consecutive values per k), columns past n zero-filled.
void pack_b(const MatrixRef& b, std::size_t n, std::size_t p0, std::size_t kc, std::size_t j0,
            std::size_t nc, float* out) {
    for (std::size_t jr = 0; jr < nc; jr += kNr) {
        for (std::size_t p = 0; p < kc; ++p) {
            for (std::size_t c = 0; c < kNr; ++c) {
                const std::size_t j = j0 + jr + c;
                *out++ = j < n ? element(b, p0 + p, j) : 0.0f;
            }
        }
    }
}

// tile[r][c] = sum over p of ap[p][r] · bp[p][c]. The accumulators are named
// scalars, not an array: GCC -O2 keeps an indexed array in memory.
void micro_kernel(std::size_t kc, const float* ap, const float* bp, float* tile) {
    Vec4 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
    for (std::size_t p = 0; p < kc; ++p) {
        Vec4 b0;
        Vec4 b1;
        std::memcpy(&b0, bp + p * kNr, sizeof b0);
        std::memcpy(&b1, bp + p * kNr + 4, sizeof b1);
        const float* a = ap + p * kMr;
        c00 += a[0] * b0;
        c01 += a[0] * b1;
        c10 += a[1] * b0;
        c11 += a[1] * b1;
        c20 += a[2] * b0;
        c21 += a[2] * b1;
        c30 += a[3] * b0;
        c31 += a[3] * b1;
    }
    const Vec4 rows[] = {c00, c01, c10, c11, c20, c21, c30, c31};
    std::memcpy(tile, rows, sizeof rows);
}

// out[r][c] = alpha · tile[r][c] + beta · out[r][c] for the rows × cols part
// of the tile that lies inside C; beta == 0 does not read out.
void store_tile(const float* tile, std::size_t rows, std::size_t cols, float alpha, float beta,
                float* out, std::size_t ldc) {
    for (std::size_t r = 0; r < rows; ++r) {
        float* o = out + r * ldc;
        const float* t = tile + r * kNr;
        if (cols == kNr) {
            for (std::size_t half = 0; half < kNr; half += 4) {
                Vec4 v;
                std::memcpy(&v, t + half, sizeof v);
                v *= alpha;
                if (beta != 0.0f) {
                    Vec4 prev;
                    std::memcpy(&prev, o + half, sizeof prev);
                    v += beta * prev;
                }
                std::memcpy(o + half, &v, sizeof v);
            }
            continue;
        }
        for (std::size_t col = 0; col < cols; ++col) {
            o[col] = alpha * t[col] + (beta == 0.0f ? 0.0f : beta * o[col]);
        }
    }
}

}  // namespace

void gemm(std::size_t m, std::size_t n, std::size_t k, float alpha, MatrixRef a, MatrixRef b,
          float beta, float* c, std::size_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
            }
        }
        return;
    }
    alignas(64) float packed_a[kMc * kKc];
    alignas(64) float packed_b[kKc * kNc];
    alignas(64) float tile[kMr * kNr];
    for (std::size_t j0 = 0; j0 < n; j0 += kNc) {
        const std::size_t nc = std::min(kNc, n - j0);
        const std::size_t nc_padded = (nc + kNr - 1) / kNr * kNr;
        for (std::size_t p0 = 0; p0 < k; p0 += kKc) {
            const std::size_t kc = std::min(kKc, k - p0);
            // The first k-panel applies the caller's beta; later panels add to
            // the partial sums already in C.
            const float panel_beta = p0 == 0 ? beta : 1.0f;
            pack_b(b, n, p0, kc, j0, nc_padded, packed_b);
            for (std::size_t i0 = 0; i0 < m; i0 += kMc) {
                const std::size_t mc = std::min(kMc, m - i0);
                const std::size_t mc_padded = (mc + kMr - 1) / kMr * kMr;
                pack_a(a, m, i0, mc_padded, p0, kc, packed_a);
                for (std::size_t jr = 0; jr < nc; jr += kNr) {
                    for (std::size_t ir = 0; ir < mc; ir += kMr) {
                        micro_kernel(kc, packed_a + ir * kc, packed_b + jr * kc, tile);
                        store_tile(tile, std::min(kMr, mc - ir), std::min(kNr, nc - jr), alpha,
                                   panel_beta, c + (i0 + ir) * ldc + j0 + jr, ldc);
                    }
                }
            }
        }
    }
}

}  // namespace allocscope::harness::model
