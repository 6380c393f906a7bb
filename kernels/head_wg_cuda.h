/* head_wg_cuda: the per-head products of prompt steps with fp16 weights (mla_cuda_head_matmul_f16:
 * the absorbed k_b and v_b) on Hopper's warpgroup tensor cores (wgmma, sm_90a), beside the
 * mma.sync kernel of head_cuda.cu, which chooses it. Per head h: y_h [T][out] = x_h [T][in] W_h^T,
 * x fp32 rounded to fp16 as it is staged (as the mma.sync kernel rounds it), fp32 accumulation.
 * in a multiple of 64, x's strides and address 16-byte multiples. CUDA C++ only; not an API.
 * Built with the other wgmma kernels for sm_90a alone (kernels/CMakeLists.txt, MLA_CUDA_WGMMA);
 * runs on compute capability 9.0 devices only, which mlacu_hwg_device_ok checks. Nothing is owned. */
#ifndef HEAD_WG_CUDA_H
#define HEAD_WG_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef struct mlacu_hwg_args {
    const __half *w; /* [H][out][in] */
    const float *x;  /* token t, head h at x + t xt + h xh */
    int64_t xt, xh;
    float *y; /* token t, head h at y + t yt + h yh */
    int64_t yt, yh;
    int T, H, in, out;
} mlacu_hwg_args;

/* whether this device runs the kernel: sm_90a instructions allowed and the block's shared memory */
bool mlacu_hwg_device_ok(void);
/* whether it takes this product: the device, in a multiple of 64, x 16-byte aligned with strides
 * of whole float4s, y 8-byte aligned with even strides, the grid within its limits */
bool mlacu_hwg_takes(const mlacu_hwg_args *a);
/* One launch (a product it takes): blocks of 128 tokens x 256 (or, out not a multiple of 256,
 * 128) outputs of a head. */
cudaError_t mlacu_hwg_launch(const mlacu_hwg_args *a, cudaStream_t s);

#endif
