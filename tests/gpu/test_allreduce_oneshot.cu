/* The one-shot all-reduce (kernels/allreduce_cuda.h) on one GPU: N = 2 and 4 ranks as streams of
 * one process, each rank with its own input buffer and signal area, the peers' as plain pointers
 * (the same device). Every rank's kernel is launched on its own stream; they meet in the flag
 * barriers. Checked:
 * - the sum, on every rank, bit for bit against the host's sum in rank order (0, 1, ..., N-1),
 *   for sizes from 1 float to 32 x 7168, several calls in a row (the generation counter), and
 *   again replayed from a captured CUDA graph;
 * - the fused sum + residual add + RMSNorm (+ q8 rounding): bit for bit the unfused kernels
 *   (mla_cuda_ar_sum, then mla_cuda_rmsnorm_ex with the sum as the residual): the new stream, h
 *   and the q8 buffer; the stream also against the host's x + sum, h against the CPU reference
 *   (kernels/rmsnorm.c) within 2e-6 relative to the row's largest |h|; hidden sizes of one block a
 *   row to eight (1024, 2048, 6144, 7168, 8192), 1 row to the most that fit a call and this GPU
 *   with every rank's blocks at once, in place and apart, eager and replayed from captured
 *   graphs; one row more than a call takes refused by name;
 * - no barrier wait timed out.
 * Needs a GPU; prints "test_allreduce_oneshot: ok" and exits 0 on success. With --time instead:
 * the fused call's time beside the unfused kernels' (time_table). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/allreduce_cuda.h"
#include "kernels/cuda_ops.h"
extern "C" {
#include "kernels/rmsnorm.h"
}
#include "tests/gpu/cuda_check.h"

static int fails = 0;
#define CHECK(c, ...)                                                                                                 \
    do {                                                                                                              \
        if (!(c)) {                                                                                                   \
            fails++;                                                                                                  \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n");                                                                                    \
        }                                                                                                             \
    } while (0)
#define CU(x) MLA_CUDA_EXIT_ON_ERROR(x, 1)
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
#define Q8B(n) ((n) + (n) / 2 + 64) /* a q8 buffer of n elements: int8, then a float4 (16 bytes) a 32 */

typedef struct ranks {
    int n;
    float *in[MLA_AR_MAX_RANKS], *out[MLA_AR_MAX_RANKS], *x[MLA_AR_MAX_RANKS], *h[MLA_AR_MAX_RANKS];
    float *xo[MLA_AR_MAX_RANKS], *x2[MLA_AR_MAX_RANKS], *h2[MLA_AR_MAX_RANKS];
    uint8_t *q[MLA_AR_MAX_RANKS], *q2[MLA_AR_MAX_RANKS];
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
        CU(cudaMalloc((void **)&R->xo[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->x2[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->h2[r], MAXN * 4));
        CU(cudaMalloc((void **)&R->q[r], Q8B(MAXN)));
        CU(cudaMalloc((void **)&R->q2[r], Q8B(MAXN)));
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
        cudaFree(R->xo[r]);
        cudaFree(R->x2[r]);
        cudaFree(R->h2[r]);
        cudaFree(R->q[r]);
        cudaFree(R->q2[r]);
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

/* call(r) for every rank, each captured in a graph of its own on the rank's stream, then the
 * graphs replayed together (the device's generation counters across replays) */
template <class F> static void in_graphs(ranks *R, F call) {
    cudaGraph_t g[MLA_AR_MAX_RANKS];
    cudaGraphExec_t ge[MLA_AR_MAX_RANKS];
    for (int r = 0; r < R->n; r++) {
        CU(cudaStreamBeginCapture(R->st[r], cudaStreamCaptureModeRelaxed));
        call(r);
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

/* host inputs of every rank: inputs[r * count + i] */
static void fill(const ranks *R, float *hin, size_t count) {
    for (int r = 0; r < R->n; r++) {
        for (size_t i = 0; i < count; i++) hin[(size_t)r * count + i] = frand();
        CU(cudaMemcpy(R->in[r], hin + (size_t)r * count, count * 4, cudaMemcpyHostToDevice));
    }
    /* a copy from pageable memory may return before it lands, and the ranks' streams do not wait
     * for the legacy stream: wait here */
    CU(cudaDeviceSynchronize());
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
            } else {
                in_graphs(R, [&](int r) { OK(mla_cuda_ar_sum(&R->p[r], R->out[r], count, R->st[r], &err)); });
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

/* the device bytes a and b (n each) equal; else the first that differs */
static size_t first_diff(const void *a, const void *b, size_t n, uint8_t *ha, uint8_t *hb) {
    CU(cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (ha[i] != hb[i]) return i;
    return n;
}

/* One shape of the fused call on every rank (graph: each rank's call captured and replayed),
 * against the unfused kernels on the same inputs and the host. */
static void add_rmsnorm_case(ranks *R, int64_t E, int64_t T, int q8, int inplace, int graph, float *hin,
                             float *want, float *got, float *x0, float *w, float *dw, float *href, uint8_t *ha,
                             uint8_t *hb) {
    mla_err err = {0};
    const size_t count = (size_t)(E * T), qb = (size_t)T * (size_t)E + (size_t)T * (size_t)E / 2 + 16;
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
    for (int r = 0; r < R->n; r++) { /* the residual, replicated; the outputs poisoned */
        CU(cudaMemcpy(R->x[r], x0, count * 4, cudaMemcpyHostToDevice));
        CU(cudaMemset(R->xo[r], 0xff, count * 4));
        CU(cudaMemset(R->h[r], 0xff, count * 4));
        CU(cudaMemset(R->q[r], 0x55, qb));
        CU(cudaMemset(R->q2[r], 0x55, qb));
    }
    CU(cudaDeviceSynchronize());
    float *xo[MLA_AR_MAX_RANKS];
    for (int r = 0; r < R->n; r++) xo[r] = inplace ? R->x[r] : R->xo[r];
    auto fused = [&](int r) {
        OK(mla_cuda_ar_add_rmsnorm(&R->p[r], T, E, R->x[r], xo[r], dw, 1e-6f, R->h[r], q8 ? R->q[r] : NULL, R->st[r],
                                   &err));
    };
    if (!graph) {
        for (int r = 0; r < R->n; r++) fused(r);
    } else {
        in_graphs(R, fused);
    }
    CU(cudaDeviceSynchronize());
    check_failed(R, "add+norm");
    /* the unfused kernels on the same inputs: the sum, then the norm with it as the residual */
    for (int r = 0; r < R->n; r++) OK(mla_cuda_ar_sum(&R->p[r], R->out[r], count, R->st[r], &err));
    CU(cudaDeviceSynchronize());
    check_failed(R, "sum before the norm");
    for (int r = 0; r < R->n; r++) { /* the unfused kernels' sum, against the host's */
        CU(cudaMemcpy(got, R->out[r], count * 4, cudaMemcpyDeviceToHost));
        size_t bad = 0, first = count;
        for (size_t i = 0; i < count; i++) {
            float s = hin[i];
            for (int k = 1; k < R->n; k++) s += hin[(size_t)k * count + i];
            if (memcmp(&got[i], &s, 4)) bad++, first = first < i ? first : i;
        }
        CHECK(bad == 0, "add+norm N=%d E=%lld T=%lld rank %d: the unfused sum differs from the host's at %zu elements from %zu",
              R->n, (long long)E, (long long)T, r, bad, first);
    }
    for (int r = 0; r < R->n; r++) CU(cudaMemcpy(R->x2[r], x0, count * 4, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize()); /* as in fill() */
    for (int r = 0; r < R->n; r++) {
        OK(mla_cuda_rmsnorm_ex(R->x2[r], R->out[r], R->x2[r], E, T, E, dw, 1e-6f, R->h2[r], E, q8 ? R->q2[r] : NULL,
                               NULL, R->st[r], &err));
    }
    CU(cudaDeviceSynchronize());
    const char *form = graph ? " (graph)" : inplace ? " (in place)" : "";
    for (int r = 0; r < R->n; r++) {
        CU(cudaMemcpy(got, xo[r], count * 4, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(got, want, count * 4), "add+norm%s N=%d E=%lld T=%lld q8 %d rank %d: the stream is not x + sum",
              form, R->n, (long long)E, (long long)T, q8, r);
        size_t d = first_diff(xo[r], R->x2[r], count * 4, ha, hb);
        CHECK(d == count * 4, "add+norm%s N=%d E=%lld T=%lld q8 %d rank %d: the stream differs from the unfused one's at byte %zu",
              form, R->n, (long long)E, (long long)T, q8, r, d);
        d = first_diff(R->h[r], R->h2[r], count * 4, ha, hb);
        CHECK(d == count * 4, "add+norm%s N=%d E=%lld T=%lld q8 %d rank %d: h differs from the unfused norm's at byte %zu",
              form, R->n, (long long)E, (long long)T, q8, r, d);
        if (q8) {
            d = first_diff(R->q[r], R->q2[r], qb, ha, hb);
            CHECK(d == qb, "add+norm%s N=%d E=%lld T=%lld rank %d: the q8 buffer differs from the unfused norm's at byte %zu",
                  form, R->n, (long long)E, (long long)T, r, d);
        }
        CU(cudaMemcpy(got, R->h[r], count * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
            double amax = 0;
            for (int64_t i = 0; i < E; i++) amax = fmax(amax, fabs(href[t * E + i]));
            for (int64_t i = 0; i < E; i++) worst = fmax(worst, fabs((double)got[t * E + i] - href[t * E + i]) / amax);
        }
        CHECK(worst <= 2e-6, "add+norm%s N=%d E=%lld T=%lld rank %d: h off the CPU RMSNorm by %.3g", form, R->n,
              (long long)E, (long long)T, r, worst);
    }
}

static void test_add_rmsnorm(ranks *R, float *hin, float *want, float *got) {
    static const int64_t Es[] = {1024, 2048, 6144, 7168, 8192};
    float *w = (float *)malloc(8192 * 4), *x0 = (float *)malloc(MAXN * 4), *href = (float *)malloc(MAXN * 4);
    uint8_t *ha = (uint8_t *)malloc(MAXN * 4), *hb = (uint8_t *)malloc(MAXN * 4); /* a stream, or a q8 buffer */
    float *dw;
    CU(cudaMalloc((void **)&dw, 8192 * 4));
    int cases = 0;
    for (size_t ei = 0; ei < sizeof Es / sizeof *Es; ei++) {
        /* the most rows that fit a call, and that every rank's blocks fit this GPU at once (2 of
         * 512 threads an SM, 256 here at most) */
        const int64_t E = Es[ei], S = (E + 1023) / 1024, Tfit = MLA_AR_MAX_BLOCKS / S,
                      Tres = 256 / (R->n * S), Tmax = Tfit < Tres ? Tfit : Tres;
        const int64_t Ts[] = {1, 3, Tmax};
        for (size_t ti = 0; ti < 3; ti++) {
            const int64_t T = Ts[ti] * E <= MAXN ? Ts[ti] : MAXN / E;
            if (!mla_cuda_ar_add_rmsnorm_fits(T, E)) {
                CHECK(0, "add+norm: %lld rows of %lld do not fit on this device", (long long)T, (long long)E);
                continue;
            }
            for (int form = 0; form < 4; form++) { /* q8, in place, graph */
                add_rmsnorm_case(R, E, T, form != 1, form == 2, form == 3, hin, want, got, x0, w, dw, href, ha, hb);
                cases++;
            }
        }
        /* one row more than a call takes: refused by name, nothing launched */
        mla_err err = {0};
        CHECK(mla_cuda_ar_add_rmsnorm_fits(Tfit, E) && !mla_cuda_ar_add_rmsnorm_fits(Tfit + 1, E) &&
                  mla_cuda_ar_add_rmsnorm(&R->p[0], Tfit + 1, E, R->x[0], R->xo[0], dw, 1e-6f, R->h[0], NULL,
                                          R->st[0], &err) == MLA_ERR &&
                  strstr(err.msg, "do not fit"),
              "add+norm: %lld rows of %lld accepted", (long long)(Tfit + 1), (long long)E);
    }
    printf("N=%d: fused sum + norm: %d cases\n", R->n, cases);
    check_failed(R, "add+norm");
    cudaFree(dw);
    free(w);
    free(x0);
    free(href);
    free(ha);
    free(hb);
}

/* --time: a sublayer's all-reduce and the norm after it, us a call, the ranks as streams of this
 * GPU (their inputs in its own memory, not a peer's: the launches and barriers, not NVLink):
 * unfused (the copy into the input buffer, the sum, the norm) against fused (one launch, the
 * sublayer writing into the input buffer). Each rank's 200 calls are one captured graph; the
 * ranks' graphs run together. A table on stdout; nothing is asserted. */
static double time_calls(ranks *R, int64_t T, int64_t E, float *dw, int fused) {
    mla_err err = {0};
    const int calls = 200;
    cudaGraphExec_t ge[MLA_AR_MAX_RANKS];
    for (int r = 0; r < R->n; r++) {
        cudaGraph_t g;
        CU(cudaStreamBeginCapture(R->st[r], cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < calls; i++) {
            if (fused) {
                OK(mla_cuda_ar_add_rmsnorm(&R->p[r], T, E, R->x[r], R->xo[r], dw, 1e-6f, R->h[r], R->q[r], R->st[r],
                                           &err));
            } else {
                CU(cudaMemcpyAsync(R->in[r], R->out[r], (size_t)(T * E) * 4, cudaMemcpyDeviceToDevice, R->st[r]));
                OK(mla_cuda_ar_sum(&R->p[r], R->x2[r], (size_t)(T * E), R->st[r], &err));
                OK(mla_cuda_rmsnorm_ex(R->x[r], R->x2[r], R->xo[r], E, T, E, dw, 1e-6f, R->h[r], E, R->q[r], NULL,
                                       R->st[r], &err));
            }
        }
        CU(cudaStreamEndCapture(R->st[r], &g));
        CU(cudaGraphInstantiate(&ge[r], g, 0));
        CU(cudaGraphDestroy(g));
    }
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        CU(cudaDeviceSynchronize());
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        CU(cudaEventRecord(e0, 0));
        for (int r = 0; r < R->n; r++) CU(cudaGraphLaunch(ge[r], R->st[r]));
        CU(cudaDeviceSynchronize());
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        best = fmin(best, ms * 1e3 / calls);
        CU(cudaEventDestroy(e0));
        CU(cudaEventDestroy(e1));
    }
    check_failed(R, "timing");
    for (int r = 0; r < R->n; r++) CU(cudaGraphExecDestroy(ge[r]));
    return best;
}

static void time_table(void) {
    float *dw;
    CU(cudaMalloc((void **)&dw, 8192 * 4));
    CU(cudaMemset(dw, 0, 8192 * 4));
    printf("| ranks | hidden | rows | copy + sum + norm, us | fused, us |\n|---:|---:|---:|---:|---:|\n");
    static const int Ns[] = {2, 4, 8};
    static const int64_t Es[] = {2048, 6144, 7168}, Ts[] = {1, 8};
    for (int k = 0; k < 3; k++) {
        ranks R;
        ranks_init(&R, Ns[k]);
        for (int r = 0; r < R.n; r++) {
            CU(cudaMemset(R.out[r], 0, MAXN * 4));
            CU(cudaMemset(R.x[r], 0, MAXN * 4));
        }
        for (int ei = 0; ei < 3; ei++)
            for (int ti = 0; ti < 2; ti++) {
                /* every rank's blocks must be resident together (two of 512 threads an SM) */
                if ((int64_t)Ns[k] * Ts[ti] * ((Es[ei] + 1023) / 1024) > 240) continue;
                const double u = time_calls(&R, Ts[ti], Es[ei], dw, 0), f = time_calls(&R, Ts[ti], Es[ei], dw, 1);
                printf("| %d | %lld | %lld | %.2f | %.2f |\n", Ns[k], (long long)Es[ei], (long long)Ts[ti], u, f);
            }
        ranks_free(&R);
    }
    cudaFree(dw);
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "test_allreduce_oneshot: no CUDA device\n");
        return 77;
    }
    if (argc > 1 && !strcmp(argv[1], "--time")) {
        time_table();
        return 0;
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
