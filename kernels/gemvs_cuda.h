/* gemvs_cuda: the streamed integer GEMV (kernels/gemvs_cuda.cu), the small-batch decode path of
 * Q4_K, Q6_K, Q8_0 and Q5_0 weights; internal to kernels/ (CUDA C++), called by the q8 entry
 * points of the chooser (mm_choose_cuda.cu). Activations come as the q8 buffer of
 * mm_gemvq_cuda.cu: qx the int8 rows, sx their float4 scales per 32 elements. Nothing is
 * allocated or owned here. */
#ifndef GEMVS_CUDA_H
#define GEMVS_CUDA_H

#ifndef __CUDACC__
#error "gemvs_cuda.h is CUDA C++"
#endif

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda_ops.h"

namespace mlacu {
/* whether the streamed GEMV takes weights of type t with rows of `in` elements, nm matrices (1,
 * or 2: gate and up) a stage */
bool gemvs_supported(uint32_t t, int64_t in, int nm);
/* whether steps of one token (one pair a tile) take the warp-specialized kernel (default: yes);
 * for the op checks, which compare the two */
void gemvs_set_ws(bool on);
/* mla_cuda_set_gemv_trace (kernels/cuda_ops.h) */
constexpr int GS_TRACE_N = MLA_CUDA_GEMV_TRACE_N;
void gemvs_set_trace(unsigned long long *d_stamps);
/* y [T][out] = x W^T for T = 1 .. MLACU_MOE_TILE tokens (qx, sx: the q8 buffer of the T rows); with
 * w1, y = silu(x W^T) * (x W1^T) (both read in one stage); cudaErrorNotSupported where not
 * supported. yq: NULL, or y's q8 buffer (T rows of out), which *yq_done says whether the launch
 * filled (the warp-specialized kernel does, out a multiple of 32; else the caller rounds y). */
cudaError_t gemvs_dense(uint32_t t, const void *w, const void *w1, int64_t in, int64_t out, const void *qx,
                        const void *sx, int64_t T, float *y, void *yq, bool *yq_done, cudaStream_t s);
/* ya = x Wa^T and yb = x Wb^T (same type and row length) in one launch */
cudaError_t gemvs_dense_pair(uint32_t t, const void *wa, int64_t out_a, float *ya, const void *wb, int64_t out_b,
                             float *yb, int64_t in, const void *qx, const void *sx, int64_t T, cudaStream_t s);
/* mla_cuda_matmul_grouped_q8 over a MoE plan (w1 NULL: one matrix, else silu(w0 x) * (w1 x)),
 * every tile or (singles) those of one pair; cudaErrorNotSupported where the type or row length
 * is not supported. yq: NULL, or y's q8 buffer (y_rows rows of out), filled as gemvs_dense says
 * (here only where every tile is of one pair and not singles). */
cudaError_t gemvs_grouped(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                          const void *qx, const void *sx, int x_div, const mla_cuda_moe_plan *pl, bool singles,
                          float *y, void *yq, int64_t y_rows, bool *yq_done, cudaStream_t s);
/* The streamed tensor-core GEMV (kernels/gemvm_cuda.cu): dense steps of 2 .. 16 tokens of Q4_K,
 * Q6_K and Q8_0 weights; the same arguments as gemvs_dense / gemvs_dense_pair (no q8 output: the
 * caller rounds y where it needs it). gemvm_supported: whether it takes type t, rows of `in`
 * elements and nm matrices at T tokens (one answer for 1 .. 8 and one for 9 .. 16: the shared
 * memory of 8, or 16, tokens); the launches return cudaErrorNotSupported where it does not. */
bool gemvm_supported(uint32_t t, int64_t in, int nm, int64_t T);
cudaError_t gemvm_dense(uint32_t t, const void *w, const void *w1, int64_t in, int64_t out, const void *qx,
                        const void *sx, int64_t T, float *y, cudaStream_t s);
cudaError_t gemvm_dense_pair(uint32_t t, const void *wa, int64_t out_a, float *ya, const void *wb, int64_t out_b,
                             float *yb, int64_t in, const void *qx, const void *sx, int64_t T, cudaStream_t s);
/* Its grouped form: mla_cuda_matmul_grouped_q8 over every tile of a MoE plan, or (multi) those
 * of the experts with more than one pair (1 .. 8 pairs a tile as the 8 tokens of a dense step; w1 NULL: one
 * matrix, else silu(w0 x) * (w1 x)) in one launch, Q4_K, Q6_K, Q8_0 and Q5_0; one block an SM
 * where two stages of gate and up need it. gemvm_grouped_supported: whether it takes type t,
 * rows of `in` elements and nm matrices (no q8 output: the caller rounds y). */
bool gemvm_grouped_supported(uint32_t t, int64_t in, int nm);
cudaError_t gemvm_grouped(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                          const void *qx, const void *sx, int x_div, const mla_cuda_moe_plan *pl, bool multi, float *y,
                          cudaStream_t s);
} // namespace mlacu

#endif
