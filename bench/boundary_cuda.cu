/* mla-boundary: what a dependency between two phases of a decode step costs on the GPU, by the
 * mechanism that orders them (issue 34: whether a persistent layer kernel would wait less than
 * the chained launches of today).
 *
 * A phase models a small GEMV of a batch-1 step: every block (one an SM) copies its share of the
 * phase's weights (P bytes in all, other bytes each phase) into shared memory by cp.async, reads
 * the vector the phase before wrote, and writes its rows of the next one. K phases run in a CUDA
 * graph as:
 *   graph      K launches, plain stream order
 *   pdl        K launches with programmatic dependent launch: a block copies its weights, waits on
 *              the launch before (griddepcontrol.wait), then lets the next launch be scheduled
 *              (the rule of kernels/cuda_internal.h)
 *   pdl-early  the same, the next launch let in before the wait
 *   flag       the same launches, each let in at once, but a block waits on a counter that the
 *              blocks of the launch before raise once their rows are stored (release / acquire),
 *              not on the grid's completion. No deadlock: a launch starts only once every block of
 *              the one before has let it in, so the blocks it waits on are resident.
 *   persist    one launch of K phases, a block an SM (all resident on an idle GPU: checked by
 *              the occupancy query): a block copies the next phase's weights, then meets the
 *              others at a grid barrier (one counter), then dots them
 * Every mode computes the same last vector (checked: exit 1 if not). Prints microseconds a phase
 * and what is left after its bytes at the copy rate.
 *
 * With -c, what a phase's code size costs instead: K launches (pdl) of 128 threads a block, one
 * block an SM, each thread 8 chains of F multiply-adds on the vector the launch before wrote, as
 *   loop       one loop of 8 a step (a few hundred bytes of code)
 *   flat       the same instructions unrolled (F x 128 bytes of code), one kernel every phase
 *   flat xR    R such kernels, each its own code, taking turns (R x F x 128 bytes a round)
 *   loop xR    R loop kernels taking turns
 * The same multiply-adds in the same order: every form computes the same last vector (checked).
 * Then the loop form again, with and without a one-block branch on a second stream beside each
 * phase, joined before the next one (loop+join: what a join costs the chain in a graph).
 *
 *   mla-boundary [-k PHASES (64)] [-r GB/s (4208)] [-s SHARED_KB (160)] [-c]
 *
 * SHARED_KB sets a block's shared memory (at least what its share of a phase needs): 160 leaves
 * one block an SM, as the streamed GEMV's stages do; 48 lets blocks of the next launch in beside.
 * Measured on an H200: bench/results/boundary-h200-2026-12-04.md. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#include "tests/gpu/cuda_check.h"

#define CK(x) MLA_CUDA_EXIT_ON_ERROR(x, 1)

enum { THREADS = 256, N = 2048, MODES = 5 };

struct args {
    const uint4 *w; /* K phases x pb bytes */
    float *v;       /* (K + 1) x N: the vector before each phase */
    unsigned *cnt;  /* flag: a counter a phase; persist: cnt[0] the grid barrier */
    size_t pb;      /* bytes a phase (a multiple of 16) */
    int k;          /* the phase (chained modes) or the phase count (persist) */
};

__device__ __forceinline__ void cp16(void *s, const void *g) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g) : "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* 16-byte pieces of a block's share of one phase */
__host__ __device__ inline size_t share_pieces(size_t pb, unsigned blocks) { return (pb / 16 + blocks - 1) / blocks; }

/* this block's share of phase k's weights into s (one commit group); returns its piece count */
__device__ size_t load_w(const args &a, int k, uint4 *s) {
    const size_t n16 = a.pb / 16, per = share_pieces(a.pb, gridDim.x), b0 = per * blockIdx.x;
    const size_t b1 = b0 + per < n16 ? b0 + per : n16;
    for (size_t i = b0 + threadIdx.x; i < b1; i += THREADS) cp16(s + (i - b0), a.w + (size_t)k * n16 + i);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    return b1 > b0 ? b1 - b0 : 0;
}

/* the phase's arithmetic over the n pieces in s and vector k: this block's rows of vector k + 1
 * (each the block's sum, scaled to nothing, plus its index: the same in every mode) */
__device__ void dot_store(const args &a, int k, const uint4 *s, size_t n, float *red) {
    const float *x = a.v + (size_t)k * N;
    float acc = 0.f;
    for (size_t i = threadIdx.x; i < n; i += THREADS) {
        const uint4 q = s[i];
        acc += (float)(q.x & 255) * x[(i * 4) % N] + (float)(q.y & 255) * x[(i * 4 + 1) % N] +
               (float)(q.z & 255) * x[(i * 4 + 2) % N] + (float)(q.w & 255) * x[(i * 4 + 3) % N];
    }
    acc += x[threadIdx.x * 8 % N]; /* every thread reads the vector */
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < THREADS / 32 ? red[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        for (int r = blockIdx.x * 32 + threadIdx.x; r < N; r += gridDim.x * 32)
            a.v[(size_t)(k + 1) * N + r] = t * 1e-9f + (float)r;
    }
    __syncthreads();
}

extern __shared__ uint4 smem[];

/* EARLY false: pdl (wait, then let the next launch in); true: pdl-early (a.cnt NULL) or flag */
template <bool EARLY> __global__ void __launch_bounds__(THREADS) chain_kernel(args a) {
    __shared__ float red[THREADS / 32];
    if (EARLY) pdl_trigger();
    const size_t n = load_w(a, a.k, smem); /* weights: no launch before writes them */
    if (!EARLY) {
        pdl_wait();
        pdl_trigger();
    } else if (!a.cnt) {
        pdl_wait();
    } else if (a.k > 0) {
        if (threadIdx.x == 0)
            while (ld_acquire(&a.cnt[a.k - 1]) < gridDim.x) {
            }
        __syncthreads();
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    dot_store(a, a.k, smem, n, red);
    if (EARLY && a.cnt && threadIdx.x == 0) { /* the rows are stored (dot_store's last barrier) */
        __threadfence();
        atomicAdd(&a.cnt[a.k], 1u);
    }
}

__global__ void __launch_bounds__(THREADS) persist_kernel(args a) {
    __shared__ float red[THREADS / 32];
    const size_t half = share_pieces(a.pb, gridDim.x);
    size_t n = load_w(a, 0, smem);
    for (int k = 0; k < a.k; k++) {
        size_t nn = 0;
        if (k + 1 < a.k) nn = load_w(a, k + 1, smem + ((k + 1) & 1) * half);
        if (k > 0) { /* the grid barrier: vector k is stored */
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                atomicAdd(&a.cnt[0], 1u);
                const unsigned target = (unsigned)k * gridDim.x;
                while (ld_acquire(&a.cnt[0]) < target) {
                }
            }
            __syncthreads();
        }
        if (k + 1 < a.k) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();
        dot_store(a, k, smem + (k & 1) * half, n, red);
        n = nn;
    }
}

/* a captured graph of K phases: instantiated, run 3 times, then timed over 20 runs (both freed);
 * microseconds a phase */
static double graph_us(cudaGraph_t g, cudaStream_t st, int K) {
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 20;
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms * 1e3 / reps / K;
}

/* ---- code size (-c) */
enum { CODE_THREADS = 128, CODE_ROT = 8 };
/* multiplier j of kernel s: each kernel its own constants, so its own code */
__host__ __device__ constexpr float code_mul(int s, int j) { return 1.0f - (float)(s * 8 + j + 1) * 0x1p-20f; }
/* phase a.k: 8 chains of F steps from vector k, their sum into vector k + 1 (FLAT: unrolled) */
template <int S, int F, bool FLAT> __global__ void __launch_bounds__(CODE_THREADS) code_kernel(args a) {
    pdl_wait();
    pdl_trigger();
    const float *x = a.v + (size_t)a.k * N;
    float c[8];
#pragma unroll
    for (int j = 0; j < 8; j++) c[j] = x[(blockIdx.x * CODE_THREADS + threadIdx.x + j * 97) % N];
    if (FLAT) {
#pragma unroll
        for (int f = 0; f < F; f++)
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] = fmaf(c[j], code_mul(S, j), 0.5f);
    } else {
#pragma unroll 1
        for (int f = 0; f < F; f++)
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] = fmaf(c[j], code_mul(S, j), 0.5f);
    }
    const float t = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
    const int r = blockIdx.x * CODE_THREADS + threadIdx.x;
    if (r < N) a.v[(size_t)(a.k + 1) * N + r] = t;
}

using code_fn = void (*)(args);
template <int F, bool FLAT, int... S> static void code_table(code_fn *t, std::integer_sequence<int, S...>) {
    const code_fn f[] = {code_kernel<S, F, FLAT>...};
    for (size_t i = 0; i < sizeof...(S); i++) t[i] = f[i];
}

/* the -c table: F steps (code of F x 128 bytes unrolled) */
template <int F> static int code_run(int K, float *v, cudaStream_t st, int sms) {
    code_fn flat[CODE_ROT], loop[CODE_ROT];
    code_table<F, true>(flat, std::make_integer_sequence<int, CODE_ROT>{});
    code_table<F, false>(loop, std::make_integer_sequence<int, CODE_ROT>{});
    struct form {
        const char *name;
        code_fn *fn;
        int rot;
    } forms[] = {{"loop", loop, 1}, {"flat", flat, 1}, {"flat x2", flat, 2}, {"flat x8", flat, 8}, {"loop x8", loop, 8}};
    const int nf = (int)(sizeof forms / sizeof forms[0]);
    float last[8];
    for (int fi = 0; fi < nf; fi++) {
        CK(cudaMemsetAsync(v + N, 0, sizeof(float) * N * K, st));
        for (int i = 0; i < N; i += 256) { /* vector 0: the same start for every form */
            float h[256];
            for (int j = 0; j < 256; j++) h[j] = (float)((i + j) % 17) * 0.125f;
            CK(cudaMemcpyAsync(v + i, h, sizeof h, cudaMemcpyHostToDevice, st));
        }
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < K; k++) {
            /* phase k runs kernel k % rot of the form (the check below compares forms of one
             * rotation: their kernels take the same constants) */
            args a = {nullptr, v, nullptr, 0, k};
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)sms);
            cfg.blockDim = dim3(CODE_THREADS);
            cfg.stream = st;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, forms[fi].fn[k % forms[fi].rot], a));
        }
        CK(cudaStreamEndCapture(st, &g));
        const double us = graph_us(g, st, K);
        CK(cudaMemcpy(&last[fi], v + (size_t)K * N + 5, 4, cudaMemcpyDeviceToHost));
        printf("%-10s %9d %10d %10.2f\n", forms[fi].name, F, F * 8 * 16 * forms[fi].rot, us);
    }
    int bad = 0; /* flat == loop (one kernel); flat x8 == loop x8; flat x2 is flat x8's first two */
    if (last[1] != last[0] || last[3] != last[4]) {
        fprintf(stderr, "mla-boundary: flat and loop forms differ at %d steps (%g %g, %g %g)\n", F, last[1], last[0],
                last[3], last[4]);
        bad = 1;
    }
    return bad;
}

/* the -c table's last rows: a chain of loop phases of F steps, plain or with a branch forked beside
 * each phase (a one-block phase on a second stream, into a vector of its own) and joined before
 * the next one, as a decode step's shared expert runs beside the router (us a phase) */
template <int F> static void join_run(int K, float *v, cudaStream_t st, int sms) {
    cudaStream_t st2;
    cudaEvent_t evf, evj;
    float *v2;
    CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&evf, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&evj, cudaEventDisableTiming));
    CK(cudaMalloc(&v2, sizeof(float) * N * 2));
    CK(cudaMemset(v2, 0, sizeof(float) * N * 2));
    for (int join = 0; join < 2; join++) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < K; k++) {
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.blockDim = dim3(CODE_THREADS);
            cfg.attrs = at;
            cfg.numAttrs = 1;
            const bool fork = join && k + 1 < K;
            if (fork) {
                CK(cudaEventRecord(evf, st));
                CK(cudaStreamWaitEvent(st2, evf, 0));
                args a2 = {nullptr, v2, nullptr, 0, 0};
                cfg.gridDim = dim3(1);
                cfg.stream = st2;
                CK(cudaLaunchKernelEx(&cfg, code_kernel<1, 32, false>, a2));
                CK(cudaEventRecord(evj, st2));
            }
            args a = {nullptr, v, nullptr, 0, k};
            cfg.gridDim = dim3((unsigned)sms);
            cfg.stream = st;
            CK(cudaLaunchKernelEx(&cfg, code_kernel<0, F, false>, a));
            if (fork) CK(cudaStreamWaitEvent(st, evj, 0));
        }
        CK(cudaStreamEndCapture(st, &g));
        const double us = graph_us(g, st, K);
        printf("%-10s %9d %10s %10.2f\n", join ? "loop+join" : "loop", F, "-", us);
    }
    CK(cudaFree(v2));
    CK(cudaEventDestroy(evf));
    CK(cudaEventDestroy(evj));
    CK(cudaStreamDestroy(st2));
}

static int usage(void) {
    fprintf(stderr,
            "usage: mla-boundary [-k PHASES (2-1024, 64)] [-r GB/s (4208)] [-s SHARED_KB (16-227, 160)] [-c]\n");
    return 2;
}

int main(int argc, char **argv) {
    int K = 64, smem_kb = 160;
    double gbs = 4208;
    bool code = false;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-c")) {
            code = true;
            i--;
            continue;
        }
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "-k")) K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) gbs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) smem_kb = atoi(argv[i + 1]);
        else return usage();
    }
    if (K < 2 || K > 1024 || smem_kb < 16 || smem_kb > 227 || !(gbs > 0)) return usage();
    int sms = 0, optin = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    const size_t pbs[] = {0, 1u << 20, 4u << 20, 8u << 20}, maxpb = 8u << 20;
    uint4 *w;
    float *v;
    unsigned *cnt;
    CK(cudaMalloc(&w, maxpb * K + 16));
    CK(cudaMemset(w, 1, maxpb * K + 16));
    CK(cudaMalloc(&v, sizeof(float) * N * (K + 1)));
    CK(cudaMemset(v, 0, sizeof(float) * N * (K + 1)));
    CK(cudaMalloc(&cnt, sizeof(unsigned) * (K + 1)));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (code) {
        printf("# %d SMs, %d phases, one block of %d threads an SM\n", sms, K, CODE_THREADS);
        printf("%-10s %9s %10s %10s\n", "form", "steps", "code B", "us/phase");
        const int bad = code_run<32>(K, v, st, sms) | code_run<128>(K, v, st, sms) | code_run<512>(K, v, st, sms);
        join_run<128>(K, v, st, sms);
        CK(cudaFree(w));
        CK(cudaFree(v));
        CK(cudaFree(cnt));
        CK(cudaStreamDestroy(st));
        return bad;
    }
    const char *names[MODES] = {"graph", "pdl", "pdl-early", "flag", "persist"};
    printf("# %d SMs, %d phases, %d KB of shared memory a block, copy rate %.0f GB/s\n", sms, K, smem_kb, gbs);
    printf("%-10s %9s %10s %14s\n", "mode", "MB/phase", "us/phase", "us past bytes");
    int bad = 0;
    for (size_t pb : pbs) {
        /* a block's share of one phase (two for persist), or the size asked for */
        const size_t need = (2 * share_pieces(pb, (unsigned)sms) + 1) * 16;
        const size_t sm = (size_t)smem_kb << 10 > need ? (size_t)smem_kb << 10 : need;
        if (sm > (size_t)optin) {
            fprintf(stderr, "mla-boundary: %zu bytes of shared memory a block, the device allows %d\n", sm, optin);
            return 1;
        }
        CK(cudaFuncSetAttribute(chain_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CK(cudaFuncSetAttribute(chain_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CK(cudaFuncSetAttribute(persist_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        int resident = 0; /* persist's grid barrier needs every block on an SM at once */
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persist_kernel, THREADS, sm));
        float last[MODES];
        for (int mode = 0; mode < MODES; mode++) {
            last[mode] = NAN;
            if (mode == 4 && resident < 1) {
                printf("%-10s %9.1f %10s %14s\n", names[mode], pb / 1048576.0, "-", "(a block does not fit an SM)");
                continue;
            }
            cudaGraph_t g;
            CK(cudaMemsetAsync(v + N, 0, sizeof(float) * N * K, st)); /* no mode sees another's vectors */
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            CK(cudaMemsetAsync(cnt, 0, sizeof(unsigned) * (K + 1), st));
            for (int k = 0; k < (mode == 4 ? 1 : K); k++) {
                args a = {w, v, mode >= 3 ? cnt : nullptr, pb, mode == 4 ? K : k};
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3((unsigned)sms);
                cfg.blockDim = dim3(THREADS);
                cfg.dynamicSmemBytes = sm;
                cfg.stream = st;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = mode == 0 || mode == 4 ? 0 : 1;
                if (mode == 4) CK(cudaLaunchKernelEx(&cfg, persist_kernel, a));
                else if (mode <= 1) CK(cudaLaunchKernelEx(&cfg, chain_kernel<false>, a));
                else CK(cudaLaunchKernelEx(&cfg, chain_kernel<true>, a));
            }
            CK(cudaStreamEndCapture(st, &g));
            const double us = graph_us(g, st, K), bytes_us = (double)pb / (gbs * 1e3);
            CK(cudaMemcpy(&last[mode], v + (size_t)K * N + 5, 4, cudaMemcpyDeviceToHost));
            printf("%-10s %9.1f %10.2f %14.2f\n", names[mode], pb / 1048576.0, us, us - bytes_us);
        }
        for (int mode = 1; mode < MODES; mode++)
            if (!isnan(last[mode]) && last[mode] != last[0]) {
                fprintf(stderr, "mla-boundary: %s's last vector differs from graph's at %.1f MB a phase (%g, %g)\n",
                        names[mode], pb / 1048576.0, last[mode], last[0]);
                bad = 1;
            }
    }
    CK(cudaFree(w));
    CK(cudaFree(v));
    CK(cudaFree(cnt));
    CK(cudaStreamDestroy(st));
    return bad;
}
