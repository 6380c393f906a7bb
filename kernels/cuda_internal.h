/* cuda_internal: helpers shared by the kernels/ CUDA files (CUDA C++ only; not an API). */
#ifndef CUDA_INTERNAL_H
#define CUDA_INTERNAL_H

#ifndef __CUDACC__
#error "cuda_internal.h is CUDA C++"
#endif

#include <cuda_runtime.h>
#include <stdint.h>
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

/* mma.sync m16n8k16 bf16 x bf16 -> fp32, c += a b (fragments in the PTX ISA's layout). */
static __device__ __forceinline__ void mlacu_mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the same with fp16 operands */
static __device__ __forceinline__ void mlacu_mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ldmatrix .x4: four 8x8 b16 matrices from shared memory; lane i gives the address of row i % 8
 * of matrix i / 8 and receives in r[j] its two elements of matrix j (row lane / 4, columns
 * 2 (lane % 4), +1; with _t the matrix transposed). */
static __device__ __forceinline__ void mlacu_ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void mlacu_ldsm_x4_t(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* cp.async (sm_80+): 16 or 4 bytes global -> shared without registers; commit closes a group;
 * wait_all returns when all of this thread's groups have landed. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* the current device's multiprocessor count (read once a process; 132, an H100/H200's, if the
 * query fails) */
static inline int mlacu_sm_count(void) {
    static int nsm = 0;
    if (!nsm) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess)
            nsm = 132;
    }
    return nsm;
}

/* the current device's largest opt-in dynamic shared memory a block (read once a process; 48 KB,
 * what every device gives, if the query fails) */
static inline int mlacu_smem_optin(void) {
    static int v = 0;
    if (!v) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            v = 48 << 10;
    }
    return v;
}

static inline int mlacu_fail_(mla_err *e, cudaError_t err) {
    if (e) {
        size_t n = strlen(e->msg);
        snprintf(e->msg + n, sizeof e->msg - n, ": CUDA error %s (%s)", cudaGetErrorName(err),
                 cudaGetErrorString(err));
    }
    return MLA_ERR;
}

#endif
