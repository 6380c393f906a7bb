/* attn_wg_cuda: absorbed MLA attention over an fp16 latent cache on Hopper's warpgroup
 * tensor cores (wgmma, sm_90a), for mla_cuda_mla_attn (attn_mla_cuda.cu), which chooses it. CUDA
 * C++ only; not an API. Built when the CUDA architectures include 90 (kernels/CMakeLists.txt
 * compiles it for sm_90a alone, with wgmma_cuda.cu, and defines MLA_CUDA_WGMMA); it runs on compute
 * capability 9.0 devices only (mlacu_hopper_isa), which mlacu_awg_device_ok checks.
 *
 * Shape: latent 512 + rope 64, heads a multiple of 64; each token's keys are its own positions
 * 0 .. pos, or with sel the n_sel[t] keys sel[t * sel_stride ..] (DSA's selection). Inputs and
 * outputs as mla_cuda_attn_args' (kernels/cuda_ops.h): q_abs [T][H][512] and q_pe (strides in
 * floats) fp32; the cache rows fp16, contiguous (kv) or paged (tabs); out
 * [T][H][512], or with splits > 1 the work rows (m, l, o[512]) of (token, head, split), m in
 * natural units, as the combine of attn_mla_cuda.cu reads them. Nothing is owned. */
#ifndef ATTN_WG_CUDA_H
#define ATTN_WG_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mlacu_awg_args {
    const float *qa, *qp;
    int64_t qp_ld_t, qp_ld_h;
    int H;
    const __half *kv;                /* contiguous cache (tabs NULL) */
    const float *const *const *tabs; /* per-token block table (paged cache) */
    int64_t tab_off;                 /* halves into each block */
    int64_t pos0;
    const int32_t *post; /* per-token position, NULL: pos0 + t */
    const int32_t *sel, *nsel; /* selected keys (NULL: every key up to the position) */
    int64_t sel_stride;
    float scale;
    float *out, *work;
    int splits;
} mlacu_awg_args;

/* keys a tile and the least keys a split's share is rounded to */
#define MLACU_AWG_KEYS 64
/* heads a block */
#define MLACU_AWG_HEADS 64

/* whether this device runs the kernel: sm_90a instructions allowed and the block's shared memory */
bool mlacu_awg_device_ok(void);

/* blocks resident per SM (1 by design), 0 where the kernel cannot run, -1 on an error */
int mlacu_awg_blocks_per_sm(void);

/* One launch over T tokens, a->splits splits (grid: H / 64 head groups x splits x T). */
cudaError_t mlacu_awg_launch(const mlacu_awg_args *a, int64_t T, cudaStream_t s);

#endif
