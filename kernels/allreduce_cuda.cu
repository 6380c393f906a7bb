/* allreduce_cuda: one-shot all-reduce through peer memory (allreduce_cuda.h). */
#include "kernels/allreduce_cuda.h"

#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/rmsnorm_row_cuda.h"

using namespace mlacu_rn;

typedef struct ar_sig {
    uint32_t start[MLA_AR_MAX_BLOCKS][MLA_AR_MAX_RANKS]; /* [block][from rank]: its generation */
    uint32_t end[MLA_AR_MAX_BLOCKS][MLA_AR_MAX_RANKS];
    uint32_t gen[MLA_AR_MAX_BLOCKS]; /* this rank's calls so far, per block (only it writes) */
    uint32_t failed;
} ar_sig;

/* a peer that does not arrive within this many clock cycles (~10 s) fails the wait */
#define AR_SPIN_CYCLES (1ll << 34)

static __device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Block blk's barrier with the same block of every rank: thread r < world signals rank r and
 * waits for rank r's signal. which: 0 start, 1 end. */
static __device__ __forceinline__ void ar_barrier(const mla_ar_peers &p, int which, uint32_t gen, int blk) {
    const int r = threadIdx.x;
    if (which) { /* every read of the peers' inputs by this block is done before the signal */
        __syncthreads();
    }
    if (r < p.world) {
        __threadfence_system();
        ar_sig *peer = (ar_sig *)p.sig[r], *own = (ar_sig *)p.sig[p.rank];
        st_release_sys(which ? &peer->end[blk][p.rank] : &peer->start[blk][p.rank], gen);
        const uint32_t *f = which ? &own->end[blk][r] : &own->start[blk][r];
        const long long t0 = clock64();
        while ((int32_t)(ld_acquire_sys(f) - gen) < 0) {
            if (clock64() - t0 > AR_SPIN_CYCLES) {
                atomicExch(&own->failed, 1u);
                break;
            }
        }
    }
    __syncthreads();
}

static __device__ __forceinline__ uint32_t ar_next_gen(const mla_ar_peers &p, int blk) {
    __shared__ uint32_t g;
    if (threadIdx.x == 0) g = ((ar_sig *)p.sig[p.rank])->gen[blk] + 1;
    __syncthreads();
    return g;
}

static __device__ __forceinline__ void ar_done(const mla_ar_peers &p, uint32_t gen, int blk) {
    if (threadIdx.x == 0) ((ar_sig *)p.sig[p.rank])->gen[blk] = gen;
}

/* the sum of element i over the ranks, in rank order */
static __device__ __forceinline__ float ar_elem(const mla_ar_peers &p, size_t i) {
    float s = p.buf[0][i];
    for (int r = 1; r < p.world; r++) s += p.buf[r][i];
    return s;
}

/* each block sums its own contiguous slice (its end barrier then covers exactly what it read) */
__global__ void __launch_bounds__(256) k_ar_sum(const mla_ar_peers p, float *__restrict__ out, size_t n,
                                                size_t chunk) {
    const int blk = (int)blockIdx.x;
    const uint32_t gen = ar_next_gen(p, blk);
    ar_barrier(p, 0, gen, blk);
    const size_t b = (size_t)blockIdx.x * chunk, e = b + chunk < n ? b + chunk : n;
    if (p.world == 8) {
#pragma unroll 1
        for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) {
            float v[8];
#pragma unroll
            for (int r = 0; r < 8; r++) v[r] = p.buf[r][i]; /* the 8 loads in flight together */
            float s = v[0];
#pragma unroll
            for (int r = 1; r < 8; r++) s += v[r];
            out[i] = s;
        }
    } else {
        for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) out[i] = ar_elem(p, i);
    }
    ar_barrier(p, 1, gen, blk);
    ar_done(p, gen, blk);
}

/* The sum, the residual add and the RMSNorm (with Q8 also its q8 rounding) of T rows of E, as
 * mla_cuda_ar_sum then mla_cuda_rmsnorm_ex with the sum as the residual: the same bits. Block
 * (j, t) of a cluster of S = gridDim.x blocks a row (rn_slices) takes slice j of row t: it sums
 * the slice over the ranks (its own flag barriers, block t S + j), writes x + sum to xo, meets the
 * cluster's other blocks, then norms the whole row (rms_row over xo, from the L2) and writes its
 * slice of h and of the q8 rounding, as the sliced rmsnorm_kernel does. */
template <bool Q8>
__global__ void __launch_bounds__(RN_T) k_ar_add_rmsnorm(const mla_ar_peers p, int E, const float *x,
                                                          float *xo, const float *__restrict__ w, float eps,
                                                          float *__restrict__ h, int8_t *q, float4 *qs) {
    const int S = (int)gridDim.x, t = (int)blockIdx.y, blk = t * S + (int)blockIdx.x;
    const size_t row = (size_t)t * (size_t)E;
    int k0, k1;
    rn_slice((int)blockIdx.x, S, k0, k1);
    const uint32_t gen = ar_next_gen(p, blk);
    ar_barrier(p, 0, gen, blk);
    for (int k = k0; k < k1; k++) {
        const int i = (int)threadIdx.x + k * RN_T;
        if (i < E) xo[row + i] = x[row + i] + ar_elem(p, row + i);
    }
    ar_barrier(p, 1, gen, blk); /* its __syncthreads orders this block's xo writes before the reads below */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (S > 1) cooperative_groups::this_cluster().sync(); /* and the other blocks' (release, acquire) */
#elif defined(__CUDA_ARCH__)
    if (S > 1) __trap(); /* code for a device without clusters run as a cluster (a JIT of older PTX) */
#endif
    __shared__ float red[32];
    float *hr = h + row;
    rms_row<false, Q8, false>(xo + row, nullptr, nullptr, E, w, eps, red, Q8 ? q + row : nullptr,
                              Q8 ? qs + row / 32 : nullptr, nullptr, nullptr, k0, k1,
                              [&](int i, float v) { hr[i] = v; });
    ar_done(p, gen, blk);
}

static int ar_check(const mla_ar_peers *p, mla_err *err) {
    if (p->world < 2 || p->world > MLA_AR_MAX_RANKS || p->rank < 0 || p->rank >= p->world)
        return mla_errf(err, "one-shot all-reduce: rank %d of %d ranks (2 to %d ranks)", p->rank, p->world,
                        MLA_AR_MAX_RANKS);
    for (int r = 0; r < p->world; r++)
        if (!p->buf[r] || !p->sig[r]) return mla_errf(err, "one-shot all-reduce: rank %d's buffers are not mapped", r);
    return MLA_OK;
}

static int ar_launched(const char *what, mla_err *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return mla_errf(err, "one-shot all-reduce: %s launch: %s", what, cudaGetErrorString(e));
    return MLA_OK;
}

extern "C" size_t mla_cuda_ar_sig_bytes(void) { return sizeof(ar_sig); }

extern "C" int mla_cuda_ar_sig_init(void *sig, cudaStream_t st, mla_err *err) {
    cudaError_t e = cudaMemsetAsync(sig, 0, sizeof(ar_sig), st);
    if (e != cudaSuccess) return mla_errf(err, "one-shot all-reduce: signal area: %s", cudaGetErrorString(e));
    return MLA_OK;
}

extern "C" int mla_cuda_ar_sum(const mla_ar_peers *p, float *out, size_t n, cudaStream_t st, mla_err *err) {
    if (ar_check(p, err)) return MLA_ERR;
    if (out == p->buf[p->rank]) return mla_errf(err, "one-shot all-reduce: the output aliases the rank's input");
    if (n == 0) return MLA_OK;
    /* ~4 K floats a block, at most MLA_AR_MAX_BLOCKS blocks */
    size_t blocks = (n + 4095) / 4096;
    if (blocks > MLA_AR_MAX_BLOCKS) blocks = MLA_AR_MAX_BLOCKS;
    const size_t chunk = (n + blocks - 1) / blocks;
    blocks = (n + chunk - 1) / chunk;
    k_ar_sum<<<(unsigned)blocks, 256, 0, st>>>(*p, out, n, chunk);
    return ar_launched("sum", err);
}

/* whether the device runs clusters (a row of more than one block: rn_slices) */
static bool ar_clusters(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0, c = 0;
        v = cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&c, cudaDevAttrClusterLaunch, dev) == cudaSuccess && c;
    }
    return v != 0;
}

extern "C" int mla_cuda_ar_add_rmsnorm_fits(int64_t T, int64_t E) {
    if (T < 1 || E < 1 || E > RN_T * RN_V) return 0;
    const int S = (int)rn_slices(E);
    return T * S <= MLA_AR_MAX_BLOCKS && (S == 1 || ar_clusters());
}

extern "C" int mla_cuda_ar_add_rmsnorm(const mla_ar_peers *p, int64_t T, int64_t E, const float *x, float *xo,
                                       const float *w, float eps, float *h, void *q8, cudaStream_t st,
                                       mla_err *err) {
    if (ar_check(p, err)) return MLA_ERR;
    if (!mla_cuda_ar_add_rmsnorm_fits(T, E))
        return mla_errf(err, "one-shot all-reduce + RMSNorm: %lld rows of %lld do not fit (rows of up to %d, %d blocks%s)",
                        (long long)T, (long long)E, RN_T * RN_V, MLA_AR_MAX_BLOCKS,
                        ar_clusters() ? "" : "; rows over one block need thread-block clusters");
    if (q8 && E % 32) return mla_errf(err, "one-shot all-reduce + RMSNorm: q8 rows of %lld (a multiple of 32)", (long long)E);
    const float *own = p->buf[p->rank];
    if (xo == own || h == own || (const float *)x == own)
        return mla_errf(err, "one-shot all-reduce + RMSNorm: x, xo or h aliases the rank's input");
    const int S = (int)rn_slices(E);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)S, (unsigned)T);
    cfg.blockDim = dim3(RN_T);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = S > 1 ? 1 : 0;
    int8_t *q = (int8_t *)q8;
    float4 *qs = q8 ? (float4 *)((uint8_t *)q8 + mlacu_q8_scale_off(T, E)) : nullptr;
    cudaError_t e = q8 ? cudaLaunchKernelEx(&cfg, k_ar_add_rmsnorm<true>, *p, (int)E, x, xo, w, eps, h, q, qs)
                       : cudaLaunchKernelEx(&cfg, k_ar_add_rmsnorm<false>, *p, (int)E, x, xo, w, eps, h, q, qs);
    if (e != cudaSuccess)
        return mla_errf(err, "one-shot all-reduce + RMSNorm: launch of %lld rows of %lld: %s", (long long)T,
                        (long long)E, cudaGetErrorString(e));
    return ar_launched("sum + RMSNorm", err);
}

extern "C" int mla_cuda_ar_failed(const void *sig, int *failed, mla_err *err) {
    uint32_t f = 0;
    cudaError_t e = cudaMemcpy(&f, (const char *)sig + offsetof(ar_sig, failed), sizeof f, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return mla_errf(err, "one-shot all-reduce: reading the signal area: %s", cudaGetErrorString(e));
    *failed = f != 0;
    return MLA_OK;
}
