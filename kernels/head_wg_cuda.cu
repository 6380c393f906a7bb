/* head_wg_cuda: the per-head products of prompt steps on the warpgroup tensor cores (sm_90a); see
 * head_wg_cuda.h.
 *
 * Block = 128 tokens (two warpgroups of 64: wgmma's M) x BN outputs (N: 256, or 128) of one head.
 * K walks in chunks of 64 (one k-block of the 128-byte swizzle of wgmma_ops_cuda.h), two buffers:
 * W's chunk (BN rows of 128 bytes) by cp.async (zeros past out), x's (128 rows) through registers,
 * loaded a chunk ahead during the products and rounded to fp16 as they are stored (zeros past T).
 * A chunk: 4 k-steps of BN / 128 m64n128k16 products a warpgroup, both operands K-major by
 * descriptor; two block barriers a chunk (the chunk landed; its readers done before the buffer is
 * refilled). Then y in fp32 straight from the accumulators (float2 a thread and row). Checked
 * against the CPU reference and the mma.sync kernel in mla-gpu-check (--head, the "wg" rows). */
#include "kernels/head_wg_cuda.h"

#include "kernels/cuda_internal.h"
#include "kernels/wgmma_ops_cuda.h"

namespace {

constexpr int HW_BM = 128, HW_T = 256, HW_KC = 64; /* tokens, threads, K a chunk */
constexpr int HW_XB = HW_BM * 128;                 /* x's chunk: 16384 bytes */
template <int BN> struct hw_geo {
    static constexpr int WB = BN * 128;            /* W's chunk */
    static constexpr int SB = HW_XB + WB;          /* a buffer */
    static constexpr size_t SMEM = (size_t)2 * SB + 1024;
};

template <int BN> __global__ void __launch_bounds__(HW_T) hwg_kernel(mlacu_hwg_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = hw_geo<BN>;
    constexpr int NH = BN / 128; /* m64n128 products a k-step */
    mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t hw_raw[];
    uint8_t *sm = hw_raw + ((1024u - (wga_u32(hw_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), wq = (tid >> 5) & 3,
              lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int t0 = blockIdx.y * HW_BM, o0 = blockIdx.x * BN, h = blockIdx.z;
    const __half *wh = a.w + (int64_t)h * a.out * a.in;
    const int nkc = a.in / HW_KC;
    /* x: 128 rows x 16 float4 a chunk, 8 a thread (row i / 16, float4 i % 16) */
    float4 xr[8];
    auto load_x = [&](int kc) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = tid + u * HW_T, r = i >> 4, t = t0 + r;
            xr[u] = t < a.T ? *(const float4 *)(a.x + (int64_t)t * a.xt + (int64_t)h * a.xh + kc * HW_KC + (i & 15) * 4)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    auto store_x = [&](int buf) {
        uint8_t *xs = sm + buf * G::SB;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = tid + u * HW_T, r = i >> 4, k = (i & 15) * 4;
            *(uint2 *)(xs + wga_sw(r, k >> 3) + (k & 7) * 2) =
                make_uint2(wga_h2(xr[u].x, xr[u].y), wga_h2(xr[u].z, xr[u].w));
        }
    };
    /* W: BN rows x 8 chunks of 16 bytes, BN / 32 a thread; one commit group */
    auto issue_w = [&](int kc, int buf) {
        uint8_t *ws = sm + buf * G::SB + HW_XB;
#pragma unroll
        for (int u = 0; u < BN * 8 / HW_T; u++) {
            const int i = tid + u * HW_T, r = i >> 3, ch = i & 7, o = o0 + r;
            const bool ok = o < a.out;
            const void *src = ok ? (const void *)(wh + (int64_t)o * a.in + kc * HW_KC + ch * 8) : (const void *)wh;
            cp_async16_zfill(ws + wga_sw(r, ch), src, ok);
        }
        cp_async_commit();
    };
    load_x(0);
    issue_w(0, 0);
    store_x(0);
    float acc[NH][64];
#pragma unroll
    for (int n = 0; n < NH; n++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[n][i] = 0.f;
    const uint32_t base = wga_u32(sm);
    for (int kc = 0; kc < nkc; kc++) {
        const int buf = kc & 1;
        const bool more = kc + 1 < nkc;
        if (more) {
            issue_w(kc + 1, buf ^ 1); /* its buffer's readers finished with the last chunk's barrier */
            load_x(kc + 1);           /* in flight during this chunk's products */
        } else
            cp_async_commit();
        cp_async_wait<1>(); /* this thread's copies of chunk kc */
        wga_fence_proxy();  /* they and x's stores, to wgmma's proxy */
        __syncthreads();
        const uint32_t xa = base + (uint32_t)(buf * G::SB) + (uint32_t)(wg * 64 * 128),
                       wb = base + (uint32_t)(buf * G::SB + HW_XB);
#pragma unroll
        for (int n = 0; n < NH; n++) wga_pin(acc[n]);
        wga_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int n = 0; n < NH; n++)
                wga_mma_n128(acc[n], wga_desc_k(xa + kk * 32), wga_desc_k(wb + (uint32_t)(n * 128 * 128) + kk * 32));
        wga_commit();
        wga_wait0();
#pragma unroll
        for (int n = 0; n < NH; n++) wga_pin(acc[n]);
        __syncthreads(); /* every warpgroup done with buffer buf */
        if (more) store_x(buf ^ 1);
    }
    cp_async_wait<0>();
    /* acc[n]: tokens r0, r0 + 8 (r0 = 64 wg + 16 wq + g) x outputs 128 n + 8 j + 2 c + e in acc[n][4 j + 2 hf + e] */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int t = t0 + wg * 64 + wq * 16 + g + 8 * hf;
        if (t >= a.T) continue;
        float *yr = a.y + (int64_t)t * a.yt + (int64_t)h * a.yh;
#pragma unroll
        for (int n = 0; n < NH; n++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int o = o0 + n * 128 + 8 * j + 2 * c;
                const float v0 = acc[n][4 * j + 2 * hf], v1 = acc[n][4 * j + 2 * hf + 1];
                if (o + 1 < a.out) *(float2 *)(yr + o) = make_float2(v0, v1);
                else if (o < a.out) yr[o] = v0;
            }
    }
#else
    (void)a;
    __trap();
#endif
}

template <int BN> cudaError_t hwg_run(const mlacu_hwg_args *a, cudaStream_t s) {
    const cudaError_t err = mlacu_smem_allow_once<hwg_kernel<BN>>(hw_geo<BN>::SMEM);
    if (err != cudaSuccess) return err;
    const dim3 grid((unsigned)((a->out + BN - 1) / BN), (unsigned)((a->T + HW_BM - 1) / HW_BM), (unsigned)a->H);
    mlacu_launch(hwg_kernel<BN>, grid, HW_T, hw_geo<BN>::SMEM, s, *a);
    return cudaGetLastError();
}

} // namespace

bool mlacu_hwg_device_ok(void) { return mlacu_hopper_isa() && (size_t)mlacu_smem_optin() >= hw_geo<256>::SMEM; }

bool mlacu_hwg_takes(const mlacu_hwg_args *a) {
    return a->T > 0 && a->H > 0 && a->H <= 65535 && (a->T + HW_BM - 1) / HW_BM <= 65535 && a->in > 0 &&
           a->in % HW_KC == 0 && a->out > 0 && !(a->xt & 3) && !(a->xh & 3) && !((uintptr_t)a->x & 15) &&
           !(a->yt & 1) && !(a->yh & 1) && !((uintptr_t)a->y & 7) && mlacu_hwg_device_ok();
}

cudaError_t mlacu_hwg_launch(const mlacu_hwg_args *a, cudaStream_t s) {
    if (!mlacu_hwg_takes(a)) return cudaErrorInvalidValue;
    return a->out % 256 == 0 ? hwg_run<256>(a, s) : hwg_run<128>(a, s);
}
