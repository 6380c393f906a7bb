/* dsa_wg_cuda: the DSA indexer's scores of a prompt step on the warpgroup tensor cores (sm_90a);
 * see dsa_wg_cuda.h.
 *
 * The product's rows are keys (wgmma's M, 64 a warpgroup), its columns the block's token-heads
 * (N: 256 = 8 tokens x 32 heads, or 4 x 64; heads past H zero), its depth the 128 dimensions. A
 * block holds its tokens' queries in shared memory (fp16, 64 KB) and the head weights times
 * 1 / sqrt(128); each of its two warpgroups walks its own key tiles of the block's chunk (tiles
 * wg, wg + 2, ...) with its own two buffers (cp.async, 16 bytes, zeros past the chunk), so one's
 * epilogue runs beside the other's products. A tile: 8 k-steps of two m64n128k16 (A the key tile,
 * B a half of the queries, both K-major with the 128-byte swizzle of wgmma_ops_cuda.h); then
 * ReLU, the weights and the sum over a token's heads: within the thread (its HP / 4 columns of
 * each token), then over the 4 lanes that share a row (shuffles); each lane of the 4 stores a
 * quarter of the row's (key, token) scores, keys past the token's position left unwritten.
 * Blocks: (chunk of keys, token group), the last tokens' groups (the most keys) first. Checked
 * against the CPU reference and the mma.sync kernel in mla-gpu-check (--dsa, the "wg" rows). */
#include "kernels/dsa_wg_cuda.h"

#include <cuda_fp16.h>

#include "kernels/cuda_internal.h"
#include "kernels/wgmma_ops_cuda.h"

namespace {

constexpr int DW_D = 128, DW_KB = DW_D / 64;   /* depth, its k-blocks */
constexpr int DW_NC = 256;                     /* token-heads a block */
constexpr int DW_BN = 64;                      /* keys a tile: a warpgroup's M */
constexpr int DW_NW = 2, DW_T = 128 * DW_NW;   /* warpgroups, threads */
constexpr int DW_BLK = DW_BN * 128;            /* a k-block of a key tile: 8192 bytes */
constexpr int DW_KT = DW_KB * DW_BLK;          /* a key tile: 16384 */
constexpr int DW_QB = DW_NC * 128;             /* a k-block of the queries: 32768 */
constexpr int DW_Q = DW_KB * DW_QB;            /* the queries: 65536 */
constexpr size_t DW_SMEM = (size_t)DW_Q + 2 * DW_NW * DW_KT + DW_NC * 4 + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* the 128 threads of warpgroup w (named barrier 1 + w) */
static __device__ __forceinline__ void dw_wg_sync(int w) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + w) : "memory");
}
#endif

template <int HP>
__global__ void __launch_bounds__(DW_T, 1) dsw_kernel(mlacu_dsw_args a, int64_t chunk) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int TB = DW_NC / HP; /* tokens a block */
    constexpr int TH = 128 / HP;   /* tokens a half of the columns (one m64n128 product) */
    constexpr int IPT = HP / 8;    /* 8-column groups of a token */
    mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t dw_raw[];
    uint8_t *sm = dw_raw + ((1024u - (wga_u32(dw_raw) & 1023u)) & 1023u);
    uint8_t *qs = sm, *ks = qs + DW_Q;
    float *wsc = (float *)(ks + 2 * DW_NW * DW_KT);
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), wtid = tid & 127,
              wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * TB, tn = min(TB, a.T - t0);
    const int64_t kend = a.pos0 + t0 + tn; /* the block's tokens' keys: 0 .. kend - 1 */
    const int64_t kb0 = (int64_t)blockIdx.x * chunk;
    if (kend <= a.skip || kb0 >= kend) return; /* block-uniform, before any barrier */
    const int64_t kb1 = min(kb0 + chunk, kend);
    const int ntile = (int)((kb1 - kb0 + DW_BN - 1) / DW_BN);
    const int nmine = ntile > wg ? (ntile - wg + DW_NW - 1) / DW_NW : 0; /* tiles wg, wg + NW, ... */
    uint8_t *kbuf = ks + wg * 2 * DW_KT;
    /* the warpgroup's tile i into its buffer i & 1; one commit group */
    auto issue = [&](int i) {
        const int64_t k0 = kb0 + (int64_t)(wg + i * DW_NW) * DW_BN;
        uint8_t *kd = kbuf + (i & 1) * DW_KT;
        constexpr int CK = DW_D / 8; /* 16-byte chunks a key */
#pragma unroll
        for (int u = 0; u < DW_BN * CK / 128; u++) {
            const int x = wtid + u * 128, r = x / CK, cc = x % CK;
            const int64_t key = k0 + r;
            const bool ok = key < kb1;
            const void *src =
                ok ? (const void *)(paged_row_t<__half>(a.tab, a.tab_off, DW_D, key) + cc * 8) : (const void *)a.q;
            cp_async16_zfill(kd + (cc >> 3) * DW_BLK + wga_sw(r, cc & 7), src, ok);
        }
        cp_async_commit();
    };
    if (nmine > 0) issue(0);
    else cp_async_commit();
    if (nmine > 1) issue(1);
    else cp_async_commit();
    /* the queries (row n = token n / HP, head n % HP; zero past H and T) and the scaled weights */
    for (int x = tid; x < DW_NC * (DW_D / 4); x += DW_T) {
        const int n = x / (DW_D / 4), d = x % (DW_D / 4) * 4, tl = n / HP, h = n % HP;
        const bool ok = tl < tn && h < a.H;
        const float4 v = ok ? *(const float4 *)(a.q + ((int64_t)(t0 + tl) * a.H + h) * DW_D + d)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
        *(uint2 *)(qs + (d >> 6) * DW_QB + wga_sw(n, (d & 63) >> 3) + (d & 7) * 2) =
            make_uint2(wga_h2(v.x, v.y), wga_h2(v.z, v.w));
    }
    const float sc = rsqrtf((float)DW_D);
    for (int n = tid; n < DW_NC; n += DW_T) {
        const int tl = n / HP, h = n % HP;
        wsc[n] = tl < tn && h < a.H ? a.w[(int64_t)(t0 + tl) * a.H + h] * sc : 0.f;
    }
    wga_fence_proxy(); /* the queries, to wgmma's proxy */
    __syncthreads();
    const uint32_t qb = wga_u32(qs), kbase = wga_u32(kbuf);
    const int r0 = wq * 16 + g; /* the thread's rows (keys) r0 and r0 + 8 of the tile */
    for (int i = 0; i < nmine; i++) {
        cp_async_wait<1>(); /* this thread's copies of tile i have landed */
        wga_fence_proxy();
        dw_wg_sync(wg); /* the warpgroup's copies of tile i */
        const uint32_t kt = kbase + (uint32_t)(i & 1) * DW_KT;
        /* acc[hc]: rows r0, r0 + 8 x columns 128 hc + 8 j + 2 c + e in acc[hc][4 j + 2 hf + e] */
        float acc[2][64];
#pragma unroll
        for (int j = 0; j < 64; j++) acc[0][j] = acc[1][j] = 0.f;
        wga_pin(acc[0]);
        wga_pin(acc[1]);
        wga_fence();
#pragma unroll
        for (int kk = 0; kk < DW_KB * 4; kk++) {
            const uint32_t ko = (uint32_t)((kk & 3) * 32);
            const uint64_t da = wga_desc_k(kt + (uint32_t)((kk >> 2) * DW_BLK) + ko);
            const uint32_t qk = qb + (uint32_t)((kk >> 2) * DW_QB) + ko;
            wga_mma_n128(acc[0], da, wga_desc_k(qk));
            wga_mma_n128(acc[1], da, wga_desc_k(qk + 128 * 128));
        }
        wga_commit();
        wga_wait0();
        wga_pin(acc[0]);
        wga_pin(acc[1]);
        dw_wg_sync(wg); /* the warpgroup's reads of buffer i & 1 done: tile i + 2 into it */
        if (i + 2 < nmine) issue(i + 2);
        else cp_async_commit();
        /* v[tl][hf]: the thread's part of token tl's score of key r0 + 8 hf, then the row's */
        float v[TB][2];
#pragma unroll
        for (int hc = 0; hc < 2; hc++)
#pragma unroll
            for (int th = 0; th < TH; th++) {
                float s0 = 0.f, s1 = 0.f;
#pragma unroll
                for (int ii = 0; ii < IPT; ii++) {
                    const int j = th * IPT + ii;
                    const float2 wv = *(const float2 *)(wsc + hc * 128 + 8 * j + 2 * c);
                    s0 += wv.x * fmaxf(acc[hc][4 * j], 0.f) + wv.y * fmaxf(acc[hc][4 * j + 1], 0.f);
                    s1 += wv.x * fmaxf(acc[hc][4 * j + 2], 0.f) + wv.y * fmaxf(acc[hc][4 * j + 3], 0.f);
                }
                v[hc * TH + th][0] = s0;
                v[hc * TH + th][1] = s1;
            }
#pragma unroll
        for (int tl = 0; tl < TB; tl++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                v[tl][hf] += __shfl_xor_sync(0xffffffffu, v[tl][hf], 1);
                v[tl][hf] += __shfl_xor_sync(0xffffffffu, v[tl][hf], 2);
            }
        const int64_t kr = kb0 + (int64_t)(wg + i * DW_NW) * DW_BN + r0;
#pragma unroll
        for (int tl = 0; tl < TB; tl++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int64_t key = kr + 8 * hf;
                if (((2 * tl + hf) & 3) == c && tl < tn && key <= a.pos0 + t0 + tl)
                    a.scores[(int64_t)(t0 + tl) * a.ld + key] = v[tl][hf];
            }
    }
    cp_async_wait<0>(); /* only empty groups remain */
#else
    (void)a;
    (void)chunk;
    __trap();
#endif
}

template <int HP> cudaError_t dsw_run(const mlacu_dsw_args *a, cudaStream_t s) {
    const cudaError_t err = mlacu_smem_allow_once<dsw_kernel<HP>>(DW_SMEM);
    if (err != cudaSuccess) return err;
    constexpr int TB = DW_NC / HP;
    const int64_t groups = (a->T + TB - 1) / TB, kmax = a->pos0 + a->T;
    /* chunks of keys so that the blocks fill the device about four times over (one block an SM),
     * at least 1024 keys each (a multiple of the two warpgroups' 128) */
    const int64_t target = 4 * (int64_t)mlacu_sm_count();
    const int64_t splits = groups >= target ? 1 : (target + groups - 1) / groups;
    int64_t chunk = (kmax + splits - 1) / splits;
    chunk = (chunk + 2 * DW_BN - 1) / (2 * DW_BN) * (2 * DW_BN);
    if (chunk < 1024) chunk = 1024;
    const dim3 grid((unsigned)((kmax + chunk - 1) / chunk), (unsigned)groups);
    mlacu_launch(dsw_kernel<HP>, grid, DW_T, DW_SMEM, s, *a, chunk);
    return cudaGetLastError();
}

} // namespace

bool mlacu_dsw_device_ok(void) { return mlacu_hopper_isa() && (size_t)mlacu_smem_optin() >= DW_SMEM; }

bool mlacu_dsw_takes(const mlacu_dsw_args *a) {
    return a->D == DW_D && a->H > 16 && a->H <= 64 && a->T > 0 && a->T <= 65535 * 4 && !(a->tab_off & 7) &&
           !((uintptr_t)a->q & 15) && mlacu_dsw_device_ok();
}

cudaError_t mlacu_dsw_launch(const mlacu_dsw_args *a, cudaStream_t s) {
    if (!mlacu_dsw_takes(a)) return cudaErrorInvalidValue;
    return a->H <= 32 ? dsw_run<32>(a, s) : dsw_run<64>(a, s);
}
