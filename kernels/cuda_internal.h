/* cuda_internal: helpers shared by the kernels/ CUDA files (CUDA C++ only; not an API). */
#ifndef CUDA_INTERNAL_H
#define CUDA_INTERNAL_H

#ifndef __CUDACC__
#error "cuda_internal.h is CUDA C++"
#endif

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "common/mla_switch.h"
#include "kernels/cuda_ops.h"

/* On a CUDA error: fill *e with "<what>: <cuda error string>" and return MLA_ERR. */
#define MLACU_CHECK(call, e, ...)                                                              \
    do {                                                                                       \
        cudaError_t mlacu_err_ = (call);                                                       \
        if (mlacu_err_ != cudaSuccess) {                                                       \
            mla_errf((e), __VA_ARGS__);                                                        \
            return mlacu_fail_((e), mlacu_err_);                                              \
        }                                                                                      \
    } while (0)

/* the global nanosecond clock (the same on every SM) */
static __device__ __forceinline__ unsigned long long mlacu_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#ifdef MLA_CUDA_STEPTRACE
/* The step trace (a diagnostic build: cmake -DMLA_CUDA_STEPTRACE=ON; MLA_CUDA_STEPTRACE=PREFIX at
 * run time). Thread 0 of every block that calls mlacu_pdl_wait() writes one record: its launch
 * (%gridid), block, SM, and the global clock as it enters the wait and as the wait returns. The
 * host side (ops_cuda.cu) logs every mlacu_launch in order and writes both at exit, for
 * bench/steptrace.py. Each translation unit has its own copy of the device pointers, bound at
 * its first launch. MLACU_TRACE_MARK(tag) adds a record of the calling thread's time (t_out) and
 * SM clock (t_in) under a tag (> 0; the waits' records have tag 0). */
struct mlacu_trace_rec {
    unsigned long long grid, t_in, t_out;
    unsigned block, sm, tag, pad;
};
static __device__ mlacu_trace_rec *mlacu_trace_buf;
static __device__ unsigned *mlacu_trace_cnt;
static __device__ unsigned mlacu_trace_cap;
void mlacu_trace_host(mlacu_trace_rec **buf, unsigned **cnt, unsigned *cap); /* ops_cuda.cu */
void mlacu_trace_log(const void *k, dim3 grid, dim3 block, size_t smem, cudaStream_t st);
static inline void mlacu_trace_bind_tu(void) {
    static bool bound = false;
    if (bound) return;
    bound = true;
    mlacu_trace_rec *b = nullptr;
    unsigned *c = nullptr, cap = 0;
    mlacu_trace_host(&b, &c, &cap);
    cudaMemcpyToSymbol(mlacu_trace_buf, &b, sizeof b);
    cudaMemcpyToSymbol(mlacu_trace_cnt, &c, sizeof c);
    cudaMemcpyToSymbol(mlacu_trace_cap, &cap, sizeof cap);
}
static __device__ __forceinline__ void mlacu_trace_put(unsigned tag, unsigned long long t_in, unsigned long long t_out) {
    if (!mlacu_trace_buf) return;
    unsigned i = atomicAdd(mlacu_trace_cnt, 1u);
    if (i >= mlacu_trace_cap) return;
    unsigned long long g;
    unsigned sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    mlacu_trace_buf[i] = {g, t_in, t_out, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), sm, tag, 0};
}
#define MLACU_TRACE_MARK(tag) mlacu_trace_put((tag), (unsigned long long)clock64(), mlacu_gtime())
#else
#define MLACU_TRACE_MARK(tag) ((void)0)
#endif

/* Programmatic dependent launch (sm_90+). Every kernel of kernels/ starts with mlacu_pdl_enter()
 * and is launched with mlacu_launch. On a Hopper GPU the launch lets the next kernel of the stream
 * be scheduled while this one still runs. Each kernel's first statement waits until the grid
 * before it has finished and its writes are visible (griddepcontrol.wait), then allows the next
 * one to be scheduled (launch_dependents). The order of effects is the plain stream order; what
 * is saved is the launch gap between kernels (over 100 kernels a decode step). A kernel launched
 * without the attribute passes both instructions as no-ops; devices before sm_90 never get it.
 * Every kernel lets the next one be scheduled only after its own wait has returned (some later:
 * a decode step's norm once its row is in, a split attention at its last key tile, so that the
 * next kernel's copies or waiting blocks do not slow them). So when a kernel starts, every launch
 * of the stream but the one just before it has completed: a kernel may read before its wait what
 * launches two or more back wrote (the attention's cache rows), as well as weights and what the
 * host uploaded. A kernel right after a join (a wait on another stream's event) has two launches
 * just before it: in a CUDA graph the other stream's last one may join it by a programmatic edge
 * too, so what that launch wrote is read after the wait like the stream's own last one. */
static __device__ __forceinline__ void mlacu_pdl_wait() {
#ifdef MLA_CUDA_STEPTRACE
    const unsigned long long t_in = mlacu_gtime();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#ifdef MLA_CUDA_STEPTRACE
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) mlacu_trace_put(0, t_in, mlacu_gtime());
#endif
}
static __device__ __forceinline__ void mlacu_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/* the usual first statement: wait, then let the next kernel be scheduled. A kernel may instead
 * do work that reads nothing an earlier kernel writes (the weights) before mlacu_pdl_wait(), and
 * must not touch anything else until it returns (the streamed GEMV prefetches its first stages
 * of weights that way). */
static __device__ __forceinline__ void mlacu_pdl_enter() {
    mlacu_pdl_wait();
    mlacu_pdl_trigger();
}

/* whether launches take the attribute: the current device is sm_90+ (decided once a process) */
static inline bool mlacu_pdl_on(void) {
    static std::atomic<int> v{-1};
    int r = v.load(std::memory_order_relaxed);
    if (r < 0) {
        int dev = 0, major = 0;
        r = cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        v.store(r, std::memory_order_relaxed);
    }
    return r != 0;
}

/* k<<<grid, block, smem, st>>>(args...), with programmatic stream serialization when
 * mlacu_pdl_on(); errors surface as those of <<<>>> do (cudaGetLastError, or the next sync). */
template <typename... P, typename... A>
static inline void mlacu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args) {
#ifdef MLA_CUDA_STEPTRACE
    mlacu_trace_bind_tu();
    mlacu_trace_log((const void *)k, grid, block, smem, st);
#endif
    if (!mlacu_pdl_on()) {
        k<<<grid, block, smem, st>>>(std::forward<A>(args)...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

/* The online softmax over one tile of 2 N keys (64 or 128) of a thread's scores in the mma
 * accumulator layout that mma.sync m16n8 tiles and wgmma m64nN share: s[4 n + e] is row a (e < 2) or
 * row b (e >= 2), key k0 + 8 n + 2 q + (e & 1), q the lane's index in its quad (the quad holds the
 * rows' other keys).
 * Keys past a row's position (pa, pb) become -inf where the tile reaches past first (the first
 * position of the thread's block of rows); the rows' running maxima m take the tile's (over the
 * quad); mb is the maximum to subtract from the tile's scores (0 for a row with no key yet), al
 * the factor for the old sums l (applied here) and outputs (by the caller). */
template <int N>
static __device__ __forceinline__ void mlacu_softmax_tile(float (&s)[N], int64_t k0, int q, int64_t first, int64_t pa,
                                                          int64_t pb, float (&m)[2], float (&l)[2], float (&al)[2],
                                                          float (&mb)[2]) {
    static_assert(N == 32 || N == 64, "a tile of 64 or 128 keys");
    if (k0 + 2 * N - 1 > first) {
#pragma unroll
        for (int n = 0; n < N / 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t key = k0 + 8 * n + 2 * q + (e & 1);
                if (key > (e < 2 ? pa : pb)) s[4 * n + e] = -INFINITY;
            }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < N / 4; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mb[r] = mx[r] == -INFINITY ? 0.f : mx[r]; /* a row with no key yet: nothing to scale */
        al[r] = exp2f(m[r] - mb[r]);
        m[r] = mx[r];
        l[r] *= al[r];
    }
}

/* silu(g) u: swiglu_kernel's and the fused fp16 conversion's (mla_cuda_swiglu_h) one expression */
static __device__ __forceinline__ float mlacu_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The q8 buffer of T rows of `in` elements (mla_cuda_quantize_q8): int8 [T][in], then from this
 * offset (16-aligned) a float4 a 32-element unit: (d, d * sum of its first 16 q, d * sum of its
 * last 16 q, 0). */
static __host__ __device__ __forceinline__ size_t mlacu_q8_scale_off(int64_t T, int64_t in) {
    return ((size_t)(T * in) + 15) / 16 * 16;
}

/* The fp16 buffer of T rows of `in` elements (mla_cuda_act_h): each row times 2^e, rounded to fp16
 * [T][in], then from this offset (16-aligned) the T floats 2^-e. mlacu_h16_exp gives e for a row
 * whose largest magnitude is m: its largest element lands below 2^14 (0 for a zero or non-finite
 * m). */
static __host__ __device__ __forceinline__ size_t mlacu_h16_scale_off(int64_t T, int64_t in) {
    return ((size_t)(T * in) * 2 + 15) / 16 * 16;
}
static __device__ __forceinline__ int mlacu_h16_exp(float m) {
    int e = 0;
    if (m > 0.f && m < INFINITY) { /* m < 2^k: 2^(14 - k) puts it below 2^14 */
        int k;
        frexpf(m, &k);
        e = max(-120, min(120, 14 - k));
    }
    return e;
}

/* The q8 rounding of a 32-element unit (q8x_kernel in mm_gemvq_cuda.cu, mlacu_q8_units_warp): its
 * scale d = max|v| / 127, the inverse 127 / max|v| (0 for a unit of zeros), and an element's
 * int8, round-to-nearest-even(v * inverse). */
static __device__ __forceinline__ float mlacu_q8_d(float amax) { return amax / 127.f; }
static __device__ __forceinline__ float mlacu_q8_inv(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }
static __device__ __forceinline__ int mlacu_q8_round(float v, float inv) { return __float2int_rn(__fmul_rn(v, inv)); }

/* N 32-element units held by a warp, unit k's element `lane` in v[k] of each lane (every lane
 * calls it): units k < n_store get their int8 at q + k * ld and their scales at s[k * ld / 32],
 * the values q8x_kernel (mm_gemvq_cuda.cu) gives the same 32 floats: d = max|v| / 127,
 * q = round-to-nearest-even(v * 127 / max|v|). The N reductions run side by side. */
template <int N>
static __device__ __forceinline__ void mlacu_q8_units_warp(const float (&v)[N], int8_t *q, float4 *s, int ld,
                                                           int n_store) {
    const int lane = threadIdx.x & 31;
    float am[N];
    int qi[N], h[N];
#pragma unroll
    for (int k = 0; k < N; k++) am[k] = fabsf(v[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) am[k] = fmaxf(am[k], __shfl_xor_sync(0xffffffffu, am[k], o));
#pragma unroll
    for (int k = 0; k < N; k++) {
        h[k] = qi[k] = mlacu_q8_round(v[k], mlacu_q8_inv(am[k]));
    }
    /* the sums over each half of the warp (lanes 0-15, 16-31) */
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) h[k] += __shfl_xor_sync(0xffffffffu, h[k], o);
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int h1 = __shfl_sync(0xffffffffu, h[k], 16);
        if (k < n_store) {
            q[k * ld + lane] = (int8_t)qi[k];
            const float d = mlacu_q8_d(am[k]);
            if (lane == 0) s[k * ld / 32] = make_float4(d, d * (float)h[k], d * (float)h1, 0.f);
        }
    }
}

/* warp-wide sum and maximum (every lane gets the result) */
static __device__ __forceinline__ float wsum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float wmax(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Inclusive prefix of v over the warp's lanes (the whole warp calls it). */
static __device__ __forceinline__ int warp_scan_int(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
    }
    return v;
}

/* Exclusive prefix of v over the block (blockDim.x multiple of 32, <= 1024); *total gets the
 * block's sum. Uses sh[0..32]. */
static __device__ int block_scan_int(int v, int *sh, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int inc = warp_scan_int(v, lane);
    __syncthreads();
    if (lane == 31) sh[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nw ? sh[lane] : 0, wi = warp_scan_int(w, lane);
        if (lane < nw) sh[lane] = wi - w;
        if (lane == 31) sh[32] = wi;
    }
    __syncthreads();
    *total = sh[32];
    return sh[warp] + inc - v;
}

/* a cache or weight element as a float */
static __device__ __forceinline__ float to_f32(float v) { return v; }
static __device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

/* Row j of a paged cache (kernels/cuda_ops.h, MLA_CUDA_KV_BLOCK) of element type KT (float, or
 * __half: the fp16 latent cache, whose offset and row length count halves): block j / BS of the
 * token's table, then the layer's offset inside the block, then the slot. */
template <typename KT>
__device__ __forceinline__ const KT *paged_row_t(const float *const *tab, int64_t off, int64_t ld, int64_t j) {
    return (const KT *)tab[j >> MLA_CUDA_KV_BLOCK_LOG2] + off + (j & (MLA_CUDA_KV_BLOCK - 1)) * ld;
}
/* a cache element from a float (fp16: rounded to nearest) */
__device__ __forceinline__ void kv_store(float *d, float v) { *d = v; }
__device__ __forceinline__ void kv_store(__half *d, float v) { *d = __float2half_rn(v); }

/* Token slots of one tile of a MoE plan (moe_cuda.cu builds the tiles; the grouped GEMVs of
 * mm_gemv_cuda.cu and mm_gemvq_cuda.cu hold one tile's tokens in registers). */
#define MLACU_MOE_TILE MLA_CUDA_MOE_TILE

/* Where expert e's pairs start in a plan's sorted list: the sum of the counts before it, by the
 * first warp, shared with the block (a barrier: every thread of the block calls it). */
static __device__ __forceinline__ int plan_first_pair(const int32_t *__restrict__ counts, int e) {
    __shared__ int s_off;
    if (threadIdx.x < 32) {
        int sum = 0;
        for (int k = threadIdx.x; k < e; k += 32) sum += counts[k];
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (threadIdx.x == 0) s_off = sum;
    }
    __syncthreads();
    return s_off;
}

/* The pairs one block of a tiled product takes: dense (counts NULL), tile blockIdx.y of bm tokens
 * over T (pair p = token p); grouped, expert blockIdx.y's pairs of a MoE plan and its weights,
 * W + (e / world) estride. Returns false for an expert without pairs, before any barrier (the
 * block returns whole); else every thread of the block must have called it (a barrier). */
static __device__ __forceinline__ bool plan_block_pairs(const uint8_t *W, size_t estride, int T, int bm,
                                                        const int32_t *__restrict__ counts, int world, int &cnt,
                                                        int &off, const uint8_t *&We) {
    We = W;
    if (!counts) {
        off = blockIdx.y * bm;
        cnt = min(bm, T - off);
        return true;
    }
    const int e = blockIdx.y;
    cnt = counts[e];
    if (cnt == 0) return false;
    off = plan_first_pair(counts, e);
    We = W + (size_t)(e / world) * estride;
    return true;
}

/* A tile's bm rows from pair c0 on (the last pair repeated past cnt): x row (pair / x_div when
 * grouped) and y row (-1 past cnt), filled by the nthreads threads of the block. */
static __device__ __forceinline__ void plan_tile_rows(int *xrow, int *yrow, int bm, int nthreads, int off, int c0,
                                                      int cnt, const int32_t *__restrict__ sorted,
                                                      const int32_t *__restrict__ counts, int x_div) {
    for (int i = threadIdx.x; i < bm; i += nthreads) {
        const int k = off + min(c0 + i, cnt - 1), p = counts ? sorted[k] : k;
        xrow[i] = counts ? p / x_div : p;
        yrow[i] = c0 + i < cnt ? p : -1;
    }
}

/* mma.sync m16n8k16 bf16 x bf16 -> fp32, c += a b (fragments in the PTX ISA's layout). */
static __device__ __forceinline__ void mlacu_mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the same with fp16 operands */
static __device__ __forceinline__ void mlacu_mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ldmatrix .x4: four 8x8 b16 matrices from shared memory; lane i gives the address of row i % 8
 * of matrix i / 8 and receives in r[j] its two elements of matrix j (row lane / 4, columns
 * 2 (lane % 4), +1; with _t the matrix transposed). */
static __device__ __forceinline__ void mlacu_ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void mlacu_ldsm_x4_t(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* cp.async (sm_80+): 16, 8 or 4 bytes global -> shared without registers; commit closes a group;
 * wait_all returns when all of this thread's groups have landed. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
/* 16 bytes, or (valid false) 16 zero bytes without reading src */
static __device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async8(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() { /* all but the newest N groups */
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

/* Bulk copies (TMA, sm_90+) into shared memory, their completion counted on an mbarrier: init
 * with the number of arrivals a phase takes; expect = one arrival that also expects `bytes` of
 * copies; wait returns once the phase of that parity has completed. */
static __device__ __forceinline__ uint32_t mlacu_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void mlacu_mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mlacu_smem_u32(bar)), "r"(count) : "memory");
}
/* after a thread's mbarrier inits, before the barriers are used by other threads or the copy
 * engine */
static __device__ __forceinline__ void mlacu_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
static __device__ __forceinline__ void mlacu_mbar_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mlacu_smem_u32(bar)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mlacu_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mlacu_smem_u32(bar)) : "memory");
}
static __device__ __forceinline__ void mlacu_mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n MBAR_WAIT%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra MBAR_WAIT%=;\n}\n" ::"r"(mlacu_smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}
/* one arrival on bar once the calling thread's cp.async copies so far have landed (counted in the
 * barrier's init count: noinc) */
static __device__ __forceinline__ void mlacu_cp_async_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mlacu_smem_u32(bar)) : "memory");
}
/* named barriers: sync waits until n threads (a multiple of 32) have reached barrier id (sync or
 * arrive); arrive counts the caller without waiting */
static __device__ __forceinline__ void mlacu_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void mlacu_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* bytes (a multiple of 16) from 16-aligned global src to 16-aligned shared dst */
static __device__ __forceinline__ void mlacu_bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     mlacu_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(mlacu_smem_u32(bar))
                 : "memory");
}

/* Weights a step reads once (the streamed GEMVs' and the head products' bulk copies) enter the L2
 * marked to be evicted first: tens of MB of them pass through it a layer, and with the default
 * priority they push out what the next layers read there again (the kernels' code, the
 * activations, the cache rows), so that a kernel's first instructions and loads come from HBM. */
static __device__ __forceinline__ uint64_t mlacu_l2_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
/* mlacu_bulk_g2s of data read once: L2 priority evict first (mlacu_l2_evict_first) */
static __device__ __forceinline__ void mlacu_bulk_g2s_once(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;\n" ::"r"(mlacu_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(mlacu_smem_u32(bar)), "l"(mlacu_l2_evict_first())
                 : "memory");
}

/* fp16 pairs as their bits and back */
static __device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(uint32_t *)&h; }
static __device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(__half2 *)&u; }
/* Four bytes 0..255 (b0..b3 of u) as fp16 pairs (b0, b1), (b2, b3), each plus 1024: the half
 * with bits 0x64XX is 1024 + XX. */
static __device__ __forceinline__ void bytes_h2(uint32_t u, __half2 &lo, __half2 &hi) {
    lo = bits_h2(__byte_perm(u, 0x64646464u, 0x4140));
    hi = bits_h2(__byte_perm(u, 0x64646464u, 0x4342));
}

/* the current device's multiprocessor count (read once a process; 132, an H100/H200's, if the
 * query fails) */
static inline int mlacu_sm_count(void) {
    static int nsm = 0;
    if (!nsm) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess)
            nsm = 132;
    }
    return nsm;
}

/* The device configuration the kernels choose by: the architecture, the largest opt-in dynamic
 * shared memory a block, and whether sm_90a-only instructions (wgmma, setmaxnreg) may run. The
 * switch MLA_CUDA_SMEM_CAP (common/mla_switch.c) lets an H100/H200 run the configuration of a
 * smaller part: sm120 caps every kernel's shared memory at 99 KB a block (101376 bytes, what a
 * compute capability 12.x device gives) and turns the sm_90a-only kernels off; sm100 does the
 * same at 227 KB (232448 bytes, compute capability 10.0). Bulk copies (TMA), mbarriers and
 * programmatic dependent launch are sm_90+ and stay on: sm_100 and sm_120 have them. Every kernel
 * sizes its shared memory by mlacu_smem_optin() and allows it through mlacu_smem_allow; every
 * wgmma chooser asks mlacu_hopper_isa(). Read once a process. */
constexpr int MLACU_SMEM_SM120 = 99 << 10, MLACU_SMEM_SM100 = 227 << 10;
struct mlacu_devcfg {
    int arch;       /* the device's compute capability, major * 10 + minor (0: the query failed) */
    int arch_as;    /* the architecture the kernels choose for: arch, or the cap's (120, 100) */
    int smem_dev;   /* the device's opt-in shared memory a block (48 KB if the query failed) */
    int smem_optin; /* what the kernels may use: smem_dev, or less under the cap */
    bool hopper;    /* sm_90a-only instructions allowed: a 9.0 device and no cap */
};
static inline const mlacu_devcfg &mlacu_devcfg_get(void) {
    static const mlacu_devcfg c = [] {
        mlacu_devcfg v = {0, 0, 48 << 10, 48 << 10, false};
        int dev = 0, major = 0, minor = 0, sm = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
            v.arch = major * 10 + minor;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess)
            v.smem_dev = sm;
        v.arch_as = v.arch;
        v.smem_optin = v.smem_dev;
        v.hopper = v.arch == 90;
        const char *cap = mla_sw_str(MLA_SW_CUDA_SMEM_CAP);
        if (cap && !strcmp(cap, "sm120")) {
            v.arch_as = 120;
            v.smem_optin = std::min(v.smem_dev, MLACU_SMEM_SM120);
            v.hopper = false;
        } else if (cap && !strcmp(cap, "sm100")) {
            v.arch_as = 100;
            v.smem_optin = std::min(v.smem_dev, MLACU_SMEM_SM100);
            v.hopper = false;
        }
        return v;
    }();
    return c;
}

/* the largest opt-in dynamic shared memory a block the kernels may use (the device's, or the
 * cap's; 48 KB, what every device gives, if the query fails) */
static inline int mlacu_smem_optin(void) { return mlacu_devcfg_get().smem_optin; }

/* whether sm_90a-only instructions (wgmma, setmaxnreg) may run: a compute capability 9.0 device
 * with no MLA_CUDA_SMEM_CAP */
static inline bool mlacu_hopper_isa(void) { return mlacu_devcfg_get().hopper; }

/* Allows kernel kern `bytes` of dynamic shared memory (past 48 KB a kernel must opt in); with its
 * static shared memory more than mlacu_smem_optin() is refused (cudaErrorInvalidValue), as the
 * device whose limit that is refuses it. */
template <class K> static inline cudaError_t mlacu_smem_allow(K kern, size_t bytes) {
    cudaFuncAttributes fa;
    cudaError_t err = cudaFuncGetAttributes(&fa, kern);
    if (err != cudaSuccess) return err;
    if (bytes + fa.sharedSizeBytes > (size_t)mlacu_smem_optin()) return cudaErrorInvalidValue;
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}
/* mlacu_smem_allow for kernel K once a process (one device a process, or ranks of one process on
 * one device): later calls return cudaSuccess once a call has succeeded */
template <auto K> static inline cudaError_t mlacu_smem_allow_once(size_t bytes) {
    static bool done = false;
    if (done) return cudaSuccess;
    const cudaError_t err = mlacu_smem_allow(K, bytes);
    done = err == cudaSuccess;
    return err;
}

static inline int mlacu_fail_(mla_err *e, cudaError_t err) {
    if (e) {
        size_t n = strlen(e->msg);
        snprintf(e->msg + n, sizeof e->msg - n, ": CUDA error %s (%s)", cudaGetErrorName(err),
                 cudaGetErrorString(err));
    }
    return MLA_ERR;
}

/* A rope_table (kernels/rope.h) of up to D rotary dimensions as a kernel argument. */
template <int D> struct mlacu_rope_k {
    int n_dims;
    double attn_factor;
    double inv_freq[D / 2];
};
template <int D> static inline mlacu_rope_k<D> mlacu_rope_args(const rope_table *t) {
    MLA_ASSERT(t->n_dims <= D);
    mlacu_rope_k<D> rk;
    rk.n_dims = t->n_dims;
    rk.attn_factor = t->attn_factor;
    for (int i = 0; i < t->n_dims / 2; i++) rk.inv_freq[i] = t->inv_freq[i];
    return rk;
}

/* Token position p's rotation of n_vec vectors (stride apart) at xt (rope_apply's); the whole
 * block calls it, tcs / tsn shared memory of n_dims / 2 floats each. cos/sin in double as the CPU
 * does. */
template <typename RK>
static __device__ __forceinline__ void mlacu_rope_token(const RK &rk, int mode, float *xt, int64_t n_vec, int64_t stride,
                                                        int64_t p, float *tcs, float *tsn) {
    const int h = rk.n_dims / 2;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        double s, c;
        sincos((double)p * rk.inv_freq[i], &s, &c);
        tcs[i] = (float)(c * rk.attn_factor);
        tsn[i] = (float)(s * rk.attn_factor);
    }
    __syncthreads();
#pragma unroll 4
    for (int k = threadIdx.x; k < (int)(n_vec * h); k += blockDim.x) {
        const int v = k / h, i = k % h;
        const float cs = tcs[i], sn = tsn[i];
        float *yv = xt + v * stride;
        int i0 = mode == ROPE_ADJACENT ? 2 * i : i;
        int i1 = mode == ROPE_ADJACENT ? 2 * i + 1 : i + h;
        float a = yv[i0], b = yv[i1];
        yv[i0] = a * cs - b * sn;
        yv[i1] = a * sn + b * cs;
    }
}

#endif
