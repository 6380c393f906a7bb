/* attn_pfwg_cuda: the causal attention of the non-absorbed prompt path on the warpgroup tensor
 * cores (sm_90a), and the decompression of its keys and values (uwg_kernel, at the end); see
 * attn_pfwg_cuda.h.
 *
 * Block = (tile of 128 query rows, head), three warpgroups (384 threads): two consumers of 64 rows
 * each (wgmma's M) and a producer; the heaviest tiles (the last rows) are scheduled first. Both
 * consumers share the key tiles; each keeps its own rows' softmax in registers (no exchange).
 * Two forms (pw_cfg): DeepSeek's 128 + 64 / 128 with key tiles of 128 keys, GLM's 192 + 64 / 256
 * with tiles of 64 (its output rows are 128 floats a thread, S 32; a tile of 128 keys would not fit
 * the registers, nor its buffers the shared memory). Shared memory (209 / 193 KB): the queries
 * (times scale log2 e, fp16), two key tiles and two value tiles, eight mbarriers. Every operand
 * sits in the K-major layout with the 128-byte swizzle of attn_wg_cuda.cu: 64 columns (128 bytes)
 * a k-block, 16-byte chunk c of row r at chunk c ^ (r % 8), 8-row groups 1024 bytes apart:
 * - queries: DK / 64 k-blocks (3 or 4) of 64 rows a warpgroup; key tile: as many k-blocks of the
 *   tile's keys (the nope columns from the work area, 64 rope columns from the cache rows of the
 *   tile's cache blocks); value tile: DV / 64 k-blocks.
 * - S = Q K^T: DK / 16 m64nBNk16 steps, both operands by descriptor (K-major).
 * - O += P V: BN / 16 steps of 16 keys, each DV / 128 m64n128k16 products; A = P from registers
 *   (S's accumulator layout is wgmma's A fragment: the fp16 pair of keys 2 t4, +1 of rows g, g + 8,
 *   then keys 8 + 2 t4), B = the value tile read MN-major (V's columns, its N, contiguous in a
 *   key's row): the descriptor steps 64 columns by LBO (a k-block) and 8 keys by SBO (1024), as
 *   attn_wg_cuda.cu reads its latent.
 * - causal: a consumer skips the key tiles wholly past its last row and masks those that reach
 *   past its first.
 * The schedule (FlashAttention-3's, our code): the producer warpgroup (its registers given to the
 * consumers by setmaxnreg) copies by cp.async (16 bytes, zeros past the block's keys; each
 * thread's copies at its first one's address plus whole 8-row groups) and counts their landing on
 * "full" mbarriers. A consumer's step j puts S of tile j and O += P V of tile j - 1 on the tensor
 * cores together, then runs the softmax of tile j while the products of tile j - 1 finish; the
 * two consumers take turns to issue their products (named barriers), so that one's softmax runs
 * beside the other's products. Keys and values have buffers and barriers of their own: a tile's
 * keys are dead once both consumers' S of it is done, a step before its values, so the keys of
 * tile t and the values of tile t - 1 are both copied once step t - 2 has released them, two
 * steps before step t needs them (with one barrier a tile, the copy of tile t waited for the
 * products of step t - 1, and the consumers waited for it a third of their time). On an H200
 * (2026-12-03, a V3 32k prompt's layer of 128 heads) this ran at 558 TFLOP/s against 464 with one
 * barrier a tile (same binary); earlier, the consumers copying in step (one block barrier a tile)
 * 439, the kernel before either overlap 424. Checked against the CPU reference and the mma.sync
 * kernel in mla-gpu-check (--prefill, the "wg" rows). */
#include "kernels/attn_pfwg_cuda.h"

#include <math.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"
#include "kernels/wgmma_ops_cuda.h"

namespace {

constexpr int PW_DR = 64, PW_BM = 128, PW_T = 256, PW_WM = 64; /* rope width, rows a block, threads, rows a warpgroup */
constexpr int PW_BLK = 64 * 128;                               /* a k-block of the queries' 64 rows: 8192 bytes */
/* a form: DN + 64 / DV, key tiles of BN keys */
template <int DN, int DV> struct pw_cfg {
    static_assert((DN == 128 && DV == 128) || (DN == 192 && DV == 256), "attention widths: 128 / 128, 192 / 256");
    static constexpr int BN = DV == 128 ? 128 : 64;             /* keys a tile */
    static constexpr int DK = DN + PW_DR, KBQ = DK / 64;        /* k-blocks of queries and keys */
    static constexpr int KBV = DV / 64, NV = DV / 128;          /* k-blocks of values; n128 products of P V */
    static constexpr int KBLK = BN * 128;                       /* a k-block of a tile's keys */
    static constexpr int Q = 2 * KBQ * PW_BLK;                  /* the queries of both warpgroups */
    static constexpr int KT = KBQ * KBLK, VT = KBV * KBLK;      /* a key tile, a value tile */
    static constexpr size_t SMEM = (size_t)Q + 2 * KT + 2 * VT + 1024 + 64; /* and the eight mbarriers */
    static constexpr int NS = BN / 2;                           /* S's floats a thread */
    /* registers a thread after setmaxnreg, of the consumers and of the producer: 256 RC + 128 RP
     * = 384 x 168, what the launch bounds give (GLM's producer, with a third nope k-block to copy,
     * needs more than 56) */
    static constexpr int RC = DN == 128 ? 224 : 216, RP = DN == 128 ? 56 : 72;
    static_assert(256 * RC + 128 * RP == 384 * 168, "the block's registers dealt out");
    static_assert(BN % MLA_CUDA_KV_BLOCK == 0 && MLA_CUDA_KV_BLOCK == 64, "a key tile is whole cache blocks");
    static_assert(PW_WM <= BN, "warpgroup 0 skips at most a block's last key tile");
    static_assert(DN % 64 == 0 && DN / 128 == 1, "the nope columns: a slab of 128, maybe one k-block more");
};
static_assert(PW_BM == 2 * PW_WM, "two warpgroups of 64 rows");
constexpr size_t PW_SMEM_ALL = pw_cfg<128, 128>::SMEM; /* the larger */
static_assert(pw_cfg<192, 256>::SMEM <= PW_SMEM_ALL, "the larger form's shared memory is what the device check asks");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* O += P V: m64n128k16, A = P from registers (the S accumulator's layout, packed to fp16 pairs), B
 * (MN-major) by descriptor */
static __device__ __forceinline__ void pw_mma_pv(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
/* S += Q K^T over one k16 step: a tile of 128 keys or of 64 */
static __device__ __forceinline__ void pw_mma_s(float (&s)[64], uint64_t dq, uint64_t dk) { wga_mma_n128(s, dq, dk); }
static __device__ __forceinline__ void pw_mma_s(float (&s)[32], uint64_t dq, uint64_t dk) { wga_mma_s64(s, dq, dk); }
#endif

/* 384 threads: launch bounds give 168 registers a thread, which setmaxnreg deals out (pw_cfg's RC,
 * RP) */
constexpr int PW_TALL = PW_T + 128; /* the consumers and the producer warpgroup */

template <int DN, int DV> __global__ void __launch_bounds__(PW_TALL, 1) pwg_kernel(mlacu_pf_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = pw_cfg<DN, DV>;
    constexpr int BN = C::BN, KBLK = C::KBLK, NV = C::NV;
    mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t pw_raw[];
    uint8_t *sm = pw_raw + ((1024u - (wga_u32(pw_raw) & 1023u)) & 1023u);
    uint8_t *qs = sm, *ks = qs + C::Q, *vs = ks + 2 * C::KT;
    /* a key tile's and a value tile's buffers pass between producer and consumers on barriers
     * of their own: keys are dead once S is done, a step before the values */
    uint64_t *fullk = (uint64_t *)(vs + 2 * C::VT), *fullv = fullk + 2, *emptyk = fullk + 4, *emptyv = fullk + 6;
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), wq = (tid >> 5) & 3,
              lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int rb0 = (int)(gridDim.x - 1 - blockIdx.x) * PW_BM, hl = blockIdx.y, h = a.h0 + hl;
    const int rend = min(rb0 + PW_BM, a.T);
    const int64_t kend = a.pos0 + rend;
    const int ntile = (int)((kend + BN - 1) / BN);
    /* warpgroup 0's tiles (warpgroup 1 takes every tile of the block) */
    const int ntw0 = (int)min((int64_t)ntile, (a.pos0 + rb0 + PW_WM - 1) / BN + 1);
    /* k_nope [head][nk][DN]; v [head][NV][nk][128] (a head's values in slabs of 128 columns) */
    const __half *knh = a.kn + (int64_t)hl * a.nk * DN, *vh = a.v + (int64_t)hl * NV * a.nk * 128;
    if (tid == 0) {
        for (int b = 0; b < 2; b++) {
            mlacu_mbar_init(&fullk[b], 128); /* the producer's threads */
            mlacu_mbar_init(&fullv[b], 128);
            mlacu_mbar_init(&emptyk[b], 8); /* the consumers' warps */
            mlacu_mbar_init(&emptyv[b], 8);
        }
        mlacu_mbar_init_fence();
    }
    __syncthreads();
    if (wg == 2) { /* the producer: tile t into buffer t & 1 once both consumers are done with tile t - 2 */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::RP) : "memory");
        const int pt = tid - PW_T;
        /* a slab of 128 columns: chunk cn of keys rn + 8 u; a k-block of 64 (the nope's third, the
         * rope from the cache blocks): chunk cr of keys rk + 16 u; each at its first one's
         * swizzled offset plus whole 8-row groups */
        const int cn = pt & 15, rn = pt >> 4, cr = pt & 7, rk = pt >> 3;
        const uint32_t kso = (uint32_t)((cn >> 3) * KBLK) + wga_sw(rn, cn & 7), kbo = wga_sw(rk, cr);
        const __half *kg = knh + rn * DN + cn * 8, *kg3 = knh + rk * DN + 128 + cr * 8, *vg = vh + rn * 128 + cn * 8;
        const int64_t ro = (int64_t)rk * a.row + a.kv_lora + cr * 8;
        /* keys of tile t once both consumers' S of tile t - 2 is done, values of tile t - 1 once
         * their P V of tile t - 3 is: both in the consumers' step t - 2, both needed in step t */
        for (int t = 0; t <= ntile; t++) {
            if (t < ntile) {
                const int b = t & 1;
                /* warpgroup 0 skips at most the block's last tile, which no later tile reuses: every
                 * release waited for here has both consumers' arrivals */
                if (t >= 2) mlacu_mbar_wait(&emptyk[b], ((t - 2) >> 1) & 1);
                const int64_t k0 = (int64_t)t * BN;
                const int rem = (int)min((int64_t)BN, kend - k0);
                uint8_t *kd = ks + b * C::KT;
                const __half *kj = kg + k0 * DN;
#pragma unroll
                for (int u = 0; u < BN / 8; u++) {
                    const bool ok = rn + 8 * u < rem;
                    cp_async16_zfill(kd + kso + u * 8 * 128, ok ? kj + u * 8 * DN : knh, ok);
                }
                if constexpr (DN == 192) {
                    const __half *kj3 = kg3 + k0 * DN;
#pragma unroll
                    for (int u = 0; u < BN / 16; u++) {
                        const bool ok = rk + 16 * u < rem;
                        cp_async16_zfill(kd + 2 * KBLK + kbo + u * 16 * 128, ok ? kj3 + u * 16 * DN : knh, ok);
                    }
                }
#pragma unroll
                for (int pg = 0; pg < BN / 64; pg++) {
                    const __half *pe =
                        64 * pg < rem ? (const __half *)a.tab[(k0 >> MLA_CUDA_KV_BLOCK_LOG2) + pg] + a.tab_off + ro : knh;
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const bool ok = 64 * pg + 16 * u + rk < rem;
                        cp_async16_zfill(kd + (DN / 64) * KBLK + kbo + (64 * pg + 16 * u) * 128,
                                         ok ? pe + (int64_t)(16 * u) * a.row : knh, ok);
                    }
                }
                mlacu_cp_async_arrive(&fullk[b]);
            }
            if (t >= 1) {
                const int v = t - 1, b = v & 1;
                if (v >= 2) mlacu_mbar_wait(&emptyv[b], ((v - 2) >> 1) & 1);
                const int64_t k0 = (int64_t)v * BN;
                const int rem = (int)min((int64_t)BN, kend - k0);
                uint8_t *vd = vs + b * C::VT;
#pragma unroll
                for (int c = 0; c < NV; c++) {
                    const __half *vj = vg + ((int64_t)c * a.nk + k0) * 128;
#pragma unroll
                    for (int u = 0; u < BN / 8; u++) {
                        const bool ok = rn + 8 * u < rem;
                        cp_async16_zfill(vd + c * 2 * KBLK + kso + u * 8 * 128, ok ? vj + u * 8 * 128 : vh, ok);
                    }
                }
                mlacu_cp_async_arrive(&fullv[b]);
            }
        }
        cp_async_commit(); /* the copies' own groups: none in flight when the thread exits */
        cp_async_wait_all();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::RC) : "memory");
    { /* the queries: 128 rows x DK / 2 float2; rows past T zero */
#pragma unroll 4
        for (int u = 0; u < PW_BM * (C::DK / 2) / PW_T; u++) {
            const int i = tid + u * PW_T, rr = i / (C::DK / 2), c = i % (C::DK / 2) * 2, row = rb0 + rr;
            const float sc = row < a.T ? a.sl2 : 0.f;
            const float2 x = *(const float2 *)(a.q + (int64_t)min(row, a.T - 1) * a.q_ld_t + (int64_t)h * a.q_ld_h + c);
            const int w = rr >> 6, r = rr & 63;
            *(uint32_t *)(qs + (w * C::KBQ + (c >> 6)) * PW_BLK + wga_sw(r, (c & 63) >> 3) + (c & 7) * 2) =
                wga_h2(x.x * sc, x.y * sc);
        }
    }
    wga_fence_proxy(); /* the queries, to wgmma's proxy */
    mlacu_bar_sync(1, PW_T);
    float o[NV][64];
#pragma unroll
    for (int c = 0; c < NV; c++)
#pragma unroll
        for (int i = 0; i < 64; i++) o[c][i] = 0.f;
    const int r0 = wq * 16 + g;
    const int64_t wfirst = a.pos0 + rb0 + wg * PW_WM, wlast = wfirst + PW_WM - 1;
    const int64_t pa = wfirst + r0, pb = pa + 8;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const uint32_t q0 = wga_u32(qs + wg * C::KBQ * PW_BLK), kbase = wga_u32(ks), vbase = wga_u32(vs);
    const int ntw = (int)min((int64_t)ntile, wlast / BN + 1);
    constexpr int NS = C::NS;
    float s[NS];
    uint32_t p[NS / 2] = {};
    auto pin_o = [&]() {
#pragma unroll
        for (int c = 0; c < NV; c++) wga_pin(o[c]);
    };
    /* step j: S of tile j (SJ) and O += P V of tile j - 1 (PV). Turns: warpgroup 0's step j after
     * warpgroup 1's step j - 1 has issued its products, warpgroup 1's step j after warpgroup 0's
     * step j (while warpgroup 0 has one). */
    auto step = [&](int j, auto SJ, auto PV) {
        constexpr bool sj = decltype(SJ)::value, pv = decltype(PV)::value;
        if constexpr (sj) mlacu_mbar_wait(&fullk[j & 1], (j >> 1) & 1);
        if constexpr (pv) mlacu_mbar_wait(&fullv[(j - 1) & 1], ((j - 1) >> 1) & 1);
        wga_fence_proxy();
        if (wg == 0) {
            if (j >= 1) mlacu_bar_sync(2, PW_T);
        } else if (j <= ntw0) {
            mlacu_bar_sync(3, PW_T);
        }
        pin_o();
        wga_pin_r(p);
        if constexpr (sj) {
#pragma unroll
            for (int i = 0; i < NS; i++) s[i] = 0.f;
            wga_pin(s);
        }
        wga_fence();
        if constexpr (sj) {
            const uint32_t kt = kbase + (uint32_t)(j & 1) * C::KT;
#pragma unroll
            for (int kk = 0; kk < C::KBQ * 4; kk++) {
                const uint32_t ko = (uint32_t)((kk & 3) * 32);
                pw_mma_s(s, wga_desc_k(q0 + (kk >> 2) * PW_BLK + ko), wga_desc_k(kt + (kk >> 2) * KBLK + ko));
            }
            wga_commit();
        }
        if constexpr (pv) {
            const uint32_t vt = vbase + (uint32_t)((j - 1) & 1) * C::VT;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int c = 0; c < NV; c++)
                    pw_mma_pv(o[c], p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                              wga_desc_mn<KBLK>(vt + (uint32_t)(c * 2 * KBLK + kk * 16 * 128)));
            wga_commit();
        }
        if (wg == 0)
            mlacu_bar_arrive(3, PW_T);
        else if (j + 1 <= ntw0)
            mlacu_bar_arrive(2, PW_T);
        float al[2];
        if constexpr (sj) {
            if constexpr (pv)
                wga_wait1(); /* S; the products of tile j - 1 still run */
            else
                wga_wait0();
            wga_pin(s);
            if (lane == 0) mlacu_mbar_arrive(&emptyk[j & 1]); /* tile j's keys back to the producer */
            float mb[2];
            mlacu_softmax_tile(s, (int64_t)j * BN, t4, wfirst, pa, pb, m_r, l_r, al, mb);
#pragma unroll
            for (int i = 0; i < NS; i++) {
                s[i] = wga_ex2(s[i] - mb[(i >> 1) & 1]);
                l_r[(i >> 1) & 1] += s[i];
            }
        }
        if constexpr (pv) { /* tile j - 1 done: its values back to the producer */
            wga_wait0();
            pin_o();
            wga_pin_r(p);
            if (lane == 0) mlacu_mbar_arrive(&emptyv[(j - 1) & 1]);
        }
        if constexpr (sj) {
#pragma unroll
            for (int c = 0; c < NV; c++) wga_scale_rows(o[c], al);
#pragma unroll
            for (int m = 0; m < NS / 2; m++) p[m] = wga_h2(s[2 * m], s[2 * m + 1]);
        }
    };
    using yes = std::true_type;
    using no = std::false_type;
    step(0, yes{}, no{});
    for (int j = 1; j < ntw; j++) step(j, yes{}, yes{});
    step(ntw, no{}, yes{});
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
        const int row = rb0 + wg * PW_WM + r0 + 8 * r;
        if (row >= a.T) continue;
        const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
        float *dst = a.out + (int64_t)row * a.o_ld_t + (int64_t)h * a.o_ld_h + 2 * t4;
#pragma unroll
        for (int c = 0; c < NV; c++)
#pragma unroll
            for (int i = 0; i < 16; i++)
                *(float2 *)(dst + 128 * c + 8 * i) =
                    make_float2(o[c][4 * i + 2 * r] * inv, o[c][4 * i + 2 * r + 1] * inv);
    }
#else
    (void)a;
    __trap();
#endif
}

/* ---------------------------------------------------------------- decompression */
/* At 128 / 128 (DeepSeek), tile = (128 keys, head): kn = C W_kb[h] and v = C W_vb[h]^T of the
 * tile's latent rows C, both from one copy of C. At 192 / 256 (GLM-4.7-Flash, GLM-5), whose three
 * products would not fit a thread's registers, three tiles a (128 keys, head): kn's 192 columns
 * (an n128 and an n64 product), then each half of v's 256 ([head][half][nk][128], as the mma.sync
 * attention reads them). A persistent grid of one block an SM walks the tiles (heads fastest: the
 * blocks at work at once share a tile of latent rows in the L2, and each head's weights are read
 * again for every tile of keys). Two warpgroups, 64 keys each, keep a tile's accumulators (128 or
 * 96 floats a thread). The latent is walked in stages of 64 columns (16 KB of latent rows; 16 KB
 * of W_kb rows and 16 KB of W_vb columns, or 24 KB of W_kb rows or 16 KB of W_vb columns), UW_ST
 * buffers, copied by cp.async two stages ahead by every thread (the copies of a tile's first
 * stages run during the previous tile's last products and its stores). Layouts of the 128-byte
 * swizzle: the latent rows and W_vb K-major (wgmma's A and a K-major B, as the attention's queries
 * and keys), W_kb MN-major (its columns contiguous in a row: blocks of 64 columns, LBO 8192, SBO
 * 1024, as the attention's values). The products accumulate in fp32 and are rounded to fp16 once,
 * as the mma.sync kernel's. */
constexpr int UW_BM = 128, UW_KC = 64, UW_ST = 4, UW_T = 256;
constexpr int UW_A = UW_BM * 128;        /* a stage's latent rows: 128 x 64 halves */
constexpr int UW_WKB = UW_KC * 128;      /* a 64-column block of a stage's W_kb rows */
constexpr int UW_WV = 128 * 128;         /* W_vb: 128 rows x 64 columns */
template <int KN> struct uw_cfg {
    static_assert(KN == 128 || KN == 192, "decompression widths: 128 / 128, 192 / 256");
    static constexpr int P = KN == 128 ? 1 : 3;   /* tiles a (128 keys, head) */
    static constexpr int WK = KN / 64 * UW_WKB;   /* W_kb: 64 rows x KN columns */
    static constexpr int SB = P == 1 ? UW_A + WK + UW_WV : UW_A + (WK > UW_WV ? WK : UW_WV);
    static constexpr size_t SMEM = (size_t)UW_ST * SB + 1024;
    static_assert(SB % 1024 == 0 && UW_A % 1024 == 0 && UW_WKB % 1024 == 0, "the swizzle's 1024-byte unit");
};
static_assert(UW_ST >= 3, "copies two stages ahead of the products, one stage's products in flight");
constexpr size_t UW_SMEM = uw_cfg<128>::SMEM; /* the larger */
static_assert(uw_cfg<192>::SMEM <= UW_SMEM, "the larger form's shared memory is what the device check asks");

template <int KN> __global__ void __launch_bounds__(UW_T, 1) uwg_kernel(mlacu_pf_up_args a, int heads) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = uw_cfg<KN>;
    mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t uw_raw[];
    uint8_t *sm = uw_raw + ((1024u - (wga_u32(uw_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ntiles = (a.nk + UW_BM - 1) / UW_BM * heads * C::P;
    const int nst = a.kv_lora / UW_KC;
    /* this block's tiles blockIdx.x + i gridDim.x, nst stages each; tile = (key tile, head, part),
     * parts fastest */
    const int64_t mine = (int64_t)blockIdx.x < ntiles ? (ntiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int64_t total = mine * nst;
    auto issue = [&](int64_t gs) {
        if (gs < total) {
            const int64_t tile = blockIdx.x + gs / nst * gridDim.x, th = tile / C::P, k0 = th / heads * UW_BM;
            const int hl = (int)(th % heads), part = (int)(tile % C::P), c0 = (int)(gs % nst) * UW_KC;
            uint8_t *st = sm + (gs % UW_ST) * C::SB;
#pragma unroll
            for (int u = 0; u < UW_BM * 8 / UW_T; u++) { /* latent: 128 rows x 8 chunks */
                const int i = tid + u * UW_T, r = i >> 3, c = i & 7;
                const int64_t key = k0 + r;
                const bool ok = key < a.nk;
                cp_async16_zfill(st + wga_sw(r, c),
                                 ok ? paged_row_t<__half>(a.tab, a.tab_off, a.row, key) + c0 + c * 8 : a.wk, ok);
            }
            if (part == 0) { /* W_kb: 64 rows x KN / 8 chunks, in blocks of 64 columns */
                const __half *wk = a.wk + (int64_t)hl * a.kv_lora * KN + (int64_t)c0 * KN;
                constexpr int CK = KN / 8;
#pragma unroll
                for (int u = 0; u < UW_KC * CK / UW_T; u++) {
                    const int i = tid + u * UW_T, r = i / CK, c = i % CK;
                    cp_async16(st + UW_A + (c >> 3) * UW_WKB + wga_sw(r, c & 7), wk + r * KN + c * 8);
                }
            }
            if (C::P == 1 || part > 0) { /* W_vb: 128 rows (of the part's half) x 8 chunks */
                const __half *wv = a.wv + ((int64_t)hl * 128 * (C::P == 1 ? 1 : 2) + (part > 0 ? part - 1 : 0) * 128) *
                                              a.kv_lora + c0;
                uint8_t *dv = st + UW_A + (C::P == 1 ? C::WK : 0);
#pragma unroll
                for (int u = 0; u < 128 * 8 / UW_T; u++) {
                    const int i = tid + u * UW_T, r = i >> 3, c = i & 7;
                    cp_async16(dv + wga_sw(r, c), wv + (int64_t)r * a.kv_lora + c * 8);
                }
            }
        }
        cp_async_commit(); /* a group every call: the wait below counts them */
    };
    /* a tile's nst stages: mma(A: the warpgroup's latent rows, w: the stage's weights, k-step kk,
     * accumulate) on each, all done on return; gs counts the stages over the tiles */
    const uint32_t base = wga_u32(sm);
    int64_t gs = 0;
    auto stages = [&](auto mma) {
        for (int c = 0; c < nst; c++, gs++) {
            cp_async_wait<1>(); /* stage gs landed (this thread's copies) */
            wga_fence_proxy();
            __syncthreads(); /* and everyone's; everyone's products of stage gs - 2 are done */
            issue(gs + 2);   /* into stage gs - 2's buffer */
            const uint32_t s = base + (uint32_t)(gs % UW_ST) * C::SB, xa = s + wg * 64 * 128;
            wga_fence();
#pragma unroll
            for (int kk = 0; kk < UW_KC / 16; kk++) mma(wga_desc_k(xa + kk * 32), s + UW_A, kk, c > 0 || kk > 0);
            wga_commit();
            if (c + 1 < nst) wga_wait1(); /* stage gs - 1's products done */
        }
        wga_wait0(); /* the tile's rows out, rounded to fp16 below */
    };
    /* row r (0: the thread's key, 1: key + 8) of 16 n8 steps of an accumulator, to fp16 at y */
    auto put16 = [&](__half *y, const float(&d)[64], int r) {
#pragma unroll
        for (int i = 0; i < 16; i++) *(uint32_t *)(y + 8 * i) = wga_h2(d[4 * i + 2 * r], d[4 * i + 2 * r + 1]);
    };
    /* f(r, key) for the thread's two keys of the tile that are keys (r 0: its row, 1: 8 below) */
    auto rows = [&](int64_t key0, auto f) {
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (key0 + 8 * r < a.nk) f(r, key0 + 8 * r);
    };
    float ak[64], av[64]; /* started by each tile's first product (no zeros written) */
    issue(0);
    issue(1);
    for (int64_t it = 0; it < mine; it++) {
        const int64_t tile = blockIdx.x + it * gridDim.x, th = tile / C::P, hl = th % heads;
        const int part = (int)(tile % C::P);
        const int64_t key0 = th / heads * UW_BM + wg * 64 + wq * 16 + g;
        (void)part;
        if constexpr (C::P == 1) { /* kn and v, 128 columns each */
            stages([&](uint64_t da, uint32_t w, int kk, int acc) {
                wga_mma_n128_acc<1>(ak, da, wga_desc_mn<UW_WKB>(w + kk * 16 * 128), acc);
                wga_mma_n128_acc<0>(av, da, wga_desc_k(w + C::WK + kk * 32), acc);
            });
            wga_pin(ak);
            wga_pin(av);
            rows(key0, [&](int r, int64_t key) {
                put16(a.kn + (hl * a.nk + key) * KN + 2 * t4, ak, r);
                put16(a.v + (hl * a.nk + key) * 128 + 2 * t4, av, r);
            });
            wga_pin(ak); /* the stores read them before the next tile's products write them */
            wga_pin(av);
        } else if (part == 0) { /* kn: 128 + 64 columns */
            float ak2[32];
            stages([&](uint64_t da, uint32_t w, int kk, int acc) {
                wga_mma_n128_acc<1>(ak, da, wga_desc_mn<UW_WKB>(w + kk * 16 * 128), acc);
                wga_mma_n64_acc<1>(ak2, da, wga_desc_mn<UW_WKB>(w + 2 * UW_WKB + kk * 16 * 128), acc);
            });
            wga_pin(ak);
            wga_pin(ak2);
            rows(key0, [&](int r, int64_t key) {
                __half *y = a.kn + (hl * a.nk + key) * KN + 2 * t4;
                put16(y, ak, r);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    *(uint32_t *)(y + 128 + 8 * i) = wga_h2(ak2[4 * i + 2 * r], ak2[4 * i + 2 * r + 1]);
            });
            wga_pin(ak);
            wga_pin(ak2);
        } else { /* half part - 1 of v */
            stages([&](uint64_t da, uint32_t w, int kk, int acc) {
                wga_mma_n128_acc<0>(av, da, wga_desc_k(w + kk * 32), acc);
            });
            wga_pin(av);
            rows(key0, [&](int r, int64_t key) {
                put16(a.v + ((hl * 2 + part - 1) * a.nk + key) * 128 + 2 * t4, av, r);
            });
            wga_pin(av);
        }
    }
    cp_async_wait_all();
#else
    (void)a;
    (void)heads;
    __trap();
#endif
}

} // namespace

bool mlacu_pwg_device_ok(void) {
    return mlacu_hopper_isa() && (size_t)mlacu_smem_optin() >= std::max(PW_SMEM_ALL, UW_SMEM);
}

template <int DN, int DV> static cudaError_t attn_launch(const mlacu_pf_args *a, int heads, cudaStream_t s) {
    const cudaError_t err = mlacu_smem_allow_once<pwg_kernel<DN, DV>>(pw_cfg<DN, DV>::SMEM);
    if (err != cudaSuccess) return err;
    const dim3 grid((unsigned)((a->T + PW_BM - 1) / PW_BM), (unsigned)heads);
    mlacu_launch(pwg_kernel<DN, DV>, grid, PW_TALL, pw_cfg<DN, DV>::SMEM, s, *a);
    return cudaGetLastError();
}

cudaError_t mlacu_pwg_launch(const mlacu_pf_args *a, int heads, int head_nope, cudaStream_t s) {
    if (heads <= 0 || heads > 65535 || a->T <= 0 || (a->row & 7) || (a->kv_lora & 7) || (a->tab_off & 7) ||
        (head_nope != 128 && head_nope != 192))
        return cudaErrorInvalidValue;
    return head_nope == 128 ? attn_launch<128, 128>(a, heads, s) : attn_launch<192, 256>(a, heads, s);
}

template <int KN> static cudaError_t up_launch(const mlacu_pf_up_args *a, int heads, cudaStream_t s) {
    using C = uw_cfg<KN>;
    const cudaError_t err = mlacu_smem_allow_once<uwg_kernel<KN>>(C::SMEM);
    if (err != cudaSuccess) return err;
    const int64_t tiles = (a->nk + UW_BM - 1) / UW_BM * heads * C::P;
    mlacu_launch(uwg_kernel<KN>, (unsigned)std::min<int64_t>(tiles, mlacu_sm_count()), UW_T, C::SMEM, s, *a, heads);
    return cudaGetLastError();
}

cudaError_t mlacu_pwg_up_launch(const mlacu_pf_up_args *a, int heads, int head_nope, cudaStream_t s) {
    if (heads <= 0 || a->nk <= 0 || (a->row & 7) || a->kv_lora <= 0 || (a->kv_lora % UW_KC) || (a->tab_off & 7) ||
        ((uintptr_t)a->wk & 15) || ((uintptr_t)a->wv & 15) || (head_nope != 128 && head_nope != 192))
        return cudaErrorInvalidValue;
    return head_nope == 128 ? up_launch<128>(a, heads, s) : up_launch<192>(a, heads, s);
}
