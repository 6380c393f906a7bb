/* allreduce_cuda: one-shot all-reduce through peer memory (allreduce_cuda.h). */
#include "kernels/allreduce_cuda.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* The block's barrier with the same block of every rank: thread r < world signals rank r and
 * waits for rank r's signal. which: 0 start, 1 end. */
static __device__ __forceinline__ void ar_barrier(const mla_ar_peers &p, int which, uint32_t gen) {
    const int r = threadIdx.x;
    if (which) { /* every read of the peers' inputs by this block is done before the signal */
        __syncthreads();
    }
    if (r < p.world) {
        __threadfence_system();
        ar_sig *peer = (ar_sig *)p.sig[r], *own = (ar_sig *)p.sig[p.rank];
        st_release_sys(which ? &peer->end[blockIdx.x][p.rank] : &peer->start[blockIdx.x][p.rank], gen);
        const uint32_t *f = which ? &own->end[blockIdx.x][r] : &own->start[blockIdx.x][r];
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

static __device__ __forceinline__ uint32_t ar_next_gen(const mla_ar_peers &p) {
    __shared__ uint32_t g;
    if (threadIdx.x == 0) g = ((ar_sig *)p.sig[p.rank])->gen[blockIdx.x] + 1;
    __syncthreads();
    return g;
}

static __device__ __forceinline__ void ar_done(const mla_ar_peers &p, uint32_t gen) {
    if (threadIdx.x == 0) ((ar_sig *)p.sig[p.rank])->gen[blockIdx.x] = gen;
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
    const uint32_t gen = ar_next_gen(p);
    ar_barrier(p, 0, gen);
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
    ar_barrier(p, 1, gen);
    ar_done(p, gen);
}

/* one block a row: the sum, the residual add, the RMSNorm */
__global__ void __launch_bounds__(1024) k_ar_add_rmsnorm(const mla_ar_peers p, int64_t E, float *__restrict__ x,
                                                          const float *__restrict__ w, float eps,
                                                          float *__restrict__ h) {
    const uint32_t gen = ar_next_gen(p);
    ar_barrier(p, 0, gen);
    const size_t row = (size_t)blockIdx.x * (size_t)E;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
        const float v = x[row + i] + ar_elem(p, row + i);
        x[row + i] = v;
        ss += v * v;
    }
    ar_barrier(p, 1, gen); /* (its __syncthreads also orders the x writes before the reads below) */
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(red[0] / (float)E + eps);
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) h[row + i] = x[row + i] * scale * w[i];
    ar_done(p, gen);
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

extern "C" int mla_cuda_ar_add_rmsnorm(const mla_ar_peers *p, int64_t T, int64_t E, float *x, const float *w,
                                       float eps, float *h, cudaStream_t st, mla_err *err) {
    if (ar_check(p, err)) return MLA_ERR;
    if (T < 1 || T > MLA_AR_MAX_BLOCKS || E < 1)
        return mla_errf(err, "one-shot all-reduce + RMSNorm: %lld rows of %lld (1 to %d rows)", (long long)T,
                        (long long)E, MLA_AR_MAX_BLOCKS);
    if ((const float *)x == p->buf[p->rank] || (const float *)h == p->buf[p->rank])
        return mla_errf(err, "one-shot all-reduce + RMSNorm: x or h aliases the rank's input");
    k_ar_add_rmsnorm<<<(unsigned)T, 1024, 0, st>>>(*p, E, x, w, eps, h);
    return ar_launched("sum + RMSNorm", err);
}

extern "C" int mla_cuda_ar_failed(const void *sig, int *failed, mla_err *err) {
    uint32_t f = 0;
    cudaError_t e = cudaMemcpy(&f, (const char *)sig + offsetof(ar_sig, failed), sizeof f, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return mla_errf(err, "one-shot all-reduce: reading the signal area: %s", cudaGetErrorString(e));
    *failed = f != 0;
    return MLA_OK;
}
