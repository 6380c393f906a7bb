/* attn_prefill_cuda: MLA prompt attention in the non-absorbed (multi-head) form on the fp16 tensor
 * cores: the per-head decompression of the keys and values from the latent cache, and a
 * FlashAttention-style causal kernel over them. API and meaning: kernels/attn_prefill_cuda.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/attn_prefill_cuda.h"
#include "kernels/attn_pfwg_cuda.h" /* the kernels' arguments; the wgmma kernel where MLA_CUDA_WGMMA */
#include "kernels/cuda_internal.h"

namespace {

__device__ __forceinline__ uint32_t pf_pack_h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* ---------------------------------------------------------------- decompression */
/* y[key][n] = sum_c c[key][c] W(c, n) for the keys 0 .. nk - 1 of the paged cache and one head's
 * W: k_nope (BT false: W = w_kb[h], stored [kv_lora][N]) or v (BT true: W = w_vb[h], stored
 * [N][kv_lora]), rounded to fp16 into y [heads][nk][N]. Block = (128 keys, head), 8 warps of 16
 * keys x all N columns; kv_lora walked in chunks of 32 (two k-steps), double-buffered: the latent
 * rows by cp.async, fp16 weights by cp.async, float weights through registers (rounded to fp16 on
 * the way). Row strides are odd multiples of 16 bytes (ldmatrix without bank conflicts). On sm_90
 * at N 128 with fp16 weights the warpgroup kernel (attn_pfwg_cuda.cu, uwg_kernel) computes the
 * same bits instead: on an H200 (2026-12-04) it took a V3 32k prompt layer's decompression and
 * attention from 80.8 to 77.8 ms, and a 2048-token chunk after 30720 keys from 14.0 to 12.0. */
constexpr int UP_BM = 128, UP_BK = 32, UP_T = 256, UP_LDA = UP_BK + 8;

struct pf_up {
    const float *const *tab; /* the sequence's block table */
    int64_t tab_off;         /* the layer's rows in a block, halves */
    int row, kv_lora;        /* cache row length, latent width (halves) */
    int64_t nk;              /* keys */
    const void *w;           /* the launch's first head's matrix */
    __half *y;               /* [heads][nk][N] */
};

template <int N, bool BT> struct up_cfg {
    static constexpr int LDB = BT ? UP_LDA : N + 8;                 /* B stage row stride, halves */
    static constexpr int BST = BT ? N * UP_LDA : UP_BK * (N + 8);   /* B stage, halves */
    static constexpr int BCH = (BT ? N * (UP_BK / 8) : UP_BK * (N / 8)) / UP_T; /* 16-byte chunks a thread */
    static_assert(N % 16 == 0 && (LDB / 8) % 2 == 1 && (UP_LDA / 8) % 2 == 1, "decompression strides");
    static_assert((BT ? N * (UP_BK / 8) : UP_BK * (N / 8)) % UP_T == 0 && BCH >= 1, "decompression B copies");
};

template <int N, bool BT, typename WT>
__global__ void __launch_bounds__(UP_T) pf_up_kernel(pf_up a) {
    using C = up_cfg<N, BT>;
    mlacu_pdl_enter();
    __shared__ __align__(16) __half sa[2 * UP_BM * UP_LDA];
    __shared__ __align__(16) __half sb[2 * C::BST];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * UP_BM;
    const int hl = blockIdx.y, KL = a.kv_lora;
    const WT *w = (const WT *)a.w + (int64_t)hl * KL * N;
    /* chunk s of kv_lora (columns 32 s .. +32) into stage s & 1 */
    auto issue = [&](int s) {
        const int c0 = s * UP_BK;
        __half *da = sa + (s & 1) * UP_BM * UP_LDA, *db = sb + (s & 1) * C::BST;
#pragma unroll
        for (int u = 0; u < UP_BM * (UP_BK / 8) / UP_T; u++) { /* 128 rows x 4 chunks */
            const int i = tid + u * UP_T, r = i >> 2, cc = i & 3;
            const int64_t key = k0 + r;
            const bool ok = key < a.nk;
            const __half *src = ok ? paged_row_t<__half>(a.tab, a.tab_off, a.row, key) + c0 + cc * 8
                                   : (const __half *)a.y;
            cp_async16_zfill(da + r * UP_LDA + cc * 8, src, ok);
        }
#pragma unroll
        for (int u = 0; u < C::BCH; u++) {
            const int i = tid + u * UP_T;
            /* BT: row n, chunk cc of the 32 columns; else row c (of the chunk), chunk cc of N */
            const int r = BT ? i / (UP_BK / 8) : i / (N / 8), cc = BT ? i % (UP_BK / 8) : i % (N / 8);
            const WT *src = BT ? w + (int64_t)r * KL + c0 + cc * 8 : w + (int64_t)(c0 + r) * N + cc * 8;
            __half *dst = db + r * C::LDB + cc * 8;
            if constexpr (std::is_same<WT, __half>::value) {
                cp_async16(dst, src);
            } else {
                const float4 x0 = *(const float4 *)src, x1 = *(const float4 *)(src + 4);
                *(uint4 *)dst = make_uint4(pf_pack_h2(x0.x, x0.y), pf_pack_h2(x0.z, x0.w), pf_pack_h2(x1.x, x1.y),
                                           pf_pack_h2(x1.z, x1.w));
            }
        }
        cp_async_commit();
    };
    float acc[N / 8][4];
#pragma unroll
    for (int n = 0; n < N / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const uint32_t aaddr0 = mlacu_smem_u32(sa + (warp * 16 + (lane & 15)) * UP_LDA + (lane >> 4) * 8);
    /* BT: rows n (keys-like, non-transposed: matrices n +0 / +8, k +0 / +8); else rows k
     * (transposed: matrices k +0 / +8, n +0 / +8) */
    const uint32_t baddr0 =
        BT ? mlacu_smem_u32(sb + ((lane & 7) + ((lane >> 4) << 3)) * C::LDB + ((lane >> 3) & 1) * 8)
           : mlacu_smem_u32(sb + ((lane & 7) + (((lane >> 3) & 1) << 3)) * C::LDB + (lane >> 4) * 8);
    const int ns = KL / UP_BK;
    issue(0);
    for (int s = 0; s < ns; s++) {
        if (s + 1 < ns) issue(s + 1);
        else cp_async_commit();
        cp_async_wait<1>(); /* stage s landed (this thread's copies) */
        __syncthreads();    /* and everyone's */
        const uint32_t aaddr = aaddr0 + (s & 1) * UP_BM * UP_LDA * 2, baddr = baddr0 + (s & 1) * C::BST * 2;
#pragma unroll
        for (int kk = 0; kk < UP_BK / 16; kk++) {
            uint32_t A[4];
            mlacu_ldsm_x4(A, aaddr + kk * 32);
#pragma unroll
            for (int np = 0; np < N / 16; np++) {
                uint32_t B[4];
                if constexpr (BT) mlacu_ldsm_x4(B, baddr + (np * 16 * C::LDB + kk * 16) * 2);
                else mlacu_ldsm_x4_t(B, baddr + (kk * 16 * C::LDB + np * 16) * 2);
                mlacu_mma_f16(acc[2 * np], A, B[0], B[1]);
                mlacu_mma_f16(acc[2 * np + 1], A, B[2], B[3]);
            }
        }
        __syncthreads(); /* stage s is free for chunk s + 2 */
    }
    cp_async_wait<0>();
    __half *yh = a.y + (int64_t)hl * a.nk * N;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t key = k0 + warp * 16 + g + 8 * r;
        if (key >= a.nk) continue;
#pragma unroll
        for (int n = 0; n < N / 8; n++)
            *(uint32_t *)(yh + key * N + 8 * n + 2 * c4) = pf_pack_h2(acc[n][2 * r], acc[n][2 * r + 1]);
    }
}

/* ---------------------------------------------------------------- the attention */
/* Block = (tile of PF_BM = 128 query rows, head), 8 warps of 16 rows; the heaviest tiles (the
 * last rows: the most keys) are scheduled first. Each warp holds its rows' queries (times
 * scale log2 e, fp16) in registers as the A fragments of S = Q K^T. Keys are walked in tiles of
 * PF_BN = 64, two in flight by cp.async (tile j + 2 is copied while tile j + 1 is computed): the
 * head's k_nope and v rows from the work area, k_pe from the cache row (a 64-key tile is one
 * cache block). Per tile a warp computes S (16 x 64, fp32), masks keys past each row's position
 * (the tiles that reach past the block's first row), keeps the running max and sum (online
 * softmax, base 2), turns S into P (fp16) in the registers that are the A fragments of P V, and
 * accumulates O (16 x head_v, fp32). Tiles wholly past a warp's last row are skipped by that warp.
 * Row strides are odd multiples of 16 bytes (ldmatrix without bank conflicts). */
constexpr int PF_BM = 128, PF_BN = 64, PF_T = 256;
static_assert(PF_BN == 64, "a key tile of mlacu_softmax_tile");

/* DV: the value columns of a block. A head wider than that (GLM-4.7-Flash's 256) takes head_v / DV
 * blocks (blockIdx.z), each with all of S and DV columns of O, its values decompressed as head_v / DV
 * heads of DV columns ([head][z][nk][DV]). */
template <int DN, int DR, int DV> struct pf_cfg {
    static constexpr int DK = DN + DR;
    static constexpr int LDK = DK + 8, LDV = DV + 8; /* halves */
    static constexpr int KS = DK / 16;               /* k-steps of S */
    static constexpr int NO = DV / 8;                /* n-tiles of O */
    static constexpr int CKN = DN / 8, CKR = DR / 8, CKV = DV / 8; /* 16-byte chunks a key: nope, rope, values */
    /* a thread's nope copies at fixed offsets (RSN keys apart) where PF_T is a multiple of CKN, else
     * chunks tid + PF_T u of the tile (192: 24 chunks a key) */
    static constexpr bool NFIX = PF_T % CKN == 0;
    static constexpr int RSN = NFIX ? PF_T / CKN : 1, NCP = NFIX ? PF_BN / RSN : PF_BN * CKN / PF_T;
    static constexpr int RSV = PF_T / CKV, NVP = PF_BN / RSV; /* keys between a thread's value copies; copies */
    static constexpr int RSR = PF_T / CKR, RCP = PF_BN / RSR; /* the same for rope */
    /* two key tiles and two value tiles: 84 KB at 128 + 64 / 128, 42 KB at 64 + 32 / 64, 100 KB at
     * 192 + 64 / 128 */
    static constexpr size_t SMEM = (size_t)2 * PF_BN * (LDK + LDV) * 2;
    static_assert(DN % 8 == 0 && DR % 8 == 0 && DK % 16 == 0 && DV % 16 == 0, "prefill attention widths");
    static_assert((LDK / 8) % 2 == 1 && (LDV / 8) % 2 == 1, "prefill attention strides");
    static_assert((NFIX ? PF_BN % RSN == 0 : (PF_BN * CKN) % PF_T == 0) && PF_T % CKV == 0 && PF_BN % RSV == 0 &&
                      PF_T % CKR == 0 && PF_BN % RSR == 0,
                  "prefill attention copies");
    static_assert(PF_BN == MLA_CUDA_KV_BLOCK, "a key tile is one cache block");
};

template <int DN, int DR, int DV>
__global__ void __launch_bounds__(PF_T, 1) pf_attn_kernel(mlacu_pf_args a) {
    using C = pf_cfg<DN, DR, DV>;
    mlacu_pdl_enter();
    extern __shared__ __align__(16) unsigned char pf_sm[];
    __half *ks = (__half *)pf_sm;         /* two tiles of PF_BN keys x LDK */
    __half *vs = ks + 2 * PF_BN * C::LDK; /* two tiles of PF_BN keys x LDV */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int r0 = (int)(gridDim.x - 1 - blockIdx.x) * PF_BM, hl = blockIdx.y, h = a.h0 + hl, vz = blockIdx.z;
    const int rend = min(r0 + PF_BM, a.T);
    const int64_t kend = a.pos0 + rend; /* the block's keys: 0 .. kend - 1 */
    const int ntile = (int)((kend + PF_BN - 1) / PF_BN);
    const __half *knh = a.kn + (int64_t)hl * a.nk * DN, *vh = a.v + ((int64_t)hl * gridDim.z + vz) * a.nk * DV;
    /* The thread's copies of a tile: nope chunk tid % (DN / 8) of keys tid / (DN / 8) + (256 / (DN /
     * 8)) u (where 256 is a multiple of DN / 8), value chunk tid % (DV / 8) of keys tid / (DV / 8) +
     * (256 / (DV / 8)) u, rope chunk tid % (DR / 8) of keys tid / (DR / 8) + (256 / (DR / 8)) u: each
     * at its first one's addresses plus whole rows (address arithmetic a copy was the kernels'
     * largest cost: attn_pfwg_cuda.cu). */
    const int cn = tid % C::CKN, rn = tid / C::CKN, cv = tid % C::CKV, rv = tid / C::CKV, cr = tid % C::CKR,
              rk = tid / C::CKR;
    const __half *kg = knh + (int64_t)rn * DN + cn * 8, *vg = vh + (int64_t)rv * DV + cv * 8;
    const int64_t ro = (int64_t)rk * a.row + a.kv_lora + cr * 8;
    /* key tile j into buffer j & 1 (zeros past kend); one commit group */
    auto issue = [&](int j) {
        const int64_t k0 = (int64_t)j * PF_BN;
        const int rem = (int)min((int64_t)PF_BN, kend - k0); /* the tile's keys (at least one: j < ntile) */
        __half *kd = ks + (j & 1) * PF_BN * C::LDK, *vd = vs + (j & 1) * PF_BN * C::LDV;
        const __half *kj = kg + k0 * DN, *vj = vg + k0 * DV;
        const __half *pe = rem > 0 ? paged_row_t<__half>(a.tab, a.tab_off, a.row, k0) + ro : knh;
        if constexpr (C::NFIX) {
#pragma unroll
            for (int u = 0; u < C::NCP; u++) {
                const int r = rn + u * C::RSN;
                const bool ok = r < rem;
                cp_async16_zfill(kd + r * C::LDK + cn * 8, ok ? kj + (int64_t)u * C::RSN * DN : knh, ok);
            }
        } else {
            (void)kj;
#pragma unroll
            for (int u = 0; u < C::NCP; u++) {
                const int i = tid + u * PF_T, r = i / C::CKN, c = i % C::CKN;
                const bool ok = r < rem;
                cp_async16_zfill(kd + r * C::LDK + c * 8, ok ? knh + (k0 + r) * DN + c * 8 : knh, ok);
            }
        }
#pragma unroll
        for (int u = 0; u < C::NVP; u++) {
            const int r = rv + u * C::RSV;
            const bool ok = r < rem;
            cp_async16_zfill(vd + r * C::LDV + cv * 8, ok ? vj + (int64_t)u * C::RSV * DV : vh, ok);
        }
#pragma unroll
        for (int u = 0; u < C::RCP; u++) {
            const int r = rk + u * C::RSR;
            const bool ok = r < rem;
            cp_async16_zfill(kd + r * C::LDK + DN + cr * 8, ok ? pe + (int64_t)u * C::RSR * a.row : knh, ok);
        }
        cp_async_commit();
    };
    issue(0);
    if (ntile > 1) issue(1);
    else cp_async_commit();
    /* this warp's rows ra (g) and rb (g + 8): the A fragments of S for each k-step, from the
     * queries in fp32 (a row of DK floats: nope, then rope), zeros past T */
    const int ra = r0 + warp * 16 + g, rb = ra + 8;
    uint32_t qf[C::KS][4];
    {
        const float *qa = a.q + (int64_t)min(ra, a.T - 1) * a.q_ld_t + (int64_t)h * a.q_ld_h;
        const float *qb = a.q + (int64_t)min(rb, a.T - 1) * a.q_ld_t + (int64_t)h * a.q_ld_h;
        const float sa = ra < a.T ? a.sl2 : 0.f, sb = rb < a.T ? a.sl2 : 0.f;
#pragma unroll
        for (int kk = 0; kk < C::KS; kk++) {
            const int c0 = kk * 16 + 2 * c4, c1 = c0 + 8;
            const float2 x0 = *(const float2 *)(qa + c0), x1 = *(const float2 *)(qb + c0);
            const float2 x2 = *(const float2 *)(qa + c1), x3 = *(const float2 *)(qb + c1);
            qf[kk][0] = pf_pack_h2(x0.x * sa, x0.y * sa);
            qf[kk][1] = pf_pack_h2(x1.x * sb, x1.y * sb);
            qf[kk][2] = pf_pack_h2(x2.x * sa, x2.y * sa);
            qf[kk][3] = pf_pack_h2(x3.x * sb, x3.y * sb);
        }
    }
    float o[C::NO][4];
#pragma unroll
    for (int n = 0; n < C::NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const int64_t pa = a.pos0 + ra, pb = a.pos0 + rb; /* a key is seen by a row at or after it */
    const int64_t wlast = a.pos0 + r0 + warp * 16 + 15, bfirst = a.pos0 + r0;
    const uint32_t kaddr0 = mlacu_smem_u32(ks + ((lane & 7) + ((lane >> 4) << 3)) * C::LDK + ((lane >> 3) & 1) * 8);
    const uint32_t vaddr0 = mlacu_smem_u32(vs + ((lane & 7) + (((lane >> 3) & 1) << 3)) * C::LDV + (lane >> 4) * 8);
    for (int j = 0; j < ntile; j++) {
        cp_async_wait<1>(); /* this thread's copies of tile j landed */
        __syncthreads();    /* and everyone's */
        const int64_t k0 = (int64_t)j * PF_BN;
        if (k0 <= wlast) { /* warp-uniform */
            const uint32_t kaddr = kaddr0 + (j & 1) * PF_BN * C::LDK * 2, vaddr = vaddr0 + (j & 1) * PF_BN * C::LDV * 2;
            float s[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < C::KS; kk++) {
#pragma unroll
                for (int np = 0; np < 4; np++) { /* keys 16 np .. +16: matrices keys +0 / +8, k +0 / +8 */
                    uint32_t B[4];
                    mlacu_ldsm_x4(B, kaddr + (np * 16 * C::LDK + kk * 16) * 2);
                    mlacu_mma_f16(s[2 * np], qf[kk], B[0], B[1]);
                    mlacu_mma_f16(s[2 * np + 1], qf[kk], B[2], B[3]);
                }
            }
            /* s[n][e]: row ra (e < 2) or rb, key k0 + 8 n + 2 c4 + (e & 1) */
            float al[2], mb[2];
            mlacu_softmax_tile(reinterpret_cast<float(&)[32]>(s), k0, c4, bfirst, pa, pb, m_r, l_r, al, mb);
            /* P: k-step kk of P V (keys 16 kk .. +16) is n-tiles 2 kk, 2 kk + 1 of S */
            uint32_t pf[4][4];
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const float p0 = exp2f(s[n][0] - mb[0]), p1 = exp2f(s[n][1] - mb[0]);
                const float p2 = exp2f(s[n][2] - mb[1]), p3 = exp2f(s[n][3] - mb[1]);
                l_r[0] += p0 + p1;
                l_r[1] += p2 + p3;
                pf[n >> 1][(n & 1) * 2] = pf_pack_h2(p0, p1);
                pf[n >> 1][(n & 1) * 2 + 1] = pf_pack_h2(p2, p3);
            }
#pragma unroll
            for (int n = 0; n < C::NO; n++) {
                o[n][0] *= al[0];
                o[n][1] *= al[0];
                o[n][2] *= al[1];
                o[n][3] *= al[1];
            }
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
#pragma unroll
                for (int np = 0; np < C::NO / 2; np++) { /* columns 16 np .. +16: matrices keys +0 / +8, n +0 / +8 */
                    uint32_t B[4];
                    mlacu_ldsm_x4_t(B, vaddr + (kk * 16 * C::LDV + np * 16) * 2);
                    mlacu_mma_f16(o[2 * np], pf[kk], B[0], B[1]);
                    mlacu_mma_f16(o[2 * np + 1], pf[kk], B[2], B[3]);
                }
            }
        }
        __syncthreads(); /* buffer j & 1 is free: tile j + 2 into it */
        if (j + 2 < ntile) issue(j + 2);
        else cp_async_commit();
    }
    cp_async_wait<0>(); /* only empty groups remain */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
        const int row = r ? rb : ra;
        if (row >= a.T) continue;
        const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
        float *dst = a.out + (int64_t)row * a.o_ld_t + (int64_t)h * a.o_ld_h + vz * DV + 2 * c4;
#pragma unroll
        for (int n = 0; n < C::NO; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
}

/* ---------------------------------------------------------------- host side */
/* the shapes with a kernel: DeepSeek's 128 + 64 / 128, GLM-4.7-Flash's 192 + 64 / 256 (its values
 * in two blocks of 128 columns, or four of 64 where a block's shared memory is short of 100 KB:
 * sm_120) and the fixtures' 64 + 32 / 64 */
enum pf_shape { PF_NONE, PF_128, PF_64, PF_GLM, PF_GLM64 };
pf_shape shape_of(int64_t dn, int64_t dr, int64_t dv) {
    if (dn == 128 && dr == 64 && dv == 128) return PF_128;
    if (dn == 64 && dr == 32 && dv == 64) return PF_64;
    if (dn == 192 && dr == 64 && dv == 256)
        return (size_t)mlacu_smem_optin() >= pf_cfg<192, 64, 128>::SMEM ? PF_GLM : PF_GLM64;
    return PF_NONE;
}
size_t shape_smem(pf_shape s) {
    switch (s) {
    case PF_128: return pf_cfg<128, 64, 128>::SMEM;
    case PF_64: return pf_cfg<64, 32, 64>::SMEM;
    case PF_GLM: return pf_cfg<192, 64, 128>::SMEM;
    case PF_GLM64: return pf_cfg<192, 64, 64>::SMEM;
    default: return SIZE_MAX;
    }
}

/* the attention kernel's shared memory allowed, once a process (one device a process, or ranks of
 * one process on one device) */
template <int DN, int DR, int DV> int attn_setup(mla_err *e) {
    MLACU_CHECK((mlacu_smem_allow_once<pf_attn_kernel<DN, DR, DV>>(pf_cfg<DN, DR, DV>::SMEM)), e,
                "prefill attention: shared memory %zu", pf_cfg<DN, DR, DV>::SMEM);
    return MLA_OK;
}

static int g_pwg_mode = 1; /* mla_cuda_prefill_wg: 0 none, 1 both kernels, 2 the decompression */

#ifdef MLA_CUDA_WGMMA
/* whether the warpgroup kernels (attn_pfwg_cuda.cu) run this shape here: DeepSeek's widths and
 * GLM's (its values in blocks of 128, the layout they read); the attention unless mode 2 */
bool pwg_takes(int DN, int DR, int DV, int DVB, bool attn) {
    return g_pwg_mode && (g_pwg_mode == 1 || !attn) && DR == 64 &&
           ((DN == 128 && DV == 128) || (DN == 192 && DV == 256)) && DVB == 128 && mlacu_pwg_device_ok();
}
#endif

/* one group of hg heads from head h0: the decompression of its keys and values, then its attention;
 * DV the head's value width, DVB a block's (the values decompressed as DV / DVB heads of DVB) */
template <int DN, int DR, int DV, int DVB>
int run_group(const mla_cuda_prefill_args *a, int64_t h0, int64_t hg, cudaStream_t st, mla_err *e) {
    using C = pf_cfg<DN, DR, DVB>;
    static_assert(DV % DVB == 0, "a head's values in whole blocks");
    constexpr int VS = DV / DVB;
    const int64_t nk = a->pos0 + a->n_tokens, KL = a->kv_lora;
    __half *kn = (__half *)a->work, *v = kn + hg * nk * DN;
    const pf_up uk = {a->blk_tab, a->blk_off, (int)(KL + a->n_rope), (int)KL, nk,
                      a->w_f16 ? (const void *)((const __half *)a->w_kb + h0 * KL * DN)
                               : (const void *)((const float *)a->w_kb + h0 * KL * DN),
                      kn};
    const pf_up uv = {a->blk_tab, a->blk_off, (int)(KL + a->n_rope), (int)KL, nk,
                      a->w_f16 ? (const void *)((const __half *)a->w_vb + h0 * DV * KL)
                               : (const void *)((const float *)a->w_vb + h0 * DV * KL),
                      v};
    const dim3 ug((unsigned)((nk + UP_BM - 1) / UP_BM), (unsigned)hg), vg(ug.x, (unsigned)(hg * VS));
#ifdef MLA_CUDA_WGMMA
    if (pwg_takes(DN, DR, DV, DVB, false) && a->w_f16 && KL % 64 == 0) {
        const mlacu_pf_up_args u = {a->blk_tab, a->blk_off, (int)(KL + a->n_rope), (int)KL, nk,
                                    (const __half *)uk.w, (const __half *)uv.w, kn, v};
        MLACU_CHECK(mlacu_pwg_up_launch(&u, (int)hg, DN, st), e,
                    "prefill attention: decompression (wgmma) of %lld keys, %lld heads", (long long)nk, (long long)hg);
    } else
#endif
    if (a->w_f16) {
        mlacu_launch(pf_up_kernel<DN, false, __half>, ug, UP_T, 0, st, uk);
        mlacu_launch(pf_up_kernel<DVB, true, __half>, vg, UP_T, 0, st, uv);
    } else {
        mlacu_launch(pf_up_kernel<DN, false, float>, ug, UP_T, 0, st, uk);
        mlacu_launch(pf_up_kernel<DVB, true, float>, vg, UP_T, 0, st, uv);
    }
    MLACU_CHECK(cudaGetLastError(), e, "prefill attention: decompression of %lld keys, %lld heads", (long long)nk,
                (long long)hg);
    const mlacu_pf_args k = {a->q, a->q_ld_t, a->q_ld_h, kn, v, nk, a->blk_tab, a->blk_off, (int)(KL + a->n_rope),
                             (int)KL, (int)a->n_tokens, a->pos0, (int)h0, a->scale * 1.44269504088896341f, a->out,
                             a->out_ld_t, a->out_ld_h};
#ifdef MLA_CUDA_WGMMA
    if (pwg_takes(DN, DR, DV, DVB, true)) {
        MLACU_CHECK(mlacu_pwg_launch(&k, (int)hg, DN, st), e, "prefill attention (wgmma) T=%lld pos0=%lld heads %lld",
                    (long long)a->n_tokens, (long long)a->pos0, (long long)hg);
        return MLA_OK;
    }
#endif
    if (attn_setup<DN, DR, DVB>(e)) return MLA_ERR;
    const dim3 grid((unsigned)((a->n_tokens + PF_BM - 1) / PF_BM), (unsigned)hg, VS);
    mlacu_launch(pf_attn_kernel<DN, DR, DVB>, grid, PF_T, C::SMEM, st, k);
    MLACU_CHECK(cudaGetLastError(), e, "prefill attention T=%lld pos0=%lld heads %lld", (long long)a->n_tokens,
                (long long)a->pos0, (long long)hg);
    return MLA_OK;
}

} // namespace

extern "C" void mla_cuda_prefill_wg(int mode) {
    MLA_ASSERT(mode >= 0 && mode <= 2);
    g_pwg_mode = mode;
}

extern "C" int mla_cuda_prefill_wg_ok(void) {
#ifdef MLA_CUDA_WGMMA
    return mlacu_pwg_device_ok();
#else
    return 0;
#endif
}

extern "C" size_t mla_cuda_prefill_work_bytes(int64_t keys, int64_t n_head, int64_t head_nope, int64_t head_v) {
    return (size_t)keys * (size_t)n_head * (size_t)(head_nope + head_v) * 2;
}

extern "C" bool mla_cuda_prefill_supported(int64_t kv_lora, int64_t n_rope, int64_t head_nope, int64_t head_v) {
    const pf_shape s = shape_of(head_nope, n_rope, head_v);
    if (s == PF_NONE || kv_lora <= 0 || kv_lora % UP_BK || kv_lora > 1024) return false;
    return (size_t)mlacu_smem_optin() >= shape_smem(s);
}

extern "C" int mla_cuda_prefill_attn(const mla_cuda_prefill_args *a, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(mla_cuda_prefill_supported(a->kv_lora, a->n_rope, a->head_nope, a->head_v));
    MLA_ASSERT(a->n_tokens >= 0 && a->n_tokens <= INT32_MAX && a->pos0 >= 0 && a->n_head > 0 && a->n_head <= 65535);
    MLA_ASSERT(!((uintptr_t)a->q & 7) && !(a->q_ld_t & 1) && !(a->q_ld_h & 1));
    MLA_ASSERT(!((uintptr_t)a->out & 7) && !(a->out_ld_t & 1) && !(a->out_ld_h & 1));
    MLA_ASSERT(!(a->blk_off & 7) && !((uintptr_t)a->work & 15) && !((uintptr_t)a->w_kb & 15) && !((uintptr_t)a->w_vb & 15));
    if (a->n_tokens == 0) return MLA_OK;
    const int64_t nk = a->pos0 + a->n_tokens;
    const size_t per = mla_cuda_prefill_work_bytes(nk, 1, a->head_nope, a->head_v);
    MLA_ASSERT(a->work_bytes >= per);
    const int64_t hmax = (int64_t)(a->work_bytes / per);
    const pf_shape s = shape_of(a->head_nope, a->n_rope, a->head_v);
    /* the values' decompression grid: a head's value blocks in y */
    MLA_ASSERT(a->n_head * (s == PF_GLM ? 2 : s == PF_GLM64 ? 4 : 1) <= 65535);
    cudaStream_t st = (cudaStream_t)stream;
    for (int64_t h0 = 0; h0 < a->n_head; h0 += hmax) {
        const int64_t hg = a->n_head - h0 < hmax ? a->n_head - h0 : hmax;
        int rc;
        switch (s) {
        case PF_128: rc = run_group<128, 64, 128, 128>(a, h0, hg, st, e); break;
        case PF_GLM: rc = run_group<192, 64, 256, 128>(a, h0, hg, st, e); break;
        case PF_GLM64: rc = run_group<192, 64, 256, 64>(a, h0, hg, st, e); break;
        default: rc = run_group<64, 32, 64, 64>(a, h0, hg, st, e); break;
        }
        if (rc) return rc;
    }
    return MLA_OK;
}
