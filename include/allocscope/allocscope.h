/* allocscope public C API.
 *
 * These functions are exported by liballocscope.so. A program that wants to
 * run unchanged when the interposer is not loaded should not link against
 * them directly but use <allocscope/allocscope_dl.h>, which resolves them at
 * run time and turns every call into a no-op when they are absent.
 *
 * Tags. Every recorded allocation carries the tag (rank, step, layer, phase)
 * that is current on the calling thread. The rank comes from the environment
 * (RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID), the step is process-wide, and
 * layer/phase form a per-thread stack: a new thread starts untagged.
 * Well-known phases are "forward", "backward", "optimizer" and "idle";
 * sub-phases are written with a slash ("forward/all_gather").
 *
 * All functions are thread-safe, never fail and never throw. Strings are
 * copied; the caller keeps ownership.
 */
#ifndef ALLOCSCOPE_ALLOCSCOPE_H
#define ALLOCSCOPE_ALLOCSCOPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ALLOCSCOPE_API_VERSION 1

/* Enters (layer, phase) on the calling thread. A NULL layer or phase keeps
 * the value of the enclosing tag, so allocscope_push(NULL, "backward") changes
 * only the phase. Depth is bounded (64); deeper pushes are counted and
 * matched by their pops but do not change the tag. */
void allocscope_push(const char* layer, const char* phase);

/* Leaves the innermost tag of the calling thread. A pop without a push is
 * ignored. */
void allocscope_pop(void);

/* Sets the process-wide training step. */
void allocscope_step(uint64_t step);

/* Declares a parameter of `layer`: `numel` elements when unsharded,
 * `sharded_numel` on this rank (equal to numel when not sharded), stored as
 * `dtype` ("bf16", "fp32", "fp8_e4m3", ...). Detectors use these sizes to
 * recognise weight-derived allocations. */
void allocscope_register_param(const char* layer, const char* name, uint64_t numel,
                               const char* dtype, uint64_t sharded_numel);

/* Records a free-form note in the trace at this point. */
void allocscope_mark(const char* text);

/* Caching-allocator hook ABI: a caching allocator reports the blocks it hands
 * out and takes back, so per-tensor memory is visible even when the runtime
 * API only sees whole segments. Recorded at level "block". `stream` is the
 * cudaStream_t the block is associated with (NULL = legacy default). */
void allocscope_block_alloc(void* ptr, size_t size, int device, void* stream);
void allocscope_block_free(void* ptr);

#ifdef __cplusplus
}
#endif

#endif /* ALLOCSCOPE_ALLOCSCOPE_H */
