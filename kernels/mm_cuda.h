/* mm_cuda: what the matmul files of kernels/ share (CUDA C++, internal to kernels/, not an API):
 * the shape check of the entry points, the dispatch over the types with an integer form, and the
 * launchers over a runtime type that the chooser (mm_choose_cuda.cu) calls. The families and the
 * rules that pick one: docs/kernels.md. */
#ifndef MM_CUDA_H
#define MM_CUDA_H

#ifndef __CUDACC__
#error "mm_cuda.h is CUDA C++"
#endif

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/cuda_internal.h"
#include "kernels/cuda_quant_unit.h"

extern "C" {
#include "kernels/quant.h"
}

namespace mlacu {

/* tokens a launch of the float-activation GEMV (mm_gemv_cuda.cu) takes */
constexpr int MLACU_GV_TMAX = 8;
/* float weights with at most MLACU_GV_FLOAT_OUT outputs take the GEMV (mla_cuda_mm_choose,
 * outside exact and split) up to MLACU_GV_FLOAT_TMAX rows of x, in launches of MLACU_GV_TMAX: the
 * bf16 tensor cores' grid is a block a 128 outputs x 64 rows, which leaves a MoE router's 64-384
 * outputs one to three blocks. On an H200 (mla-gpu-check --mma3), V2-Lite's router (64 x 2048)
 * at 9 / 32 / 128 rows: 18 / 39 / 140 us on the GEMV, 118 / 120 / 127 on the tensor cores; V3's
 * (256 x 7168): 33 / 78 / 294 against 704 / 703 / 720. A wide matrix would be read once a launch:
 * it keeps the tensor cores above 8 rows. */
constexpr int MLACU_GV_FLOAT_TMAX = 64, MLACU_GV_FLOAT_OUT = 512;

/* The launchers over a runtime type t (cudaErrorInvalidValue for a type they do not take). */
/* mm_gemv_cuda.cu: y [T][out] = x [T][in] W^T, any type (gemv_kernel) */
cudaError_t mlacu_gemv(uint32_t t, const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                       cudaStream_t s);
/* mm_gemvq_cuda.cu: the same over the float types in the integer GEMV's layout (gemvf_kernel) */
cudaError_t mlacu_gemvf(uint32_t t, const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                        cudaStream_t s);
/* mm_gemvq_cuda.cu: q8 activations (gemvq_kernel) */
cudaError_t mlacu_gemvq(uint32_t t, const void *w, int64_t in, int64_t out, const void *q8, int64_t T, float *y,
                        cudaStream_t s);
/* mm_gemvq_cuda.cu: q8 activations over a MoE plan's tiles (gemvq_grp_kernel; w1: gate + up,
 * swiglu; multi: only the tiles after the plan's single-pair ones) */
cudaError_t mlacu_grpq(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                       const void *q8, int64_t x_rows, int x_div, const mla_cuda_moe_plan *pl, float *y, bool multi,
                       cudaStream_t s);

} // namespace mlacu

/* the shape every matmul entry point asserts */
static inline void check_shape(uint32_t t, int64_t in, int64_t out, int64_t T) {
    MLA_ASSERT(mla_cuda_quant_supported(t));
    MLA_ASSERT(in > 0 && in % 32 == 0 && in % ggml_type_get(t)->block_elems == 0 && in <= INT32_MAX);
    MLA_ASSERT(out > 0 && out <= INT32_MAX && T >= 0);
}

/* f(std::integral_constant<int, T>{}) for the quantized type t (the types with an integer form);
 * cudaErrorInvalidValue for any other. */
template <class F> static cudaError_t with_q8_type(uint32_t t, F &&f) {
    using namespace mlacu;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        if constexpr (i8traits<T_>::OK) return f(std::integral_constant<int, T_>{});                                \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    return cudaErrorInvalidValue;
}

#endif
