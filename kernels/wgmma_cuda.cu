/* wgmma_cuda: Q4_K weights x fp16 activations on the warpgroup tensor cores (sm_90a); see
 * wgmma_cuda.h.
 *
 * A block of two warpgroups owns R = 128 MT weight rows (each warpgroup MT tiles of 64) and a tile
 * of NT tokens (64 or 128). wgmma m64nNTk16 takes A (64 weight rows x 16) from registers and B (16
 * x NT tokens) from shared memory:
 * - W never goes through shared memory as fp16: each thread dequantizes its own A fragment (rows
 *   g and g + 8 of its warp's 16, columns 2t, 2t + 1, 2t + 8, 2t + 9 of each k16 step) from the
 *   raw Q4_K bytes, which cp.async brings in: per row and stage (128 elements, half a block) the
 *   block's 16-byte header and its 64 bytes of nibbles. The four bytes a thread needs for a k16
 *   step (2t, 2t + 1, 2t + 8, 2t + 9 of a 16-byte half) come from two 32-bit reads and one
 *   byte_perm; the low nibbles are one sub-block's step, the high ones the next sub-block's.
 *   Nibbles to fp16 exactly (0x64XX is 1024 + XX), then (q - 1024) d1 - m1 with d1 = d sc and
 *   m1 = dmin m rounded to fp16: the same values as the mma.sync kernel's deq_h.
 * - x rows (gathered by the plan) come by cp.async into the K-major layout with the 128-byte
 *   swizzle: per stage two k-blocks of 64 elements, NT rows of 128 bytes each, 16-byte chunk c of
 *   row n at chunk c ^ (n % 8); descriptor SBO 1024 (8 rows), a k16 step 32 bytes further.
 * - The scales: each warp decodes its 16 rows' four sub-blocks of a stage once into shared
 *   memory as (d1, d1) and (-m1, -m1) pairs (lane -> one row, two sub-blocks).
 * Stages of 128 elements, WG_STAGES deep, each thread's copies set up once as 32-bit offsets. A
 * thread keeps three A fragments: it dequantizes step j + 1 while wgmma j - 1 and j may still run
 * (wait_group 1 after each commit; 2 groups in flight measured best of 1-3), and every stage ends
 * with wait_group 0 before the barrier that lets its buffer be refilled. Generic-proxy writes
 * (cp.async) are made visible to wgmma (async proxy) by fence.proxy.async before that barrier.
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

constexpr int WG_KS = 128;  /* K elements a stage: half a Q4_K block */
constexpr int WG_RSB = 80;  /* a row's bytes a stage: the block's header (16) and half its nibbles (64) */
constexpr int WG_STAGES = 4;
constexpr int WG_THREADS = 256;
/* a row's decoded scales a stage: four sub-blocks of (d1, d1 | -m1, -m1), 8 bytes each, and 16 of
 * padding (eight rows read at once fall in distinct banks) */
constexpr int WG_SCR = 48;

template <int NT, int MT> struct wg_geo {
    static constexpr int R = 2 * MT * 64;                   /* weight rows a block */
    static constexpr int XB = NT * WG_KS * 2;               /* x bytes a stage (two k-blocks of NT x 128 B) */
    static constexpr int WB = R * WG_RSB;                   /* W bytes a stage */
    static constexpr int SB = (XB + WB + 1023) / 1024 * 1024; /* a stage, 1024-aligned (the swizzle's unit) */
    static constexpr int SCW = MT * 16 * WG_SCR;            /* a warp's decoded scales */
    static constexpr size_t SMEM = (size_t)WG_STAGES * SB + (size_t)8 * SCW + 2 * NT * 4 + 1024; /* + xrow, yrow, alignment */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ void wg_mma_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
static __device__ __forceinline__ void wg_mma_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
template <int NT> struct wg_mma;
template <> struct wg_mma<64> {
    static __device__ __forceinline__ void run(float (&d)[32], const uint32_t (&a)[4], uint64_t db) { wg_mma_n64(d, a, db); }
};
template <> struct wg_mma<128> {
    static __device__ __forceinline__ void run(float (&d)[64], const uint32_t (&a)[4], uint64_t db) { wg_mma_n128(d, a, db); }
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

/* One block's product of its R rows with the NT x rows xrow[] over all of K. */
template <int NT, int MT>
static __device__ __forceinline__ void wg_block(const uint8_t *__restrict__ W, size_t rb, int in, int out, int r0,
                                                const __half *__restrict__ xh, uint8_t *sm, const int *xrow,
                                                float (&acc)[MT][NT / 2], int depth) {
    using G = wg_geo<NT, MT>;
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    uint8_t *scs = sm + WG_STAGES * G::SB + (tid >> 5) * G::SCW; /* this warp's decoded scales */
    const int nst = in / WG_KS;
    /* each thread's copies of a stage, set up once: byte offsets of the sources (x from xh, W from
     * W: both below 4 GB) and of the destinations in a stage; a stage adds its K offset */
    constexpr int NXJ = NT * 16 / WG_THREADS, NWJ = (G::R * 5 + WG_THREADS - 1) / WG_THREADS;
    static_assert(NT * 16 % WG_THREADS == 0, "whole x chunks a thread");
    uint32_t xo[NXJ], xd[NXJ], wo[NWJ], wd[NWJ];
#pragma unroll
    for (int j = 0; j < NXJ; j++) {
        const int i = tid + j * WG_THREADS, n = i >> 4, c = i & 15;
        xo[j] = (uint32_t)(((size_t)xrow[n] * in + c * 8) * 2);
        xd[j] = (uint32_t)((c >> 3) * (NT * 128) + n * 128 + (((c & 7) ^ (n & 7)) << 4));
    }
#pragma unroll
    for (int j = 0; j < NWJ; j++) { /* chunk 0 of a row: the header; 1-4: nibbles (+64 on odd stages) */
        const int i = min(tid + j * WG_THREADS, G::R * 5 - 1), r = i / 5, c = i % 5;
        wo[j] = (uint32_t)((size_t)min(r0 + r, out - 1) * rb + (c ? 16 * c : 0));
        wd[j] = (uint32_t)(G::XB + r * WG_RSB + 16 * c) | (c ? 0x80000000u : 0u);
    }
    auto issue = [&](int s) {
        uint8_t *st = sm + (s % WG_STAGES) * G::SB;
        const uint8_t *xs = (const uint8_t *)xh + (size_t)s * WG_KS * 2;
#pragma unroll
        for (int j = 0; j < NXJ; j++) cp_async16(st + xd[j], xs + xo[j]);
        const uint8_t *wb = W + (size_t)(s >> 1) * 144;
        const uint32_t qo = 64 * (s & 1);
#pragma unroll
        for (int j = 0; j < NWJ; j++)
            if (j + 1 < NWJ || tid + j * WG_THREADS < G::R * 5)
                cp_async16(st + (wd[j] & 0x7FFFFFFFu), wb + wo[j] + (wd[j] >> 31 ? qo : 0u));
    };
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT / 2; i++) acc[mt][i] = 0.f;
#pragma unroll 1
    for (int p = 0; p < WG_STAGES - 1; p++) {
        if (p < nst) issue(p);
        cp_async_commit();
    }
    const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
    const __half2 k1024 = __float2half2_rn(1024.f);
#pragma unroll 1
    for (int s = 0; s < nst; s++) {
        cp_async_wait<WG_STAGES - 2>(); /* this thread's copies of stage s */
        fence_proxy_async();            /* visible to wgmma */
        __syncthreads();                /* everyone's; and stage s - 1's buffer is free */
        if (s + WG_STAGES - 1 < nst) issue(s + WG_STAGES - 1);
        cp_async_commit();
        const uint8_t *st = sm + (s % WG_STAGES) * G::SB;
        const uint32_t xs0 = (uint32_t)__cvta_generic_to_shared(st);
        const uint8_t *ws = st + G::XB;
        const bool odd = s & 1; /* sub-blocks 4..7 of the block */
        { /* the warp's 16 rows x 4 sub-blocks of scales, decoded once: lane -> row lane / 2, sub-blocks
           * 2 (lane % 2), +1 (the four lanes of a row would otherwise each decode all four) */
            const int rl = lane >> 1, jp = lane & 1;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint4 hd = *(const uint4 *)(ws + (wg * MT * 64 + mt * 64 + wq * 16 + rl) * WG_RSB);
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
        uint32_t A[3][MT][4]; /* fragments of three k16 steps: up to three wgmma groups read them */
#pragma unroll
        for (int ch = 0; ch < 2; ch++) {
            __half2 dd[MT][2][2], nm[MT][2][2]; /* [tile][row g / g + 8][low / high nibbles] */
            uint32_t X[MT][2][2];               /* [tile][row][bytes of elements 0-15 / 16-31] */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const uint8_t *rp = ws + (wg * MT * 64 + mt * 64 + wq * 16 + g + 8 * hf) * WG_RSB;
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
                const uint64_t db = wg_desc(xs0 + ch * (NT * 128) + q * 32);
                wg_fence();
#pragma unroll
                for (int mt = 0; mt < MT; mt++) wg_mma<NT>::run(acc[mt], A[b][mt], db);
                wg_commit();
                if (depth == 2) /* wgmma j - 2 done: its buffer is the next step's */
                    wg_wait<1>();
                else if (depth == 3)
                    wg_wait<2>();
                else
                    wg_wait<0>();
            }
        }
        wg_wait<0>(); /* this stage's buffers are read before the next barrier */
    }
}
#endif

/* Dense (counts NULL): block (row block, token tile) over T tokens. Grouped: block (row block,
 * expert e) walks e's pairs NT at a time. */
template <int NT, int MT>
__global__ void __launch_bounds__(WG_THREADS, 1)
    wg_q4k_kernel(const uint8_t *__restrict__ W, size_t rb, size_t estride, int in, int out,
                  const __half *__restrict__ xh, const float *__restrict__ xs, int T, int x_div,
                  const int32_t *__restrict__ sorted, const int32_t *__restrict__ counts, int world,
                  float *__restrict__ y, int depth) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mlacu_pdl_enter();
    using G = wg_geo<NT, MT>;
    extern __shared__ __align__(16) uint8_t wg_sm_raw[];
    uint8_t *sm = wg_sm_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_sm_raw) & 1023u)) & 1023u);
    int *xrow = (int *)(sm + WG_STAGES * G::SB + 8 * G::SCW), *yrow = xrow + NT;
    const int r0 = blockIdx.x * G::R, tid = threadIdx.x;
    int cnt, off;
    const uint8_t *We;
    if (!plan_block_pairs(W, estride, T, NT, counts, world, cnt, off, We)) return;
    const int wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    for (int c0 = 0; c0 < cnt; c0 += NT) {
        __syncthreads(); /* the previous tile's stores read xrow / yrow */
        plan_tile_rows(xrow, yrow, NT, WG_THREADS, off, c0, cnt, sorted, counts, x_div);
        __syncthreads();
        float acc[MT][NT / 2];
        wg_block<NT, MT>(We, rb, in, out, r0, xh, sm, xrow, acc, depth);
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
#else
    (void)W, (void)rb, (void)estride, (void)in, (void)out, (void)xh, (void)xs, (void)T, (void)x_div, (void)sorted;
    (void)counts, (void)world, (void)y, (void)depth;
    __trap(); /* built for sm_90a alone; mlacu_wg_usable keeps other devices away */
#endif
}

int g_mode = -1; /* mlacu_wg_set; -1: not read yet (MLA_CUDA_WGMMA) */

int wg_mode(void) {
    if (g_mode < 0) {
        const char *e = getenv("MLA_CUDA_WGMMA");
        g_mode = e && !strcmp(e, "0") ? 0 : 1;
    }
    return g_mode;
}

bool wg_device_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0, minor = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
             minor == 0 && mlacu_smem_optin() >= (int)wg_geo<128, 2>::SMEM;
    }
    return ok == 1;
}

template <int NT, int MT>
cudaError_t wg_launch(const void *w, size_t rb, size_t estride, int64_t in, int64_t out, const __half *xh,
                      const float *xs, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts, int world,
                      unsigned gy, float *y, int depth, cudaStream_t s) {
    using G = wg_geo<NT, MT>;
    static bool allowed = false;
    if (!allowed) {
        cudaError_t err = cudaFuncSetAttribute(wg_q4k_kernel<NT, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)G::SMEM);
        if (err != cudaSuccess) return err;
        allowed = true;
    }
    dim3 grid((unsigned)((out + G::R - 1) / G::R), counts ? gy : (unsigned)((T + NT - 1) / NT));
    mlacu_launch(wg_q4k_kernel<NT, MT>, grid, WG_THREADS, G::SMEM, s, (const uint8_t *)w, rb, estride, (int)in,
                 (int)out, xh, xs, (int)T, x_div, sorted, counts, world, y, depth);
    return cudaGetLastError();
}

} // namespace

bool mlacu_wg_usable(uint32_t type, int64_t in, int64_t out, int64_t x_rows, const void *w, size_t estride) {
    const uint64_t lim = (uint64_t)1 << 32; /* wg_block's 32-bit offsets */
    return wg_mode() != 0 && type == GGML_TYPE_Q4_K && in > 0 && in % 512 == 0 && out > 0 && x_rows >= 0 &&
           (uint64_t)x_rows * (uint64_t)in * 2 < lim && (uint64_t)out * ggml_row_bytes(type, in) < lim &&
           ((uintptr_t)w & 15) == 0 && estride % 16 == 0 && wg_device_ok();
}

void mlacu_wg_set(int mode) { g_mode = mode; }

cudaError_t mlacu_wg_q4k(const void *w, size_t estride, int64_t in, int64_t out, const __half *xh, const float *xs,
                         int64_t T, int x_div, const int32_t *sorted, const int32_t *counts, int world, unsigned gy,
                         int64_t pairs, float *y, cudaStream_t s) {
    const size_t rb = ggml_row_bytes(GGML_TYPE_Q4_K, in);
    int mode = wg_mode();
    /* wgmma groups in flight: 2 by default; mode + 1000000 k: k (diagnosis and tuning) */
    int depth = 2;
    if (mode >= 1000000) depth = mode / 1000000, mode %= 1000000;
    /* 128-token tiles x 256 rows from 96 pairs a tile on average, else 64 x 128 (two blocks an SM):
     * the fastest of the four at 64 and 128 pairs an expert and on dense prompts (H200, 2026-11-30) */
    if (mode == 1) {
        const int64_t tiles = counts ? (int64_t)gy : 1, per = pairs / (tiles > 0 ? tiles : 1);
        mode = per >= 96 ? 12802 : 6401;
    }
    switch (mode) {
    case 6401: return wg_launch<64, 1>(w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, depth, s);
    case 6402: return wg_launch<64, 2>(w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, depth, s);
    case 12801: return wg_launch<128, 1>(w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, depth, s);
    case 12802: return wg_launch<128, 2>(w, rb, estride, in, out, xh, xs, T, x_div, sorted, counts, world, gy, y, depth, s);
    default: return cudaErrorInvalidValue;
    }
}
