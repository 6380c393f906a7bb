/* wgmma_cuda: Q4_K, Q8_0 and Q5_0 weights x fp16 activations on the warpgroup tensor cores (sm_90a);
 * see wgmma_cuda.h.
 *
 * A block owns R = 128 MT weight rows and a tile of NT tokens (16, 32, 64 or 128), with three warpgroups:
 * two consumers (each MT tiles of 64 rows) and one producer. wgmma m64nNTk16 takes A (64 weight
 * rows x 16) from registers and B (16 x NT tokens) from shared memory:
 * - W never goes through shared memory as fp16: each consumer thread dequantizes its own A
 *   fragment (rows g and g + 8 of its warp's 16, columns 2t, 2t + 1, 2t + 8, 2t + 9 of each k16
 *   step) from the raw Q4_K bytes: per row and stage (128 elements, half a block) the block's
 *   16-byte header and its 64 bytes of nibbles. The four bytes a thread needs for a k16 step (2t,
 *   2t + 1, 2t + 8, 2t + 9 of a 16-byte half) come from two 32-bit reads and one byte_perm; the
 *   low nibbles are one sub-block's step, the high ones the next sub-block's. Nibbles to fp16
 *   exactly (0x64XX is 1024 + XX), then (q - 1024) d1 - m1 with d1 = d sc and m1 = dmin m rounded
 *   to fp16: the same values as the mma.sync kernel's deq_h.
 * - Q8_0: a stage's 128 elements are four 34-byte blocks (136 bytes) at 136 s in the row: the
 *   producer copies the 16-aligned window of 144 bytes around them (rows 16-aligned: in a
 *   multiple of 256; the window starts 8 bytes early on odd stages). A thread's four bytes of a
 *   k16 step are two 2-byte reads (2t, 2t + 1 and 2t + 8, 2t + 9 of the step's 16), its rows'
 *   block scales one 2-byte read each; (q + 128) to fp16 exactly, minus 1152, times d: the
 *   mma.sync kernel's values again. No scale pass (the block's d is already an fp16).
 * - Q5_0 (a Q4_K_M file's rows whose length is not a multiple of 256, e.g. V2-Lite's expert down
 *   products of 1408): a stage's four 22-byte blocks are 88 bytes at 88 s in the row, rows 8-byte
 *   aligned (in a multiple of 128), copied in 8-byte pieces. A thread's k16 step: the nibbles as
 *   Q4_K's (qs bytes 2t, 2t + 1, 2t + 8, 2t + 9, low nibbles then high), each byte's fifth bit from
 *   qh (bits 2t, 2t + 1, 2t + 8, 2t + 9, + 16 for the high nibbles) spread into the bytes by one
 *   multiply; (q + 1024) to fp16 exactly, minus 1040, times d: the mma.sync kernel's values.
 * - x rows (gathered by the plan) land in the K-major layout with the 128-byte swizzle: per stage
 *   two k-blocks of 64 elements, NT rows of 128 bytes each, 16-byte chunk c of row n at chunk
 *   c ^ (n % 8); descriptor SBO 1024 (8 rows), a k16 step 32 bytes further.
 * - The scales (Q4_K): each consumer warp decodes its 16 rows' four sub-blocks of a stage once
 *   into shared memory as (d1, d1) and (-m1, -m1) pairs (lane -> one row, two sub-blocks).
 * - Warp specialization: the producer warpgroup only issues the cp.async copies of each stage
 *   (ST buffers of 128 elements: four; three for Q8_0's tiles of 256 rows x 128 tokens and 128 x
 *   64). Buffers pass by mbarriers: full[b] completes when the producer's copies into b have
 *   landed (each producer thread's cp.async.mbarrier.arrive.noinc, 128 arrivals), empty[b] when
 *   the 256 consumer threads are done with it (an arrival each once the stage's wgmmas have
 *   completed, which the next stage's first wait_group shows). No block
 *   barrier and no wait_group 0 a stage: the tensor cores are fed across stage boundaries (the
 *   form without a producer, a block barrier a stage, took 18-25% longer; H200, 2026-11-30). A
 *   consumer makes the landed copies visible to wgmma's proxy (fence.proxy.async) after its wait
 *   on full[b]. The producer gives up registers (setmaxnreg) to the consumers, whose 128 x 256
 *   tiles keep 128 accumulators a thread.
 * Checked against the CPU in mla-gpu-check (--wg: every tile shape, a one-hot layout probe,
 * experts with TP ranks). */
#include "kernels/wgmma_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_internal.h"
extern "C" {
#include "common/ggml_types.h"
}

namespace {

constexpr int WG_KS = 128; /* K elements a stage: half a Q4_K block, four Q8_0 blocks */
/* a row's decoded scales a stage (Q4_K): four sub-blocks of (d1, d1 | -m1, -m1), 8 bytes each,
 * and 16 of padding (eight rows read at once fall in distinct banks) */
constexpr int WG_SCR = 48;
constexpr int WG_THREADS = 384; /* two consumer warpgroups, one producer */
constexpr int WG_Q4K = GGML_TYPE_Q4_K, WG_Q80 = GGML_TYPE_Q8_0, WG_Q50 = GGML_TYPE_Q5_0;

/* a row's raw bytes a stage in shared memory, in copies of CB bytes: Q4_K the block's header (16)
 * and half its nibbles (64); Q8_0 the 144-byte window around its four blocks; Q5_0 its four
 * blocks (88, in 8-byte copies: its rows are 8-byte aligned only) */
template <int TY> struct wg_raw;
template <> struct wg_raw<WG_Q4K> {
    static constexpr int RSB = 80, CB = 16;
};
template <> struct wg_raw<WG_Q80> {
    static constexpr int RSB = 144, CB = 16;
};
template <> struct wg_raw<WG_Q50> {
    static constexpr int RSB = 88, CB = 8;
};

/* A block's shapes and resources. Registers: setmaxnreg moves them within the block's own
 * allocation, R0 a thread at launch (what __launch_bounds__ leaves: 168 for one block an SM, 80 for
 * two, as tiles of 128 rows and up to 64 tokens take): the producer's release must cover the
 * consumers' request, or setmaxnreg.inc waits for ever. */
template <int NT, int MT, int TY> struct wg_geo {
    static constexpr int R = 2 * MT * 64;                   /* weight rows a block */
    static constexpr int XB = NT * WG_KS * 2;               /* x bytes a stage (two k-blocks of NT x 128 B) */
    static constexpr int RSB = wg_raw<TY>::RSB;
    static_assert(RSB % wg_raw<TY>::CB == 0, "whole copies a row");
    static constexpr int WB = R * RSB;                      /* W bytes a stage */
    static constexpr int SB = (XB + WB + 1023) / 1024 * 1024; /* a stage, 1024-aligned (the swizzle's unit) */
    static constexpr int SCW = TY == WG_Q4K ? MT * 16 * WG_SCR : 0; /* a consumer warp's decoded scales */
    static constexpr int MINB = MT == 1 && NT <= 64 ? 2 : 1; /* blocks an SM */
    /* what a block may have at MINB blocks an SM (228 KB, 1 KB of each block reserved) */
    static constexpr size_t CAP = MINB == 2 ? 115712 : 232448;
    static constexpr size_t FIX = (size_t)8 * SCW + 2 * NT * 4 + 1024;
    /* buffers: four, or three where four do not fit (Q8_0's wider rows at 256 x 128 and 128 x 64) */
    static constexpr int ST = (size_t)4 * SB + FIX + 4 * 16 <= CAP ? 4 : 3;
    /* stages, scales, xrow and yrow, the full and empty mbarriers, 1024 of alignment */
    static constexpr size_t SMEM = (size_t)ST * SB + FIX + 2 * ST * 8;
    static_assert(SMEM <= CAP && (TY != WG_Q4K || ST == 4), "the block's shared memory");
    static constexpr int R0 = 65536 / (MINB * WG_THREADS) / 8 * 8;
    static constexpr int PREGS = MINB == 2 ? 40 : 56, CREGS = MINB == 2 ? 96 : 224; /* producer, consumer */
    static_assert(128 * PREGS + 256 * CREGS <= WG_THREADS * R0 && PREGS <= R0 && CREGS >= R0, "registers within the block's");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* wgmma m64nNTk16, A (fp16) from registers, B (fp16, K-major) by descriptor, fp32 accumulators d
 * (D := A B + D) */
template <int NT> struct wg_mma;
template <> struct wg_mma<16> {
    static __device__ __forceinline__ void run(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7}, "
            "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <> struct wg_mma<32> {
    static __device__ __forceinline__ void run(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
            "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <> struct wg_mma<64> {
    static __device__ __forceinline__ void run(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
            "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
template <> struct wg_mma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
            "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
};
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart (SBO); LBO unused */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* (d sc, -(dmin m)) of sub-block j (0..3 of the stage's four) as two broadcast pairs */
static __device__ __forceinline__ void wg_scale(uint32_t scw, uint32_t mw, int j, __half2 dm, __half2 &dd,
                                                __half2 &nm) {
    const uint32_t u = (__byte_perm(scw, mw, (uint32_t)j | ((uint32_t)(4 + j) << 8)) & 0x00FF00FFu) | 0x64006400u;
    const __half2 v = __hmul2(__hsub2(bits_h2(u), __float2half2_rn(1024.f)), dm);
    dd = __low2half2(v);
    nm = __hneg2(__high2half2(v));
}

/* One k16 step of a consumer warpgroup: its tiles' wgmmas (A fragments a, B at db) as one group,
 * then the wait that leaves one group in flight; after_first() where first (a stage's first step,
 * once the one before it has completed) */
template <int NT, int MT, typename F>
static __device__ __forceinline__ void wg_step(float (&acc)[MT][NT / 2], const uint32_t (&a)[MT][4], uint64_t db,
                                               bool first, F after_first) {
    wg_fence();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) wg_mma<NT>::run(acc[mt], a[mt], db);
    wg_commit();
    wg_wait<1>();
    if (first) after_first();
}

/* One stage of a consumer warpgroup's product (the stage's buffer st: x tile, then the rows' raw
 * bytes): the warp's scales decoded into scs, then the stage's eight k16 steps on the acc tiles.
 * Two wgmma groups in flight (wait_group 1 after each commit: 2 measured best of 1-3). after_first()
 * runs once the first step's wgmma is issued and the one before it has completed: the previous
 * stage's wgmmas are all done from there on. Returns with one group in flight. */
template <int NT, int MT, int TY, typename F>
static __device__ __forceinline__ void wg_stage(const uint8_t *st, uint8_t *scs, bool odd, float (&acc)[MT][NT / 2],
                                                F after_first) {
    using G = wg_geo<NT, MT, TY>;
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint32_t xs0 = (uint32_t)__cvta_generic_to_shared(st);
    const uint8_t *ws = st + G::XB;
    if constexpr (TY == WG_Q50) {
        const __half2 k1040 = __float2half2_rn(1040.f);
        uint32_t A[3][MT][4]; /* as below */
#pragma unroll
        for (int ch = 0; ch < 2; ch++) {
            __half2 dq[MT][2][2]; /* [tile][row g / g + 8][block 2 ch / 2 ch + 1] */
            uint32_t X[MT][2][2]; /* [tile][row][block]: qs bytes 2t, 2t + 1, 2t + 8, 2t + 9 */
            uint32_t H[MT][2][2]; /* [tile][row][block]: qh >> 2t */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = wg * MT * 64 + mt * 64 + wq * 16 + g + 8 * hf;
                    const uint8_t *rp = ws + row * G::RSB + 44 * ch;
#pragma unroll
                    for (int bb = 0; bb < 2; bb++) {
                        const uint16_t *bp = (const uint16_t *)(rp + 22 * bb);
                        dq[mt][hf][bb] = bits_h2((uint32_t)bp[0] * 0x10001u);
                        H[mt][hf][bb] = ((uint32_t)bp[1] | ((uint32_t)bp[2] << 16)) >> (2 * t);
                        X[mt][hf][bb] = (uint32_t)bp[3 + t] | ((uint32_t)bp[7 + t] << 16);
                    }
                }
#pragma unroll
            for (int q = 0; q < 4; q++) { /* k16 steps: block 2 ch low nibbles, high; block 2 ch + 1 the same */
                const int b = (4 * ch + q) % 3;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const uint32_t x = X[mt][hf][q >> 1], h = H[mt][hf][q >> 1] >> (16 * (q & 1));
                        /* qh bits 2t, 2t + 1, 2t + 8, 2t + 9 as bits 0-3, then one to each byte's bit 4
                         * (bit i moves to 8 i: the multiplier's terms land on distinct bits) */
                        const uint32_t hb = (h & 3u) | ((h >> 6) & 0xCu);
                        const uint32_t v = ((q & 1 ? x >> 4 : x) & 0x0F0F0F0Fu) | (((hb * 0x00204081u) & 0x01010101u) << 4);
                        __half2 lo, hi;
                        bytes_h2(v, lo, hi);
                        A[b][mt][hf] = h2_bits(__hmul2(__hsub2(lo, k1040), dq[mt][hf][q >> 1]));
                        A[b][mt][2 + hf] = h2_bits(__hmul2(__hsub2(hi, k1040), dq[mt][hf][q >> 1]));
                    }
                wg_step<NT, MT>(acc, A[b], wg_desc(xs0 + ch * (NT * 128) + q * 32), ch == 0 && q == 0, after_first);
            }
        }
        return;
    }
    if constexpr (TY == WG_Q80) {
        const __half2 k1152 = __float2half2_rn(1152.f);
        uint32_t A[3][MT][4]; /* as below */
#pragma unroll
        for (int ch = 0; ch < 2; ch++) {
            __half2 dq[MT][2][2]; /* [tile][row g / g + 8][block 2 ch / 2 ch + 1] */
            uint32_t X[MT][2][4]; /* [tile][row][k16 step]: bytes 2t, 2t + 1, 2t + 8, 2t + 9 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = wg * MT * 64 + mt * 64 + wq * 16 + g + 8 * hf;
                    const uint8_t *rp = ws + row * G::RSB + (odd ? 8 : 0) + 68 * ch;
#pragma unroll
                    for (int bb = 0; bb < 2; bb++) {
                        const uint8_t *bp = rp + 34 * bb;
                        dq[mt][hf][bb] = bits_h2((uint32_t)*(const uint16_t *)bp * 0x10001u);
#pragma unroll
                        for (int hq = 0; hq < 2; hq++) {
                            const uint16_t *e = (const uint16_t *)(bp + 2 + 16 * hq + 2 * t);
                            X[mt][hf][2 * bb + hq] = (uint32_t)e[0] | ((uint32_t)e[4] << 16);
                        }
                    }
                }
#pragma unroll
            for (int q = 0; q < 4; q++) { /* k16 steps: block 2 ch 0-15, 16-31; block 2 ch + 1 0-15, 16-31 */
                const int b = (4 * ch + q) % 3;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        __half2 lo, hi;
                        bytes_h2(X[mt][hf][q] ^ 0x80808080u, lo, hi);
                        A[b][mt][hf] = h2_bits(__hmul2(__hsub2(lo, k1152), dq[mt][hf][q >> 1]));
                        A[b][mt][2 + hf] = h2_bits(__hmul2(__hsub2(hi, k1152), dq[mt][hf][q >> 1]));
                    }
                wg_step<NT, MT>(acc, A[b], wg_desc(xs0 + ch * (NT * 128) + q * 32), ch == 0 && q == 0, after_first);
            }
        }
        return;
    }
    const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
    const __half2 k1024 = __float2half2_rn(1024.f);
    { /* the warp's 16 rows x 4 sub-blocks of scales, decoded once: lane -> row lane / 2, sub-blocks
       * 2 (lane % 2), +1 (the four lanes of a row would otherwise each decode all four) */
        const int rl = lane >> 1, jp = lane & 1;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const uint4 hd = *(const uint4 *)(ws + (wg * MT * 64 + mt * 64 + wq * 16 + rl) * G::RSB);
            /* x: d | dmin; y, z, w: scale bytes 0-3, 4-7, 8-11 (kscale_min: sub-blocks 0-3 from
             * bytes j and j + 4, 4-7 from bytes j + 8 and the top bits of j and j + 4) */
            const uint32_t scw = odd ? (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u) : hd.y & 0x3F3F3F3Fu;
            const uint32_t mw = odd ? ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u) : hd.z & 0x3F3F3F3Fu;
            __half2 dd0, nm0, dd1, nm1;
            wg_scale(scw, mw, 2 * jp, bits_h2(hd.x), dd0, nm0);
            wg_scale(scw, mw, 2 * jp + 1, bits_h2(hd.x), dd1, nm1);
            *(uint4 *)(scs + mt * 16 * WG_SCR + rl * WG_SCR + jp * 16) = make_uint4(h2_bits(dd0), h2_bits(nm0), h2_bits(dd1), h2_bits(nm1));
        }
        __syncwarp();
    }
    uint32_t A[3][MT][4]; /* fragments of three k16 steps: the two wgmma groups in flight, the next one */
#pragma unroll
    for (int ch = 0; ch < 2; ch++) {
        __half2 dd[MT][2][2], nm[MT][2][2]; /* [tile][row g / g + 8][low / high nibbles] */
        uint32_t X[MT][2][2];               /* [tile][row][bytes of elements 0-15 / 16-31] */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const uint8_t *rp = ws + (wg * MT * 64 + mt * 64 + wq * 16 + g + 8 * hf) * G::RSB;
                const uint4 sc = *(const uint4 *)(scs + mt * 16 * WG_SCR + (g + 8 * hf) * WG_SCR + ch * 16);
                dd[mt][hf][0] = bits_h2(sc.x), nm[mt][hf][0] = bits_h2(sc.y);
                dd[mt][hf][1] = bits_h2(sc.z), nm[mt][hf][1] = bits_h2(sc.w);
                const uint32_t *qw = (const uint32_t *)(rp + 16 + 32 * ch) + (t >> 1);
                X[mt][hf][0] = __byte_perm(qw[0], qw[2], sel);
                X[mt][hf][1] = __byte_perm(qw[4], qw[6], sel);
            }
#pragma unroll
        for (int q = 0; q < 4; q++) { /* k16 steps: sub-block lo 0-15, 16-31; hi 0-15, 16-31 */
            const int b = (4 * ch + q) % 3; /* A buffer: free once wgmma 4 ch + q - 3 is done */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const uint32_t v = (q < 2 ? X[mt][hf][q & 1] : X[mt][hf][q & 1] >> 4) & 0x0F0F0F0Fu;
                    __half2 lo, hi;
                    bytes_h2(v, lo, hi);
                    A[b][mt][hf] = h2_bits(__hfma2(__hsub2(lo, k1024), dd[mt][hf][q >> 1], nm[mt][hf][q >> 1]));
                    A[b][mt][2 + hf] = h2_bits(__hfma2(__hsub2(hi, k1024), dd[mt][hf][q >> 1], nm[mt][hf][q >> 1]));
                }
            /* wgmma j - 1 done after it: its buffer is step j + 2's */
            wg_step<NT, MT>(acc, A[b], wg_desc(xs0 + ch * (NT * 128) + q * 32), ch == 0 && q == 0, after_first);
        }
    }
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ bool mbar_try_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(b)), "r"(parity)
                 : "memory");
    return done != 0;
}
/* until the phase of parity `parity` has completed. A wait of 2^34 cycles (seconds) is a broken
 * pipeline: it traps (the launch fails with cudaErrorLaunchFailure) rather than hang the stream.
 * No printf: a call here would serialize the consumers' wgmma pipeline. */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    if (mbar_try_wait(b, parity)) return;
    const long long t0 = clock64();
    while (!mbar_try_wait(b, parity))
        if (clock64() - t0 > (1ll << 34)) __trap();
}
/* an arrival on b when pred (predicated, not a branch: a branch among the consumers' wgmmas would
 * make ptxas serialize them) */
static __device__ __forceinline__ void mbar_arrive_if(uint64_t *b, bool pred) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_u32(b)),
                 "r"((uint32_t)pred)
                 : "memory");
}
/* an arrival on b once all of this thread's earlier cp.async have landed (not counted ahead: the
 * barrier's count includes it) */
static __device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b)) : "memory");
}

/* The producer warpgroup's copies of one tile: nst stages from stage counter it on (buffer it %
 * ST; its use it / ST waits for the consumers' release of the use before). */
template <int NT, int MT, int TY>
static __device__ __forceinline__ void wg_produce(const uint8_t *__restrict__ W, size_t rb, int in, int out, int r0,
                                                  const __half *__restrict__ xh, uint8_t *sm, const int *xrow,
                                                  uint64_t *full, uint64_t *empty, uint32_t it, int nst) {
    using G = wg_geo<NT, MT, TY>;
    constexpr int CB = wg_raw<TY>::CB, CPR = G::RSB / CB; /* bytes a copy, copies a row */
    const int pt = threadIdx.x - 256;
    /* x: chunk c of rows n0 + 8 j (the swizzle's n % 8 is n0's); W: chunk i = pt + 128 j of the
     * stage's R rows x CPR chunks (Q4_K: 0 the block's header, 1-4 nibbles, + 64 bytes on odd
     * stages; Q8_0: the window's nine; Q5_0: eleven of 8 bytes) */
    constexpr int NXJ = NT / 8, NWJ = G::R * CPR / 128;
    static_assert(G::R * CPR % 128 == 0, "whole W chunks a producer thread");
    const int c = pt & 15, n0 = pt >> 4;
    const uint32_t xd0 = (uint32_t)((c >> 3) * (NT * 128) + n0 * 128 + (((c & 7) ^ (n0 & 7)) << 4));
    const uint32_t xrb = (uint32_t)in * 2;
    /* W chunk i's source offset; its place (XB + 16 i: rows of CPR chunks) and, for Q4_K, whether it
     * takes the odd stages' 64 bytes further (bit 31) */
    uint32_t wo[NWJ], wd[NWJ];
#pragma unroll
    for (int j = 0; j < NWJ; j++) {
        const int i = pt + j * 128, r = i / CPR, k = i % CPR;
        wo[j] = (uint32_t)((size_t)min(r0 + r, out - 1) * rb + CB * k);
        wd[j] = (uint32_t)(G::XB + 16 * i) | (k ? 0x80000000u : 0u);
    }
#pragma unroll 1
    for (int s = 0; s < nst; s++, it++) {
        const int b = (int)(it % G::ST);
        if (it >= (uint32_t)G::ST) mbar_wait(&empty[b], (it / G::ST - 1) & 1);
        uint8_t *st = sm + b * G::SB;
        const uint8_t *xs = (const uint8_t *)xh + (size_t)s * WG_KS * 2 + c * 16;
#pragma unroll
        for (int j = 0; j < NXJ; j++) cp_async16(st + xd0 + j * 1024, xs + (uint32_t)xrow[n0 + 8 * j] * xrb);
        /* Q4_K: the block (144 bytes) of stages 2m, 2m + 1; Q8_0: the window at 136 s rounded down
         * to 16 (272 bytes every two stages) */
        const uint8_t *wb = TY == WG_Q4K   ? W + (size_t)(s >> 1) * 144
                            : TY == WG_Q50 ? W + (size_t)s * 88
                                           : W + (size_t)(s >> 1) * 272 + 128 * (s & 1);
        const uint32_t qo = 64 * (s & 1);
#pragma unroll
        for (int j = 0; j < NWJ; j++) {
            if constexpr (TY == WG_Q4K)
                cp_async16(st + (wd[j] & 0x7FFFFFFFu), wb + wo[j] + (wd[j] >> 31 ? qo : 0u));
            else if constexpr (TY == WG_Q50)
                cp_async8(st + G::XB + 8 * (pt + 128 * j), wb + wo[j]);
            else
                cp_async16(st + G::XB + 16 * (pt + 128 * j), wb + wo[j]);
        }
        mbar_arrive_cp_async(&full[b]);
    }
}

/* A consumer warpgroup's share of one tile: its rows' product over all of K into acc. */
template <int NT, int MT, int TY>
static __device__ __forceinline__ void wg_consume(uint8_t *sm, uint64_t *full, uint64_t *empty, uint32_t it, int nst,
                                                  float (&acc)[MT][NT / 2]) {
    using G = wg_geo<NT, MT, TY>;
    uint8_t *scs = sm + G::ST * G::SB + (threadIdx.x >> 5) * G::SCW;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT / 2; i++) acc[mt][i] = 0.f;
#pragma unroll 1
    for (int s = 0; s < nst; s++, it++) {
        const int b = (int)(it % G::ST);
        mbar_wait(&full[b], (it / G::ST) & 1);
        fence_proxy_async(); /* the landed copies, to wgmma's proxy */
        /* this thread is done with the previous stage's buffer */
        wg_stage<NT, MT, TY>(sm + b * G::SB, scs, s & 1, acc, [&] { mbar_arrive_if(&empty[(it - 1) % G::ST], s > 0); });
    }
    wg_wait<0>();
    mbar_arrive_if(&empty[(it - 1) % G::ST], nst > 0);
}

/* A consumer thread's share of the tile's outputs: y[yrow[n]][o] = acc * xs[xrow[n]] (rows past
 * out and tokens past the tile's pairs skipped). */
template <int NT, int MT>
static __device__ __forceinline__ void wg_store(const float (&acc)[MT][NT / 2], int r0, int out, const int *xrow,
                                                const int *yrow, const float *__restrict__ xs, float *__restrict__ y) {
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* D fragment: n8 block i, row g (+8 for hf), tokens 8i + 2t, +1 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int o = r0 + wg * MT * 64 + mt * 64 + wq * 16 + g + 8 * hf;
            if (o >= out) continue;
#pragma unroll
            for (int i = 0; i < NT / 8; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int n = 8 * i + 2 * t + j, yr = yrow[n];
                    if (yr >= 0) y[(size_t)yr * out + o] = acc[mt][4 * i + 2 * hf + j] * xs[xrow[n]];
                }
        }
}

#endif

/* Dense (counts NULL): block (row block, token tile) over T tokens. Grouped: block (row block,
 * expert e) walks e's pairs NT at a time; its tiles are separated by block barriers. */
template <int TY, int NT, int MT>
__global__ void __launch_bounds__(WG_THREADS, wg_geo<NT, MT, TY>::MINB)
    wg_mm_kernel(const uint8_t *__restrict__ W, size_t rb, size_t estride, int in, int out,
                  const __half *__restrict__ xh, const float *__restrict__ xs, int T, int x_div,
                  const int32_t *__restrict__ sorted, const int32_t *__restrict__ counts, int world,
                  float *__restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mlacu_pdl_enter();
    using G = wg_geo<NT, MT, TY>;
    extern __shared__ __align__(16) uint8_t wg_sm_raw[];
    uint8_t *sm = wg_sm_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_sm_raw) & 1023u)) & 1023u);
    int *xrow = (int *)(sm + G::ST * G::SB + 8 * G::SCW), *yrow = xrow + NT;
    uint64_t *full = (uint64_t *)(yrow + NT), *empty = full + G::ST;
    const int r0 = blockIdx.x * G::R, tid = threadIdx.x;
    int cnt, off;
    const uint8_t *We;
    if (!plan_block_pairs(W, estride, T, NT, counts, world, cnt, off, We)) return;
    if (tid == 0) {
        for (int b = 0; b < G::ST; b++) {
            mbar_init(&full[b], 128);
            mbar_init(&empty[b], 256);
        }
        mlacu_mbar_init_fence();
    }
    __syncthreads();
    /* the two roles never join again (setmaxnreg holds where each branch runs on its own); tiles are
     * separated by named barrier 1 over all WG_THREADS */
    const int nst = in / WG_KS;
    auto tile_rows = [&](int c0) {
        asm volatile("bar.sync 1, %0;\n" ::"n"(WG_THREADS) : "memory"); /* the previous tile's stores read xrow / yrow */
        plan_tile_rows(xrow, yrow, NT, WG_THREADS, off, c0, cnt, sorted, counts, x_div);
        asm volatile("bar.sync 1, %0;\n" ::"n"(WG_THREADS) : "memory");
    };
    uint32_t it = 0; /* stages issued (producer) or taken (consumers) before this tile */
    if (tid >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(G::PREGS));
        for (int c0 = 0; c0 < cnt; c0 += NT, it += (uint32_t)nst) {
            tile_rows(c0);
            wg_produce<NT, MT, TY>(We, rb, in, out, r0, xh, sm, xrow, full, empty, it, nst);
        }
        cp_async_commit(); /* nothing in flight when the block ends */
        cp_async_wait_all();
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(G::CREGS));
        for (int c0 = 0; c0 < cnt; c0 += NT, it += (uint32_t)nst) {
            tile_rows(c0);
            float acc[MT][NT / 2];
            wg_consume<NT, MT, TY>(sm, full, empty, it, nst, acc);
            wg_store<NT, MT>(acc, r0, out, xrow, yrow, xs, y);
        }
    }
#else
    (void)W, (void)rb, (void)estride, (void)in, (void)out, (void)xh, (void)xs, (void)T, (void)x_div, (void)sorted;
    (void)counts, (void)world, (void)y;
    __trap();
#endif
}

int g_mode = 1; /* mlacu_wg_set */

int wg_mode(void) { return g_mode; }

/* a compute capability 9.0 device with sm_90a instructions allowed (no MLA_CUDA_SMEM_CAP) and the
 * largest tile's shared memory (Q4_K's 256 x 128) */
bool wg_device_ok(void) {
    static_assert(wg_geo<128, 2, WG_Q4K>::SMEM >= wg_geo<128, 2, WG_Q80>::SMEM, "the largest tile");
    return mlacu_hopper_isa() && mlacu_smem_optin() >= (int)wg_geo<128, 2, WG_Q4K>::SMEM;
}

template <int TY, int NT, int MT>
cudaError_t wg_launch(const void *w, size_t rb, size_t estride, int64_t in, int64_t out, const __half *xh,
                      const float *xs, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts, int world,
                      unsigned gy, float *y, cudaStream_t s) {
    using G = wg_geo<NT, MT, TY>;
    static bool allowed = false;
    if (!allowed) {
        cudaError_t err = mlacu_smem_allow(wg_mm_kernel<TY, NT, MT>, (int)G::SMEM);
        if (err != cudaSuccess) return err;
        allowed = true;
    }
    dim3 grid((unsigned)((out + G::R - 1) / G::R), counts ? gy : (unsigned)((T + NT - 1) / NT));
    mlacu_launch(wg_mm_kernel<TY, NT, MT>, grid, WG_THREADS, G::SMEM, s, (const uint8_t *)w, rb, estride, (int)in,
                 (int)out, xh, xs, (int)T, x_div, sorted, counts, world, y);
    return cudaGetLastError();
}

template <int TY>
cudaError_t wg_run(int mode, const void *w, size_t rb, size_t estride, int64_t in, int64_t out, const __half *xh,
                   const float *xs, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts, int world,
                   unsigned gy, float *y, cudaStream_t s) {
#define WG_CASE(NT, MT)                                                                                                \
    case NT * 100 + MT:                                                                                                \
        return wg_launch<TY, NT, MT>(w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, s);
    switch (mode) {
        WG_CASE(16, 1)
        WG_CASE(16, 2)
        WG_CASE(32, 1)
        WG_CASE(32, 2)
        WG_CASE(64, 1)
        WG_CASE(64, 2)
        WG_CASE(128, 1)
        WG_CASE(128, 2)
    default: return cudaErrorInvalidValue;
    }
#undef WG_CASE
}

} // namespace

bool mlacu_wg_usable(uint32_t type, int64_t in, int64_t out, int64_t x_rows, const void *w, size_t estride) {
    const uint64_t lim = (uint64_t)1 << 32; /* wg_produce's 32-bit offsets */
    /* rows of 16-byte multiples: Q4_K's 144-byte blocks (two stages each), Q8_0's 34-byte ones eight
     * by eight; Q5_0's 8-byte multiples: four 22-byte blocks a stage */
    const bool shape = ((type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q8_0) && in % 256 == 0) ||
                       (type == GGML_TYPE_Q5_0 && in % 128 == 0);
    return wg_mode() != 0 && shape && in > 0 && out > 0 && x_rows >= 0 &&
           (uint64_t)x_rows * (uint64_t)in * 2 < lim && (uint64_t)out * ggml_row_bytes(type, in) < lim &&
           ((uintptr_t)w & 15) == 0 && estride % 16 == 0 && wg_device_ok();
}

void mlacu_wg_set(int mode) { g_mode = mode; }

cudaError_t mlacu_wg_matmul(uint32_t type, const void *w, size_t estride, int64_t in, int64_t out, const __half *xh,
                            const float *xs, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts,
                            int world, unsigned gy, int64_t pairs, float *y, cudaStream_t s) {
    const size_t rb = ggml_row_bytes(type, in);
    int mode = wg_mode();
    /* 128-token tiles x 256 rows from 96 pairs a tile on average, else 64 x 128 (two blocks an SM):
     * the fastest at 64 and 128 pairs an expert and on dense prompts (H200, 2026-11-30). Fewer
     * pairs an expert (short prompts, decode batches) take 32- and 16-token tiles: a 64-token
     * tile of 16 pairs spends three quarters of its tensor-core work on padding (the whole layer
     * 1.3x faster at 8 and 16 pairs an expert spread evenly). A router spreads them unevenly, and
     * an expert past one tile reads its weights again for the next: the tile is the smallest
     * that holds the mean plus two standard deviations of a Poisson count (mean + 2 sqrt(mean)). */
    if (mode == 1) {
        const int64_t tiles = counts ? (int64_t)gy : 1, per = pairs / (tiles > 0 ? tiles : 1);
        mode = per >= 96 ? 12802 : per > 22 ? 6401 : per > 10 ? 3202 : 1601;
    }
    if (type == GGML_TYPE_Q8_0)
        return wg_run<WG_Q80>(mode, w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, s);
    if (type == GGML_TYPE_Q4_K)
        return wg_run<WG_Q4K>(mode, w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, s);
    if (type == GGML_TYPE_Q5_0)
        return wg_run<WG_Q50>(mode, w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, s);
    return cudaErrorInvalidValue;
}
