/* The one-shot all-reduce (kernels/allreduce_cuda.h) on one GPU: N = 2 and 4 ranks as streams of
 * one process, each rank with its own input buffer and signal area, the peers' as plain pointers
 * (the same device). Every rank's kernel is launched on its own stream; they meet in the flag
 * barriers. Checked:
 * - the sum, on every rank, bit for bit against the host's sum in rank order (0, 1, ..., N-1),
 *   for sizes from 1 float to 32 x 7168, several calls in a row (the generation counter), and
 *   again replayed from a captured CUDA graph;
 * - the fused sum + residual add + RMSNorm: x bit for bit against the host's x + sum, h against
 *   the CPU reference (kernels/rmsnorm.c) within 2e-6 relative to the row's largest |h|, for
 *   GLM-5's and V3's hidden sizes (6144, 7168) at 1, 4 and 32 rows;
 * - no barrier wait timed out.
 * Needs a GPU; prints "test_allreduce_oneshot: ok" and exits 0 on success. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/allreduce_cuda.h"
extern "C" {
#include "kernels/rmsnorm.h"
}

static int fails = 0;
#define CHECK(c, ...)                                                                                                 \
    do {                                                                                                              \
        if (!(c)) {                                                                                                   \
            fails++;                                                                                                  \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n");                                                                                    \
        }                                                                                                             \
    } while (0)
#define CU(x)                                                                                                         \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess) {                                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)
#define OK(x)                                                                                                         \
    do {                                                                                                              \
        if ((x) != MLA_OK) {                                                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err.msg);                                              \
            exit(1);                                                                                                  \
        }                                                                                                             \
    } while (0)

static uint64_t rs = 0x243F6A8885A308D3ull;
static float frand(void) { /* [-1, 1) with varied exponents, so that the order of the adds shows */
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    float u = (float)(rs >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    return u * ldexpf(1.0f, (int)((rs >> 8) % 12) - 6);
}

#define MAXN (32 * 7168)

typedef struct ranks {
    int n;
    float *in[MLA_AR_MAX_RANKS], *out[MLA_AR_MAX_RANKS], *x[MLA_AR_MAX_RANKS], *h[MLA_AR_MAX_RANKS];
    void *sig[MLA_AR_MAX_RANKS];
    cudaStream_t st[MLA_AR_MAX_RANKS];
    mla_ar_peers p[MLA_AR_MAX_RANKS];
} ranks;

static void ranks_init(ranks *R, int n) {
    mla_err err = {0};
    memset(R, 0, sizeof *R);
    R->n = n;
    for (int r = 0; r < n; r++) {
        CU(cudaMalloc((void **)&R->in[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->out[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->x[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->h[r], MAXN * 4));
        CU(cudaMalloc(&R->sig[r], mla_cuda_ar_sig_bytes()));
        CU(cudaStreamCreateWithFlags(&R->st[r], cudaStreamNonBlocking));
        OK(mla_cuda_ar_sig_init(R->sig[r], R->st[r], &err));
    }
    CU(cudaDeviceSynchronize());
    for (int r = 0; r < n; r++) {
        R->p[r].rank = r;
        R->p[r].world = n;
        for (int j = 0; j < n; j++) {
            R->p[r].buf[j] = R->in[j];
            R->p[r].sig[j] = R->sig[j];
        }
    }
}

static void ranks_free(ranks *R) {
    for (int r = 0; r < R->n; r++) {
        cudaFree(R->in[r]);
        cudaFree(R->out[r]);
        cudaFree(R->x[r]);
        cudaFree(R->h[r]);
        cudaFree(R->sig[r]);
        cudaStreamDestroy(R->st[r]);
    }
}

/* a timed-out barrier wait ends the test at once (the ranks' kernels did not run together) */
static void check_failed(const ranks *R, const char *what) {
    mla_err err = {0};
    for (int r = 0; r < R->n; r++) {
        int f = 0;
        OK(mla_cuda_ar_failed(R->sig[r], &f, &err));
        if (f) {
            fprintf(stderr, "FAIL: %s: N=%d rank %d: a barrier wait timed out\n", what, R->n, r);
            exit(1);
        }
    }
}

/* host inputs of every rank: inputs[r * count + i] */
static void fill(const ranks *R, float *hin, size_t count) {
    for (int r = 0; r < R->n; r++) {
        for (size_t i = 0; i < count; i++) hin[(size_t)r * count + i] = frand();
        CU(cudaMemcpy(R->in[r], hin + (size_t)r * count, count * 4, cudaMemcpyHostToDevice));
    }
}

static void test_sum(ranks *R, float *hin, float *want, float *got, int graph) {
    mla_err err = {0};
    static const size_t sizes[] = {1, 5, 255, 4096, 6144, 7168, 4097 * 3, 8 * 7168, 32 * 6144, 32 * 7168};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const size_t count = sizes[si];
        fill(R, hin, count);
        for (size_t i = 0; i < count; i++) {
            float s = hin[i];
            for (int r = 1; r < R->n; r++) s += hin[(size_t)r * count + i];
            want[i] = s;
        }
        for (int rep = 0; rep < 3; rep++) {
            for (int r = 0; r < R->n; r++) CU(cudaMemsetAsync(R->out[r], 0xff, count * 4, R->st[r]));
            if (!graph) {
                for (int r = 0; r < R->n; r++) OK(mla_cuda_ar_sum(&R->p[r], R->out[r], count, R->st[r], &err));
            } else { /* each rank's call captured in a graph of its own, then replayed: the device's generation */
                cudaGraph_t g[MLA_AR_MAX_RANKS];
                cudaGraphExec_t ge[MLA_AR_MAX_RANKS];
                for (int r = 0; r < R->n; r++) {
                    CU(cudaStreamBeginCapture(R->st[r], cudaStreamCaptureModeRelaxed));
                    OK(mla_cuda_ar_sum(&R->p[r], R->out[r], count, R->st[r], &err));
                    CU(cudaStreamEndCapture(R->st[r], &g[r]));
                    CU(cudaGraphInstantiate(&ge[r], g[r], 0));
                }
                for (int r = 0; r < R->n; r++) CU(cudaGraphLaunch(ge[r], R->st[r]));
                CU(cudaDeviceSynchronize());
                for (int r = 0; r < R->n; r++) {
                    CU(cudaGraphExecDestroy(ge[r]));
                    CU(cudaGraphDestroy(g[r]));
                }
            }
            CU(cudaDeviceSynchronize());
            check_failed(R, "sum");
            for (int r = 0; r < R->n; r++) {
                CU(cudaMemcpy(got, R->out[r], count * 4, cudaMemcpyDeviceToHost));
                size_t bad = count;
                for (size_t i = 0; i < count && bad == count; i++)
                    if (memcmp(&got[i], &want[i], 4)) bad = i;
                CHECK(bad == count, "sum%s N=%d n=%zu call %d rank %d: element %zu is %.9g, the host's %.9g",
                      graph ? " (graph)" : "", R->n, count, rep, r, bad, bad < count ? got[bad] : 0.0,
                      bad < count ? want[bad] : 0.0);
            }
        }
    }
    check_failed(R, "sum");
}

static void test_add_rmsnorm(ranks *R, float *hin, float *want, float *got) {
    mla_err err = {0};
    static const int64_t Es[] = {6144, 7168}, Ts[] = {1, 4, 32};
    float *w = (float *)malloc(7168 * 4), *x0 = (float *)malloc(MAXN * 4), *href = (float *)malloc(MAXN * 4);
    float *dw;
    CU(cudaMalloc((void **)&dw, 7168 * 4));
    for (size_t ei = 0; ei < 2; ei++)
        for (size_t ti = 0; ti < 3; ti++) {
            const int64_t E = Es[ei], T = Ts[ti];
            const size_t count = (size_t)(E * T);
            fill(R, hin, count);
            for (int64_t i = 0; i < E; i++) w[i] = 1.0f + 0.1f * frand();
            for (size_t i = 0; i < count; i++) x0[i] = frand() * 4.0f;
            CU(cudaMemcpy(dw, w, (size_t)E * 4, cudaMemcpyHostToDevice));
            for (size_t i = 0; i < count; i++) {
                float s = hin[i];
                for (int r = 1; r < R->n; r++) s += hin[(size_t)r * count + i];
                want[i] = x0[i] + s;
            }
            rmsnorm(want, E, T, E, w, 1e-6f, href, E);
            for (int r = 0; r < R->n; r++) {
                CU(cudaMemcpy(R->x[r], x0, count * 4, cudaMemcpyHostToDevice)); /* the residual, replicated */
                OK(mla_cuda_ar_add_rmsnorm(&R->p[r], T, E, R->x[r], dw, 1e-6f, R->h[r], R->st[r], &err));
            }
            CU(cudaDeviceSynchronize());
            check_failed(R, "add+norm");
            for (int r = 0; r < R->n; r++) {
                CU(cudaMemcpy(got, R->x[r], count * 4, cudaMemcpyDeviceToHost));
                CHECK(!memcmp(got, want, count * 4), "add+norm N=%d E=%lld T=%lld rank %d: x differs from x + sum",
                      R->n, (long long)E, (long long)T, r);
                CU(cudaMemcpy(got, R->h[r], count * 4, cudaMemcpyDeviceToHost));
                double worst = 0;
                for (int64_t t = 0; t < T; t++) {
                    double amax = 0;
                    for (int64_t i = 0; i < E; i++) amax = fmax(amax, fabs(href[t * E + i]));
                    for (int64_t i = 0; i < E; i++)
                        worst = fmax(worst, fabs((double)got[t * E + i] - href[t * E + i]) / amax);
                }
                CHECK(worst <= 2e-6, "add+norm N=%d E=%lld T=%lld rank %d: h off the CPU RMSNorm by %.3g", R->n,
                      (long long)E, (long long)T, r, worst);
            }
        }
    check_failed(R, "add+norm");
    cudaFree(dw);
    free(w);
    free(x0);
    free(href);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "test_allreduce_oneshot: no CUDA device\n");
        return 77;
    }
    float *hin = (float *)malloc((size_t)MLA_AR_MAX_RANKS * MAXN * 4), *want = (float *)malloc(MAXN * 4),
          *got = (float *)malloc(MAXN * 4);
    static const int Ns[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        ranks R;
        ranks_init(&R, Ns[k]);
        test_sum(&R, hin, want, got, 0);
        test_sum(&R, hin, want, got, 1);
        test_add_rmsnorm(&R, hin, want, got);
        ranks_free(&R);
        printf("N=%d: %s\n", Ns[k], fails ? "FAILED" : "ok");
    }
    /* refused: one rank, an output on the rank's own input */
    {
        mla_err err = {0};
        mla_ar_peers p;
        memset(&p, 0, sizeof p);
        p.world = 1;
        CHECK(mla_cuda_ar_sum(&p, got, 1, 0, &err) == MLA_ERR && strstr(err.msg, "ranks"), "one rank accepted");
    }
    free(hin);
    free(want);
    free(got);
    printf("test_allreduce_oneshot: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
