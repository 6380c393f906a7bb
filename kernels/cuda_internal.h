/* cuda_internal: helpers shared by the kernels/ CUDA files (CUDA C++ only; not an API). */
#ifndef CUDA_INTERNAL_H
#define CUDA_INTERNAL_H

#ifndef __CUDACC__
#error "cuda_internal.h is CUDA C++"
#endif

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda_ops.h"

/* On a CUDA error: fill *e with "<what>: <cuda error string>" and return MLA_ERR. */
#define MLACU_CHECK(call, e, ...)                                                              \
    do {                                                                                       \
        cudaError_t mlacu_err_ = (call);                                                       \
        if (mlacu_err_ != cudaSuccess) {                                                       \
            mla_errf((e), __VA_ARGS__);                                                        \
            return mlacu_fail_((e), mlacu_err_);                                              \
        }                                                                                      \
    } while (0)

/* Token slots of one tile of a MoE plan (attn_cuda.cu builds the tiles; the grouped GEMVs of
 * quant_cuda.cu hold one tile's tokens in registers). */
#define MLACU_MOE_TILE 8

static inline int mlacu_fail_(mla_err *e, cudaError_t err) {
    if (e) {
        size_t n = strlen(e->msg);
        snprintf(e->msg + n, sizeof e->msg - n, ": CUDA error %s (%s)", cudaGetErrorName(err),
                 cudaGetErrorString(err));
    }
    return MLA_ERR;
}

#endif
