/* wgmma_cuda: quantized weights (Q4_K, Q8_0, Q5_0) x fp16 activations on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a), for the fp16 paths of mm_mmh_cuda.cu (mla_cuda_matmul_h,
 * mla_cuda_matmul_grouped_h). CUDA C++ only; not an API. Built when the CUDA architectures include 90 (kernels/CMakeLists.txt
 * compiles wgmma_cuda.cu for sm_90a alone and defines MLA_CUDA_WGMMA); it runs on compute
 * capability 9.0 devices only, which mlacu_wg_usable checks.
 *
 * Inputs as the fp16 paths': xh [rows][in] fp16 (mla_cuda_act_h, each row scaled by xs[row]),
 * W rows of Q4_K, Q8_0 or Q5_0 blocks, experts estride bytes apart. Output y[yrow][out] in fp32,
 * overwritten. */
#ifndef WGMMA_CUDA_H
#define WGMMA_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* whether the wgmma kernel takes this product (out rows of W, x_rows rows of x): built, a
 * compute capability 9.0 device, not switched off by mlacu_wg_set, Q4_K or Q8_0 with in a
 * multiple of 256 (rows of 16-byte multiples) or Q5_0 with in a multiple of 128, x and an expert's W under
 * 4 GB, W and the expert stride 16-aligned */
bool mlacu_wg_usable(uint32_t type, int64_t in, int64_t out, int64_t x_rows, const void *w, size_t estride);

/* For tests and benchmarks: mode 0 off, 1 the default choice, or a forced tile of nt tokens (16,
 * 32, 64 or 128) x mt 64-row tiles a consumer warpgroup (1 or 2): mode = 100 nt + mt. Not
 * thread-safe: set it before launches. */
void mlacu_wg_set(int mode);

/* y = x W^T. Dense (counts NULL): tiles of tokens over T (gy unused). Grouped (counts, sorted of a
 * MoE plan, gy experts): block (row block, expert e) walks e's pairs; pair p reads x row p / x_div and
 * writes y row p; W_e = w + (e / world) estride. pairs: the plan's pairs (or T), for the tile choice. */
cudaError_t mlacu_wg_matmul(uint32_t type, const void *w, size_t estride, int64_t in, int64_t out, const __half *xh,
                            const float *xs, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts,
                            int world, unsigned gy, int64_t pairs, float *y, cudaStream_t s);

#endif
