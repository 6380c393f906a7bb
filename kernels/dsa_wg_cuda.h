/* dsa_wg_cuda: the DSA indexer's scores of a prompt step (T tokens of one sequence at positions
 * pos0 .. pos0 + T - 1) over the fp16 key cache on Hopper's warpgroup tensor cores (wgmma, sm_90a),
 * beside the mma.sync kernel of dsa_cuda.cu, which chooses it (mla_cuda_dsa_scores_paged_h with the
 * sequence's table). The meaning is dsa_scores (kernels/dsa_indexer.h) of each token over its keys
 * 0 .. pos0 + t; queries rounded to fp16 as the mma.sync kernel rounds them. Head dim 128, 17 to 64
 * heads. CUDA C++ only; not an API. Built with the other wgmma kernels for sm_90a alone
 * (kernels/CMakeLists.txt, MLA_CUDA_WGMMA); runs on compute capability 9.0 devices only, which
 * mlacu_dsw_device_ok checks. Nothing is owned. */
#ifndef DSA_WG_CUDA_H
#define DSA_WG_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

typedef struct mlacu_dsw_args {
    const float *q;          /* [T][H][D] fp32, rotated */
    const float *w;          /* [T][H] head weights */
    const float *const *tab; /* the sequence's block table */
    int64_t tab_off;         /* the layer's key rows in a block, in halves (a multiple of 8) */
    int64_t pos0, skip;      /* tokens with no more than skip keys need no scores */
    int T, H, D; /* tokens, heads, head dim */
    float *scores; /* [T][ld] */
    int64_t ld;
} mlacu_dsw_args;

/* whether this device runs the kernel: sm_90a instructions allowed and the block's shared memory */
bool mlacu_dsw_device_ok(void);
/* whether it takes these scores: the device, head dim 128, 17 to 64 heads, 1 to 4 x 65535
 * tokens, key rows and queries 16-byte aligned */
bool mlacu_dsw_takes(const mlacu_dsw_args *a);
/* One launch (scores it takes): blocks of 256 / 32 or 256 / 64 tokens times chunks of their keys. */
cudaError_t mlacu_dsw_launch(const mlacu_dsw_args *a, cudaStream_t s);

#endif
