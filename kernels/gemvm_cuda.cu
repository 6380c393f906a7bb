/* gemvm_cuda: the streamed tensor-core GEMV, dense decode steps of 2 .. 16 tokens over Q4_K, Q6_K
 * and Q8_0 weights (gate + up with swiglu, two matrices on one input), and the tiles of the
 * experts with more than one pair of MoE steps (those types and Q5_0; below). API:
 * kernels/gemvs_cuda.h (internal to kernels/).
 *
 * Why: the per-warp integer GEMV (mm_gemvq_cuda.cu) pays every weight's arithmetic once per token
 * and reads 8 tokens' activations through L1 for every unit of two rows; at DeepSeek-V3's shapes
 * it moved the dense weights of a batch-8 step at 0.7-1.2 TB/s (bench/results, -30n). Here the 8
 * tokens are the n of an int8 mma.sync m16n8k32 (m16n8k16 for Q6_K's 16-element scales): a
 * weight's bytes go through the tensor cores once for all tokens. Steps of 9 .. 16 tokens take
 * two n-tiles (NT = 2: tokens 0-7 and 8-15), two mmas on the same A fragment, each with its own
 * B fragment, accumulators and token scales: the weights are still read and decoded once. The
 * fp16 tensor cores, which took 9 .. 16 tokens before, spent ~2x this kernel's time at 8 tokens
 * on V2-Lite's dense products (bench/results/step8to9-h200-2026-12-02.md).
 *
 * - Two n-tiles double a stage's x side: one block an SM, all but 4 KB of the shared memory a
 *   block may have (Q6_K: two stages of 102 KB), where one tile keeps within 200 KB.
 * - A block owns a run of bands of 32 rows (two m16 tiles); a band is walked in chunks of K. A
 *   stage is the band's 32 row segments of the chunk (CE elements: 1024 for Q8_0, 2048 for the K
 *   types), one bulk copy (TMA) each, and the T tokens' int8 chunk and unit scales, a copy a
 *   token, all issued by the lanes of a producer warp onto one mbarrier, as many ahead as there
 *   are buffers (the weights of the first ones before the wait on the kernel before). Segments sit
 *   at a stride of an odd number of 16 bytes, token rows at CE + 32, so that the lanes of a
 *   fragment load hit distinct banks.
 * - 8 consumer warps split each chunk's 32-element units (UPW each: whole Q4_K sub-block pairs,
 *   whole Q6_K halves); a warp takes both m16 tiles of its units. The lane that owns a row decodes
 *   its scales once a stage; the fragment lanes take them by shuffles.
 * - The k order inside a unit is permuted (a thread's 8 consecutive elements are its 4 + 4 of
 *   the fragment, on A and B alike), so that A and B fragments are plain 8-byte loads.
 * - Per unit and row the int32 result is scaled into fp32 accumulators:
 *   y += d_w * s (q_w . q_x) d_x - m_w (d_x sum q_x) (Q4_K), d_w (q_w . q_x) d_x (Q8_0),
 *   d s16 ((q_w . q_x) d_x - 32 d_x sum q_x) for each 16-element half (Q6_K, q_w unsigned 0..63).
 * - At a band's last chunk the warps' partial sums meet in shared memory (a named barrier over the
 *   consumers) and are added in a fixed order: the same bits whatever the grid.
 * - Two matrices a stage (gate + up) only where two stages of both fit at 8 tokens (gemvm_supported
 *   asks for 8, or 16 past 8): on an H200, Q8_0 up to 8 tokens. The others take one launch a
 *   matrix (the caller's fallback): 108 us for V3's dense Q4_K FFN at 8 tokens, against 178 on
 *   the per-warp GEMV.
 *
 * Measured (H200, 2026-12-01): 30-59% of the copy rate at
 * V3's shapes, against 17-34% for the per-warp GEMV at 8 tokens. Below 4 tokens the per-warp GEMV
 * was as fast then; since its first weights are posted before the wait on the kernel before, this
 * form wins there too (whole V2-Lite steps of 2 / 3 tokens 3.37 / 3.91 -> 3.10 / 3.52 ms, H100,
 * 2026-12-06), hence 2 .. 16. The chunk sizes and the 112 KB budget a block were
 * measured against smaller chunks and one block an SM.
 *
 * The grouped form (gemvm_grp_kernel, MoE steps of 2+ tokens): a band is (tile, 32 rows of its
 * expert), the tile's 1-8 pairs are the 8 token slots (x rows gathered by the producer, slots past
 * the tile's pairs zero in the fragments), the y rows those of the pairs; the bands of the plan's
 * tiles (read on the device, after the wait on the plan's kernel, or before it once the plan is
 * settled: the first weights then stream while the kernel before ends) split evenly over the
 * grid. The streamed GEMV's one-token kernel keeps the tiles of one pair (faster there: V3's
 * experts at 8 tokens spread over 256 experts 728 us all here against 548 with it), this form the
 * others in place of the per-warp GEMV (H100, 2026-12-06: V3's experts at 8 / 16 / 32 / 64 tokens 548 /
 * 1054 / 2064 / 2829 us against 655 / 1269 / 2495 / 3800; a whole V2-Lite's batch-8 step 6.00 ->
 * 5.32 ms, batch 32 14.18 -> 11.70). Q5_0 (V2-Lite's experts' down, 1408 inputs) is decoded to
 * signed bytes as Q8_0's; it is taken only here.
 *
 * The weights must be 16-aligned and padded as mla_cuda_weight_bytes says (a copy ends at the
 * next 16 bytes). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <string.h>

#include <algorithm>

#include "kernels/cuda_internal.h"
#include "kernels/cuda_quant_unit.h"
#include "kernels/gemvs_cuda.h"
#include "kernels/gemvs_item.h"

extern "C" {
#include "common/mla_switch.h"
#include "kernels/quant.h"
}

namespace mlacu {

/* GM_TOK tokens an n-tile (the n of the mma); steps of up to GM_TMAX tokens take NT = 2 tiles */
constexpr int GM_ROWS = 32, GM_WARPS = 8, GM_THREADS = GM_WARPS * 32 + 32, GM_TOK = 8, GM_TMAX = 16, GM_STAGES_MAX = 6;
__host__ __device__ constexpr int gm_nt(int T) { return T > GM_TOK ? 2 : 1; }

/* UPW units (32 elements) a warp a chunk: a chunk is CE = 8 UPW 32 elements, CB bytes of a row */
template <int TY> struct gm_traits;
template <> struct gm_traits<GGML_TYPE_Q8_0> {
    static constexpr int UPW = 4, BE = 32, BB = 34, NS = 2; /* NS: the x scales a unit and token pair */
};
template <> struct gm_traits<GGML_TYPE_Q4_K> {
    static constexpr int UPW = 8, BE = 256, BB = 144, NS = 4;
};
template <> struct gm_traits<GGML_TYPE_Q6_K> {
    static constexpr int UPW = 8, BE = 256, BB = 210, NS = 6;
};
template <> struct gm_traits<GGML_TYPE_Q5_0> { /* the grouped form only (gemvm_grouped) */
    static constexpr int UPW = 4, BE = 32, BB = 22, NS = 2;
};
template <int TY> __host__ __device__ constexpr int gm_ce() { return GM_WARPS * gm_traits<TY>::UPW * 32; }
template <int TY> __host__ __device__ constexpr int gm_cb() { return gm_ce<TY>() / gm_traits<TY>::BE * gm_traits<TY>::BB; }

/* bands [0, nb0) are W's (NM matrices: W[0], W[1]), [nb0, nb) W2's (NM = 1). Grouped
 * (gemvm_grp_kernel, over a MoE plan): band b is band b % nbe of the rows of tile t0 + b / nbe's
 * expert, (n_tiles[0] - t0) nbe bands in all (t0: 0, or with multi n_tiles[1], the first tile of
 * the experts with more than one pair; nb: the host's bound, max_tiles nbe); the x side of a
 * stage holds the tile's pairs (x row sorted[tile_s + j] / x_div, y row sorted[tile_s + j]) in
 * T = 8 slots. */
struct gm_args {
    const uint8_t *W[2], *W2;
    const uint8_t *qx;
    const float4 *sx;
    float *y, *y2;
    int in, rb, out, out2, nb0, nb, nch, T, stages, seg;
    const int32_t *sorted, *tile_e, *tile_s, *tile_n, *n_tiles;
    size_t estride;
    int x_div, world, nbe;
    bool multi, settled; /* settled: the plan may be read before the wait (mla_cuda_moe_plan.settled) */
};

/* c += a b: m16n8k32 (A unsigned with UA, else signed; B signed), fragments as the PTX ISA lays
 * them out */
template <bool UA> __device__ __forceinline__ void gm_mma32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (UA)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* c += a b: m16n8k16, A unsigned, B signed */
__device__ __forceinline__ void gm_mma16u(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* A thread's activations for one unit: B fragment words (token g's elements: Q4_K / Q8_0 8 t ..
 * 8 t + 7, Q6_K 4 t .. 4 t + 3 of each half) and the scales of tokens 2 t, 2 t + 1 (s[0], s[1]
 * = d; Q4_K s[2], s[3] = d sum q; Q6_K s[2 + 2 h + k] = 32 d sum of half h's q, of token 2 t + k) */
template <int TY> struct gm_xu {
    uint32_t b[2];
    float s[gm_traits<TY>::NS];
};

/* The x side of a stage: the T tokens' int8 chunks at a stride of CE + 32 bytes, then their float4
 * unit scales at a stride of CE / 32 + 1 (strides that put a fragment load's lanes on distinct
 * banks) */
template <int TY> __host__ __device__ constexpr int gm_xst() { return gm_ce<TY>() + 32; }
template <int TY> __host__ __device__ constexpr int gm_sst() { return gm_ce<TY>() / 32 + 1; }
template <int TY> __host__ __device__ constexpr int gm_xbytes(int T) { return T * (gm_xst<TY>() + 16 * gm_sst<TY>()); }

/* unit uc of the chunk, for the n-tile of tokens tb .. tb + 7: x_s the stage's x side, laid out
 * for T tokens, of which the first tv hold this stage's rows (the others are zeros here) */
template <int TY>
__device__ __forceinline__ void gm_load_x(const uint8_t *x_s, int T, int tv, int uc, int tb, int g, int t,
                                          gm_xu<TY> &x) {
    g += tb; /* tb: the n-tile's first token */
    x.b[0] = x.b[1] = 0;
#pragma unroll
    for (int i = 0; i < gm_traits<TY>::NS; i++) x.s[i] = 0.f;
    if (g < tv) {
        const uint8_t *p = x_s + g * gm_xst<TY>() + uc * 32;
        if constexpr (TY == GGML_TYPE_Q6_K) {
            x.b[0] = gs_ld<uint32_t>(p + 4 * t);
            x.b[1] = gs_ld<uint32_t>(p + 16 + 4 * t);
        } else {
            const uint2 v = gs_ld<uint2>(p + 8 * t);
            x.b[0] = v.x, x.b[1] = v.y;
        }
    }
    const float4 *sx = (const float4 *)(x_s + T * gm_xst<TY>());
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int tok = tb + 2 * t + k;
        if (tok >= tv) continue;
        const float4 f = sx[tok * gm_sst<TY>() + uc];
        x.s[k] = f.x;
        if constexpr (TY == GGML_TYPE_Q4_K) x.s[2 + k] = f.y + f.z;
        if constexpr (TY == GGML_TYPE_Q6_K) x.s[2 + k] = 32.f * f.y, x.s[4 + k] = 32.f * f.z;
    }
}

/* The scales of one row for the warp's UPW units, decoded once a stage by the lane that owns the
 * row (lane = row of the band) and handed to the fragment lanes by shuffles: Q8_0 d; Q4_K d s and
 * dmin m; Q6_K d s16 of each half h (f[2 i + h]) */
template <int TY> __host__ __device__ constexpr bool gm_q32() { return TY == GGML_TYPE_Q8_0 || TY == GGML_TYPE_Q5_0; } /* 32-element blocks */
template <int TY> struct gm_rs {
    float f[gm_q32<TY>() ? gm_traits<TY>::UPW : 2 * gm_traits<TY>::UPW];
};
template <int TY> __device__ __forceinline__ void gm_row_scales(const uint8_t *pr, int warp, gm_rs<TY> &rs) {
    if constexpr (gm_q32<TY>()) { /* Q8_0, Q5_0: d first in each block */
#pragma unroll
        for (int i = 0; i < gm_traits<TY>::UPW; i++)
            rs.f[i] = __half2float(gs_ld<__half>(pr + gm_traits<TY>::BB * (warp * gm_traits<TY>::UPW + i)));
    } else if constexpr (TY == GGML_TYPE_Q4_K) { /* sub-blocks j0 .. j0 + UPW - 1 of one block */
        constexpr int UPW = gm_traits<TY>::UPW;
        const int u0 = warp * UPW, j0 = u0 & 7;
        const uint8_t *b = pr + 144 * (u0 >> 3);
        const uint32_t s0 = gs_ld<uint32_t>(b + 4), s1 = gs_ld<uint32_t>(b + 8), s2 = gs_ld<uint32_t>(b + 12);
        const float2 dm = __half22float2(gs_ld<__half2>(b));
#pragma unroll
        for (int q = 0; q < UPW / 4; q++) { /* the 6-bit scales and minima of four sub-blocks, a byte each */
            uint32_t sc, m;
            if (j0 + 4 * q == 0) {
                sc = s0 & 0x3F3F3F3Fu, m = s1 & 0x3F3F3F3Fu;
            } else {
                sc = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
                m = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
                rs.f[4 * q + i] = dm.x * (float)((sc >> (8 * i)) & 0xFFu),
                rs.f[UPW + 4 * q + i] = dm.y * (float)((m >> (8 * i)) & 0xFFu);
        }
    } else { /* the warp's UPW / 4 halves of a block: their 16-element scales */
        constexpr int UPW = gm_traits<TY>::UPW;
        const int u0 = warp * UPW;
        const uint8_t *b = pr + 210 * (u0 >> 3);
        const float d = __half2float(gs_ld<__half>(b + 208));
#pragma unroll
        for (int k = 0; k < 2 * UPW; k++) rs.f[k] = d * (float)(int8_t)b[192 + 2 * (u0 & 7) + k];
    }
}

/* acc[nt][0..3] (row ra: tokens 8 nt + 2t, 8 nt + 2t + 1; row ra + 8 likewise) += the warp's
 * units of the row segments at pa (row ra = g of a tile) and pb (ra + 8) dotted with x; n: how
 * many of the UPW units the chunk holds. The NT n-tiles (8 tokens each) share the A fragments. */
template <int TY, int NT>
__device__ __forceinline__ void gm_tile(const uint8_t *pa, const uint8_t *pb, int ra, int warp, int t, int n,
                                        const uint8_t *x_s, int T, int tv, const gm_rs<TY> &rs, float (&acc)[NT][4]) {
    const int g = ra & 7;
    gm_xu<TY> x[gm_traits<TY>::UPW][NT]; /* each unit's activations, loaded where it is first used */
    auto epi = [&](const int (&c)[4], float fa, float fb, float xs0, float xs1, float &a0, float &a1, float &a2,
                   float &a3) {
        a0 = fmaf((float)c[0], fa * xs0, a0);
        a1 = fmaf((float)c[1], fa * xs1, a1);
        a2 = fmaf((float)c[2], fb * xs0, a2);
        a3 = fmaf((float)c[3], fb * xs1, a3);
    };
    if constexpr (gm_q32<TY>()) { /* Q8_0; Q5_0's elements made signed bytes as Q8_0's (gs_q5_0_bytes8) */
#pragma unroll
        for (int i = 0; i < gm_traits<TY>::UPW; i++) {
            if (i >= n) break;
            const int uc = warp * gm_traits<TY>::UPW + i;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) gm_load_x<TY>(x_s, T, tv, uc, GM_TOK * nt, g, t, x[i][nt]);
            uint32_t wa[2], wb[2];
            if constexpr (TY == GGML_TYPE_Q5_0) {
                gs_q5_0_bytes8(pa + 22 * uc, t, wa);
                gs_q5_0_bytes8(pb + 22 * uc, t, wb);
            } else {
                gs_words<2>(pa + 34 * uc + 2 + 8 * t, wa);
                gs_words<2>(pb + 34 * uc + 2 + 8 * t, wb);
            }
            const uint32_t a[4] = {wa[0], wb[0], wa[1], wb[1]};
            const float fa = __shfl_sync(0xffffffffu, rs.f[i], ra), fb = __shfl_sync(0xffffffffu, rs.f[i], ra + 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int c[4] = {0, 0, 0, 0};
                gm_mma32<false>(c, a, x[i][nt].b[0], x[i][nt].b[1]);
                epi(c, fa, fb, x[i][nt].s[0], x[i][nt].s[1], acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
            }
        }
    } else if constexpr (TY == GGML_TYPE_Q4_K) {
        constexpr int UPW = gm_traits<TY>::UPW;
        const int sb = (warp * UPW) >> 3, jp0 = ((warp * UPW) & 7) >> 1;
#pragma unroll
        for (int ip = 0; ip < UPW / 2; ip++) { /* sub-blocks 2 ip, 2 ip + 1 of the warp's: one byte pair */
            if (2 * ip >= n) break;
            const uint2 qa = gs_ld<uint2>(pa + 144 * sb + 16 + 32 * (jp0 + ip) + 8 * t);
            const uint2 qb = gs_ld<uint2>(pb + 144 * sb + 16 + 32 * (jp0 + ip) + 8 * t);
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int i = 2 * ip + hi, sh = 4 * hi;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) gm_load_x<TY>(x_s, T, tv, warp * UPW + i, GM_TOK * nt, g, t, x[i][nt]);
                const uint32_t a[4] = {(qa.x >> sh) & 0x0F0F0F0Fu, (qb.x >> sh) & 0x0F0F0F0Fu,
                                       (qa.y >> sh) & 0x0F0F0F0Fu, (qb.y >> sh) & 0x0F0F0F0Fu};
                const float fa = __shfl_sync(0xffffffffu, rs.f[i], ra), fb = __shfl_sync(0xffffffffu, rs.f[i], ra + 8);
                const float ma = __shfl_sync(0xffffffffu, rs.f[UPW + i], ra),
                            mb = __shfl_sync(0xffffffffu, rs.f[UPW + i], ra + 8);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const gm_xu<TY> &xu = x[i][nt];
                    float(&ac)[4] = acc[nt];
                    int c[4] = {0, 0, 0, 0};
                    gm_mma32<true>(c, a, xu.b[0], xu.b[1]);
                    epi(c, fa, fb, xu.s[0], xu.s[1], ac[0], ac[1], ac[2], ac[3]);
                    ac[0] = fmaf(-ma, xu.s[2], ac[0]);
                    ac[1] = fmaf(-ma, xu.s[3], ac[1]);
                    ac[2] = fmaf(-mb, xu.s[2], ac[2]);
                    ac[3] = fmaf(-mb, xu.s[3], ac[3]);
                }
            }
        }
    } else { /* Q6_K: the warp's units are UPW / 4 halves of a block, four units each; each unit
              * two 16-element halves h */
        constexpr int UPW = gm_traits<TY>::UPW;
        const int u0 = warp * UPW, sb = u0 >> 3;
#pragma unroll
        for (int nh = 0; nh < UPW / 4; nh++) {
            const int n = ((u0 & 7) >> 2) + nh;
            uint32_t ql[2][2][2], qh[2][2]; /* [row][h][ql low units 0, 2 / 1, 3] */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint8_t *b = (r ? pb : pa) + 210 * sb;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    gs_words<1>(b + 64 * n + 16 * h + 4 * t, &ql[r][h][0]);
                    gs_words<1>(b + 64 * n + 32 + 16 * h + 4 * t, &ql[r][h][1]);
                    gs_words<1>(b + 128 + 32 * n + 16 * h + 4 * t, &qh[r][h]);
                }
            }
#pragma unroll
            for (int i4 = 0; i4 < 4; i4++) {
                const int i = 4 * nh + i4;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) gm_load_x<TY>(x_s, T, tv, u0 + i, GM_TOK * nt, g, t, x[i][nt]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t q[2];
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        q[r] = ((ql[r][h][i4 & 1] >> (4 * (i4 >> 1))) & 0x0F0F0F0Fu) |
                               (((qh[r][h] >> (2 * i4)) & 0x03030303u) << 4);
                    const float fa = __shfl_sync(0xffffffffu, rs.f[2 * i + h], ra),
                                fb = __shfl_sync(0xffffffffu, rs.f[2 * i + h], ra + 8);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const gm_xu<TY> &xu = x[i][nt];
                        int c[4] = {0, 0, 0, 0};
                        gm_mma16u(c, q[0], q[1], xu.b[h]);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[nt][e] = fmaf(e < 2 ? fa : fb,
                                              fmaf((float)c[e], xu.s[e & 1], -xu.s[2 + 2 * h + (e & 1)]), acc[nt][e]);
                    }
                }
            }
        }
    }
}

/* NT n-tiles of 8 tokens: 1 for steps of up to 8 tokens, 2 for 9 .. 16 (one block an SM: the
 * stages' x side is twice as large). GRP: over a MoE plan (gm_args), NT = 1. */
template <int TY, int NM, int NT, bool GRP> __device__ __forceinline__ void gm_body(const gm_args &A) {
    using Q = gm_traits<TY>;
    constexpr int CE = gm_ce<TY>(), CB = gm_cb<TY>();
    extern __shared__ __align__(16) uint8_t gm_sm[];
    __shared__ uint64_t full[GM_STAGES_MAX], empty[GM_STAGES_MAX];
    const int NS = A.stages, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t msb = (size_t)GM_ROWS * A.seg, sb = NM * msb + gm_xbytes<TY>(A.T);
    float *red = (float *)(gm_sm + (size_t)NS * sb); /* [GM_WARPS][NM][2][NT][4][32] */
    if (tid == 0) {
        for (int s = 0; s < NS; s++) mlacu_mbar_init(&full[s], 1), mlacu_mbar_init(&empty[s], GM_WARPS);
        mlacu_mbar_init_fence();
    }
    __syncthreads();
    /* grouped: the plan (made by a kernel before) says how many bands there are: every thread
     * waits here, once, unless the plan is settled (mla_cuda_moe_plan.settled); else, as a dense
     * product, the producer after posting its first weights, the consumers before their first
     * stage */
    const bool late = GRP && !A.settled;
    if (late) mlacu_pdl_enter();
    const int t0 = GRP && A.multi ? A.n_tiles[1] : 0; /* grouped: the first tile */
    const int nb = GRP ? (A.n_tiles[0] - t0) * A.nbe : A.nb;
    const int b0 = (int)((int64_t)blockIdx.x * nb / gridDim.x), b1 = (int)((int64_t)(blockIdx.x + 1) * nb / gridDim.x);
    const int nk = (b1 - b0) * A.nch;
    /* band b: matrix m's rows row0 .. row0 + rows - 1, where its sums go (y, out rows), the
     * tokens (pairs) of its stages, tv, and (grouped) where their ids start in the plan, s0 */
    struct gm_band {
        const uint8_t *w;
        float *y;
        int row0, rows, out, tv, s0;
    };
    auto band = [&](int b, int m) {
        gm_band d;
        if constexpr (GRP) {
            const int tile = t0 + b / A.nbe;
            d.w = A.W[m] + (size_t)(A.tile_e[tile] / A.world) * A.estride, d.y = A.y, d.out = A.out;
            d.row0 = (b % A.nbe) * GM_ROWS;
            d.tv = A.tile_n[tile], d.s0 = A.tile_s[tile];
        } else {
            const bool two = b >= A.nb0;
            d.w = two ? A.W2 : A.W[m], d.y = two ? A.y2 : A.y, d.out = two ? A.out2 : A.out;
            d.row0 = (two ? b - A.nb0 : b) * GM_ROWS;
            d.tv = A.T, d.s0 = 0;
        }
        d.rows = min(GM_ROWS, d.out - d.row0);
        return d;
    };
    if (warp == GM_WARPS) { /* ---- the producer: lane i copies row i (of each matrix) of a stage */
        /* stage k: the expected bytes and the weights' copies (x: after the wait on the kernel
         * before, from lanes 0 .. T - 1 (int8 rows) and TL .. TL + T - 1 (their scales), TL = 8 NT) */
        auto post_w = [&](int k) {
            const int b = b0 + k / A.nch, c = k % A.nch;
            const uint8_t *src[NM];
            uint32_t bytes[NM], all = 0;
            int tv = A.T;
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const gm_band d = band(b, m);
                tv = d.tv;
                bytes[m] = 0, src[m] = nullptr;
                if (lane < d.rows) {
                    const uint8_t *s0 = d.w + (size_t)(d.row0 + lane) * A.rb + (size_t)c * CB;
                    const int n = min(CB, A.rb - c * CB);
                    src[m] = (const uint8_t *)((uintptr_t)s0 & ~(uintptr_t)15);
                    bytes[m] = (uint32_t)(((uintptr_t)(s0 + n) + 15) / 16 * 16 - (uintptr_t)src[m]);
                }
                all += bytes[m];
            }
            all = __reduce_add_sync(0xffffffffu, all);
            const int nx = min(CE, A.in - c * CE);
            uint64_t *bar = &full[k % NS];
            if (lane == 0) mlacu_mbar_expect(bar, all + (uint32_t)(tv * (nx + nx / 2)));
            __syncwarp();
            uint8_t *dst = gm_sm + (size_t)(k % NS) * sb + (size_t)lane * A.seg;
#pragma unroll
            for (int m = 0; m < NM; m++)
                if (bytes[m]) mlacu_bulk_g2s(dst + m * msb, src[m], bytes[m], bar);
        };
        auto post_x = [&](int k) {
            constexpr int TL = GM_TOK * NT;
            const int c = k % A.nch, nx = min(CE, A.in - c * CE), tok = lane & (TL - 1);
            const gm_band d = band(b0 + k / A.nch, 0);
            if (tok >= d.tv || lane >= 2 * TL) return;
            const size_t xr = GRP ? (size_t)(A.sorted[d.s0 + tok] / A.x_div) : (size_t)tok; /* x row */
            uint8_t *xs = gm_sm + (size_t)(k % NS) * sb + NM * msb;
            uint64_t *bar = &full[k % NS];
            if (lane < TL)
                mlacu_bulk_g2s(xs + tok * gm_xst<TY>(), A.qx + xr * A.in + (size_t)c * CE, (uint32_t)nx, bar);
            else
                mlacu_bulk_g2s(xs + A.T * gm_xst<TY>() + tok * 16 * gm_sst<TY>(),
                               A.sx + xr * (A.in / 32) + (size_t)c * (CE / 32), (uint32_t)(nx / 2), bar);
        };
        int pre = 0; /* weights only before the wait on the kernel before (unless late: past it) */
        for (; pre < NS && pre < nk; pre++) post_w(pre);
        if (!late) mlacu_pdl_enter();
        for (int k = 0; k < pre; k++) post_x(k);
        for (int k = pre; k < nk; k++) {
            mlacu_mbar_wait(&empty[k % NS], (uint32_t)(k / NS - 1) & 1u); /* stage k - NS done */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            post_w(k);
            post_x(k);
        }
        return;
    }
    /* ---- the consumers (late: past the wait already) */
    if (!late) mlacu_pdl_enter();
    const int g = lane >> 2, t = lane & 3;
    float acc[NM][2][NT][4];
    auto zero = [&] {
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[m][mt][nt][i] = 0.f;
    };
    zero();
    for (int k = 0, b = b0, c = 0, buf = 0, ph = 0; k < nk; k++) { /* stage k: band b, chunk c, buffer buf */
        const int nu = min(CE, A.in - c * CE) / 32; /* units of this chunk */
        mlacu_mbar_wait(&full[buf], (uint32_t)ph);
        const uint8_t *st = gm_sm + (size_t)buf * sb;
        const int n = min(Q::UPW, nu - warp * Q::UPW); /* of the warp's units (whole groups of 4 for the K types) */
        int tv = A.T;
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const gm_band d = band(b, m);
            tv = d.tv;
            /* where row r's segment starts in its slot (the copy began 16-aligned below: only the low
             * bits of its address count; Q4_K rows and chunks are whole 16 bytes) */
            const uint32_t o0 = (uint32_t)(uintptr_t)d.w + (uint32_t)d.row0 * (uint32_t)A.rb + (uint32_t)c * CB;
            auto row_at = [&](int r) {
                const uint32_t o = TY == GGML_TYPE_Q4_K ? 0u : (o0 + (uint32_t)r * (uint32_t)A.rb) & 15u;
                return st + m * msb + r * A.seg + o;
            };
            if (n <= 0) continue;
            gm_rs<TY> rs;
            gm_row_scales<TY>(row_at(lane), warp, rs);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int ra = mt * 16 + g;
                gm_tile<TY, NT>(row_at(ra), row_at(ra + 8), ra, warp, t, n, st + NM * msb, A.T, tv, rs, acc[m][mt]);
            }
        }
        __syncwarp();
        if (lane == 0) mlacu_mbar_arrive(&empty[buf]);
        if (++buf == NS) buf = 0, ph ^= 1;
        if (++c < A.nch) continue;
        c = 0;
        /* the band is done: the warps' sums meet in red, a thread a (tile, register, lane) adds
         * them in warp order for each n-tile and stores the row and token they hold */
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        red[((((warp * NM + m) * 2 + mt) * NT + nt) * 4 + i) * 32 + lane] = acc[m][mt][nt][i];
        zero();
        asm volatile("bar.sync 1, %0;\n" ::"r"(GM_WARPS * 32) : "memory");
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int mt = tid >> 7, i = (tid >> 5) & 3, ln = tid & 31;
            float s[2] = {0.f, 0.f};
#pragma unroll
            for (int m = 0; m < NM; m++)
                for (int wp = 0; wp < GM_WARPS; wp++)
                    s[m] += red[((((wp * NM + m) * 2 + mt) * NT + nt) * 4 + i) * 32 + ln];
            const gm_band d = band(b, 0);
            const int r = mt * 16 + (ln >> 2) + 8 * (i >> 1), tok = GM_TOK * nt + 2 * (ln & 3) + (i & 1);
            if (r < d.rows && tok < d.tv) {
                const size_t yr = GRP ? (size_t)A.sorted[d.s0 + tok] : (size_t)tok; /* grouped: the pair's row */
                d.y[yr * d.out + d.row0 + r] = NM == 2 ? mlacu_swiglu(s[0], s[NM - 1]) : s[0];
            }
        }
        asm volatile("bar.sync 1, %0;\n" ::"r"(GM_WARPS * 32) : "memory");
        b++;
    }
}

template <int TY, int NM, int NT>
__global__ void __launch_bounds__(GM_THREADS, NT == 1 ? 2 : 1) gemvm_kernel(const gm_args A) {
    gm_body<TY, NM, NT, false>(A);
}
/* the experts of a MoE plan: every tile (or those of the experts with more than one pair), 1 .. 8
 * pairs each, as the 8 tokens of a dense step */
template <int TY, int NM> __global__ void __launch_bounds__(GM_THREADS, 1) gemvm_grp_kernel(const gm_args A) {
    gm_body<TY, NM, 1, true>(A);
}

/* ---------------------------------------------------------------- host */
/* shared memory a block of one n-tile aims at (two blocks an SM): 112 KB, or MLA_CUDA_GM=KB
 * (32-220; a developer switch of common/mla_switch.c: for measurements) */
static int gm_budget() {
    static const int v = (int)mla_sw_int(MLA_SW_CUDA_GM) << 10;
    return v;
}

/* the dynamic shared memory a block of nt n-tiles may have here: two tiles may take all but 4 KB
 * of what the device allows a block (Q6_K's two stages of 16 tokens need 221 KB), and so may the
 * grouped kernel (grp: one block an SM, so that gate and up of Q4_K experts, 215 KB, fit) */
static int64_t gm_smem_limit(int nt, bool grp = false) {
    return nt == 1 && !grp ? std::min(200 << 10, mlacu_smem_optin() - (4 << 10)) : mlacu_smem_optin() - (4 << 10);
}

struct gm_geo {
    int ce, seg, stages; /* ce: elements a chunk */
    size_t smem;
};

template <typename F> static cudaError_t gm_with_type(uint32_t t, F f) {
    switch (t) {
    case GGML_TYPE_Q4_K: return f(std::integral_constant<int, GGML_TYPE_Q4_K>{});
    case GGML_TYPE_Q6_K: return f(std::integral_constant<int, GGML_TYPE_Q6_K>{});
    case GGML_TYPE_Q8_0: return f(std::integral_constant<int, GGML_TYPE_Q8_0>{});
    case GGML_TYPE_Q5_0: return f(std::integral_constant<int, GGML_TYPE_Q5_0>{});
    default: return cudaErrorNotSupported;
    }
}

/* the geometry for T tokens (the x side of a stage holds T rows; gm_nt(T) n-tiles); grp: for the
 * grouped kernel (T = 8), the only one that takes Q5_0 */
static bool gm_plan(uint32_t t, int64_t in, int nm, int T, gm_geo &g, bool grp = false) {
    const int nt = gm_nt(T);
    if (t == GGML_TYPE_Q5_0 && !grp) return false;
    int cb = 0, be = 0, xb = 0;
    if (gm_with_type(t, [&](auto ty) {
            constexpr int TY = decltype(ty)::value;
            cb = gm_cb<TY>(), be = gm_traits<TY>::BE, xb = gm_xbytes<TY>(T), g.ce = gm_ce<TY>();
            return cudaSuccess;
        }) != cudaSuccess)
        return false;
    if (in <= 0 || in % be || in > (1 << 24) || (nm != 1 && nm != 2)) return false;
    /* a row segment's slot: the chunk, the 16-aligned start below it, 4 bytes of word reads past
     * it; an odd number of 16 bytes */
    g.seg = (cb + 32 + 15) / 16;
    if (g.seg % 2 == 0) g.seg++;
    g.seg *= 16;
    /* as many stages as the budget holds, at least 2, and never past what a block may have (so
     * that fewer tokens of as many n-tiles, whose stages are smaller, always fit where 8 or 16 do).
     * Two n-tiles: one block an SM (two stages of 16 tokens pass 112 KB for every type), whose
     * budget is all it may have */
    const size_t stage = (size_t)nm * GM_ROWS * g.seg + xb,
                 red = (size_t)GM_WARPS * nm * 2 * nt * 4 * 32 * sizeof(float);
    const int64_t limit = gm_smem_limit(nt, grp), budget = nt == 1 ? gm_budget() : limit,
                  fit = (budget - (int64_t)red) / (int64_t)stage, most = (limit - (int64_t)red) / (int64_t)stage;
    g.stages = (int)std::min<int64_t>({GM_STAGES_MAX, most, std::max<int64_t>(2, fit)});
    g.smem = g.stages * stage + red;
    return g.stages >= 2;
}

bool gemvm_supported(uint32_t t, int64_t in, int nm, int64_t T) {
    gm_geo g;
    /* fewer tokens of as many n-tiles take less shared memory: asked at 8 or 16 */
    return T >= 1 && T <= GM_TMAX && gm_plan(t, in, nm, GM_TOK * gm_nt((int)T), g);
}
bool gemvm_grouped_supported(uint32_t t, int64_t in, int nm) {
    gm_geo g;
    return gm_plan(t, in, nm, GM_TOK, g, true);
}

template <int TY, int NM, int NT, bool GRP = false>
static cudaError_t gm_launch(const gm_args &A, const gm_geo &g, cudaStream_t s) {
    auto kern = [] {
        if constexpr (GRP) return gemvm_grp_kernel<TY, NM>;
        else return gemvm_kernel<TY, NM, NT>;
    }();
    static bool attr = false;
    if (!attr) {
        cudaError_t err = mlacu_smem_allow(kern, (int)gm_smem_limit(NT, GRP));
        if (err != cudaSuccess) return err;
        attr = true;
    }
    int bps = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, GM_THREADS, g.smem);
    if (err != cudaSuccess) return err;
    const int64_t grid = std::min<int64_t>(A.nb, (int64_t)mlacu_sm_count() * std::max(1, bps));
    if (grid <= 0) return cudaSuccess;
    mlacu_launch(kern, (unsigned)grid, GM_THREADS, g.smem, s, A);
    return cudaGetLastError();
}

static gm_args gm_base(uint32_t t, int64_t in, int64_t out, const void *qx, const void *sx, int64_t T, float *y,
                       const gm_geo &g) {
    gm_args A = {};
    A.qx = (const uint8_t *)qx, A.sx = (const float4 *)sx, A.y = y;
    A.in = (int)in, A.rb = (int)ggml_row_bytes(t, in), A.out = (int)out, A.T = (int)T;
    A.nb0 = A.nb = (int)((out + GM_ROWS - 1) / GM_ROWS);
    A.stages = g.stages, A.seg = g.seg, A.nch = (int)((in + g.ce - 1) / g.ce);
    return A;
}

cudaError_t gemvm_dense(uint32_t t, const void *w, const void *w1, int64_t in, int64_t out, const void *qx,
                        const void *sx, int64_t T, float *y, cudaStream_t s) {
    const int nm = w1 ? 2 : 1;
    gm_geo g;
    if (T < 2 || T > GM_TMAX || out < 1 || out > INT32_MAX - GM_ROWS || !gm_plan(t, in, nm, (int)T, g))
        return cudaErrorNotSupported;
    gm_args A = gm_base(t, in, out, qx, sx, T, y, g);
    A.W[0] = (const uint8_t *)w, A.W[1] = (const uint8_t *)(w1 ? w1 : w);
    return gm_with_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        if constexpr (TY == GGML_TYPE_Q5_0) return cudaErrorNotSupported; /* gm_plan said no */
        else if (T > GM_TOK) return w1 ? gm_launch<TY, 2, 2>(A, g, s) : gm_launch<TY, 1, 2>(A, g, s);
        else return w1 ? gm_launch<TY, 2, 1>(A, g, s) : gm_launch<TY, 1, 1>(A, g, s);
    });
}

cudaError_t gemvm_dense_pair(uint32_t t, const void *wa, int64_t out_a, float *ya, const void *wb, int64_t out_b,
                             float *yb, int64_t in, const void *qx, const void *sx, int64_t T, cudaStream_t s) {
    gm_geo g;
    if (T < 2 || T > GM_TMAX || out_a < 1 || out_b < 1 || out_a + out_b > INT32_MAX - 2 * GM_ROWS ||
        !gm_plan(t, in, 1, (int)T, g))
        return cudaErrorNotSupported;
    gm_args A = gm_base(t, in, out_a, qx, sx, T, ya, g);
    A.W[0] = A.W[1] = (const uint8_t *)wa;
    A.W2 = (const uint8_t *)wb, A.out2 = (int)out_b, A.y2 = yb;
    A.nb = A.nb0 + (int)((out_b + GM_ROWS - 1) / GM_ROWS);
    return gm_with_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        if constexpr (TY == GGML_TYPE_Q5_0) return cudaErrorNotSupported; /* gm_plan said no */
        else return T > GM_TOK ? gm_launch<TY, 1, 2>(A, g, s) : gm_launch<TY, 1, 1>(A, g, s);
    });
}

cudaError_t gemvm_grouped(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                          const void *qx, const void *sx, int x_div, const mla_cuda_moe_plan *pl, bool multi, float *y,
                          cudaStream_t s) {
    gm_geo g;
    const int nm = w1 ? 2 : 1;
    const int64_t nbe = (out + GM_ROWS - 1) / GM_ROWS;
    if (out < 1 || out > INT32_MAX - GM_ROWS || pl->max_tiles < 1 || pl->max_tiles * nbe > INT32_MAX || x_div < 1 ||
        !gm_plan(t, in, nm, GM_TOK, g, true))
        return cudaErrorNotSupported;
    gm_args A = gm_base(t, in, out, qx, sx, GM_TOK, y, g);
    A.W[0] = (const uint8_t *)w0, A.W[1] = (const uint8_t *)(w1 ? w1 : w0);
    A.sorted = pl->sorted, A.tile_e = pl->tile_e, A.tile_s = pl->tile_s, A.tile_n = pl->tile_n, A.n_tiles = pl->n_tiles;
    A.estride = estride, A.x_div = x_div, A.world = pl->world, A.multi = multi, A.settled = pl->settled;
    A.nbe = (int)nbe, A.nb = (int)(pl->max_tiles * nbe); /* the grid's bound; the kernel reads the plan's */
    return gm_with_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        return w1 ? gm_launch<TY, 2, 1, true>(A, g, s) : gm_launch<TY, 1, 1, true>(A, g, s);
    });
}

} // namespace mlacu
