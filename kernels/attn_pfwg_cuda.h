/* attn_pfwg_cuda: the causal attention of the non-absorbed prompt path (attn_prefill_cuda.h) and
 * the decompression of its keys and values on Hopper's warpgroup tensor cores (wgmma, sm_90a), at
 * DeepSeek's widths (per head 128 nope + 64 rope keys, 128 values) and GLM's (192 + 64, 256: GLM-4.7-
 * Flash, GLM-5), beside the mma.sync kernels of attn_prefill_cuda.cu, which chooses them.
 * CUDA C++ only; not an API. Built when the CUDA architectures include 90 (kernels/CMakeLists.txt
 * compiles it for sm_90a alone, with attn_wg_cuda.cu, and defines MLA_CUDA_WGMMA); it runs on
 * compute capability 9.0 devices only, which mlacu_pwg_device_ok checks.
 *
 * Inputs as the mma.sync kernel's: queries fp32 (nope, then rope), the group's decompressed k_nope
 * [heads][nk][head_nope] and v [heads][head_v / 128][nk][128] in fp16 from the work area, k_pe from the paged fp16
 * cache rows; out fp32 [row * o_ld_t + head * o_ld_h + col], divided by the row's sum. Nothing is
 * owned. */
#ifndef ATTN_PFWG_CUDA_H
#define ATTN_PFWG_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* The causal attention's arguments, for both of its kernels (this one and attn_prefill_cuda.cu's
 * mma.sync one, which includes this header whether or not this kernel is built). */
typedef struct mlacu_pf_args {
    const float *q;
    int64_t q_ld_t, q_ld_h;
    const __half *kn, *v; /* [heads of the launch][nk][head_nope], [..][nk][head_v] */
    int64_t nk;           /* keys: pos0 + T */
    const float *const *tab;
    int64_t tab_off; /* halves, a multiple of 8 */
    int row, kv_lora; /* cache row length, latent width (halves, multiples of 8) */
    int T;
    int64_t pos0;
    int h0;    /* the launch's first head (of q and out) */
    float sl2; /* scale * log2 e */
    float *out;
    int64_t o_ld_t, o_ld_h;
} mlacu_pf_args;

/* The decompression of the keys and values for the attention above, on the same tensor cores:
 * kn [heads][nk][head_nope] = the latent rows W_kb[h] (stored [kv_lora][head_nope]) and v
 * [heads][nk][head_v] = the latent rows W_vb[h]^T (stored [head_v][kv_lora]), fp16 weights, fp32
 * sums rounded to fp16, as attn_prefill_cuda.cu's mma.sync kernel computes them. wk, wv: the
 * launch's first head's. */
typedef struct mlacu_pf_up_args {
    const float *const *tab;
    int64_t tab_off; /* halves, a multiple of 8 */
    int row, kv_lora; /* cache row length (a multiple of 8), latent width (a multiple of 64) */
    int64_t nk;
    const __half *wk, *wv;
    __half *kn, *v;
} mlacu_pf_up_args;

/* whether this device runs the kernels: sm_90a instructions allowed and the blocks' shared memory */
bool mlacu_pwg_device_ok(void);

/* One launch over `heads` heads from a->h0 (grid: ceil(T / 128) row tiles x heads), at head_nope /
 * head_v 128 / 128 or 192 / 256. */
cudaError_t mlacu_pwg_launch(const mlacu_pf_args *a, int heads, int head_nope, cudaStream_t s);

/* One launch of the decompression over `heads` heads (a persistent grid of one block an SM), at
 * head_nope / head_v 128 / 128 or 192 / 256 (GLM-4.7-Flash, GLM-5: v [heads][2][nk][128], the
 * halves of a head's 256 columns). */
cudaError_t mlacu_pwg_up_launch(const mlacu_pf_up_args *a, int heads, int head_nope, cudaStream_t s);

#endif
