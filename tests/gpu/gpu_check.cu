/* mla-gpu-check: checks every CUDA op against its CPU reference (kernels/ .c files, the definition
 * of correct) on fresh random inputs at several sizes, real model sizes included, then times
 * it. Outputs are poisoned (NaN) before each checked run; errors are relative L2 against the
 * CPU result; a NaN anywhere fails. Timing: CUDA events, warm-up, median of many runs, with
 * weights rotated over several copies so that large runs do not measure the L2 cache.
 * Ceilings: a large device-to-device copy measured here (bytes read + written), and the bf16
 * dense rate given by MLA_BF16_TFLOPS (default 790, measured on an H200 with cuBLAS).
 *
 * Usage: mla-gpu-check [--quick] [--router] [--mma3] [--mmh] [--moe512] [--gemv] [--wg] [--wgprof] [--gemvgrp] [--prefill] [--dsa] [--head] [--sample] [--attn] [--attnlong] [--out FILE]   exit status
 * 0 when every check passes. --router: only the MoE routers' float products (check_router: the
 * narrow kernel beside the bf16 tensor cores it replaced, timed; with --quick fewer rows); --mma3:
 * only the float-weight prefill paths side by side; --mmh: only
 * the fp16 tensor-core paths of quantized weights (dense and experts); --moe512: one timed run of
 * a 512-token V3 prompt's experts, for a profiler (ncu); --gemv: only the decode GEMVs of
 * quantized weights, streamed beside per-warp; --wg: only the warpgroup (wgmma) kernel's checks
 * and timings (check_wg); --wgprof: one run of its timed products, for a profiler; --gemvgrp:
 * only the grouped float GEMV against the dense one, bit for bit (check_gemv_grouped); --prefill:
 * only the non-absorbed prompt attention's checks (gpu_check_prefill.inc; on sm_90 its mma.sync
 * and wgmma kernels side by side), then V3's 4k and 32k prompts timed against the absorbed path (with
 * --quick the checks alone, untimed, without the 32k ones); --dsa: only the DSA indexer the model runs
 * (gpu_check_dsa.inc), with --quick its small set, each path timed beside the one it replaced;
 * --head: the per-head products of prompt steps, wgmma against mma.sync (check_head_wg); --attn: the attention-side set (with decode at 1k, 32k and 128k keys); --attnlong: V3's decode
 * attention (128 heads) at 1k, 32k and 128k keys, batch 1 and 8, checked and timed, then (on sm_90)
 * the attention over DSA-selected keys at 1 to 256 tokens, mma.sync against wgmma; --sample: only
 * the device sampling (gpu_check_sample.inc) against the host's sampler, then timed beside argmax
 * (with --quick fewer rows). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_ops.h"
#include "kernels/cuda_rand.h"
#include "kernels/mm_cuda.h" /* mlacu_gemv: the dense GEMV of every type, whatever the chooser's pick */
#ifdef MLA_CUDA_WGMMA
#include "kernels/wgmma_cuda.h"
#endif
#include "tests/gpu/cuda_check.h"

extern "C" {
#include "kernels/act.h"
#include "kernels/cuda_types.h"
#include "kernels/dsa_indexer.h"
#include "kernels/layernorm.h"
#include "kernels/mla_attn.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
}

#define CK(call) MLA_CUDA_EXIT_ON_ERROR(call, 2)
#define OK(call)                                                                                        \
    do {                                                                                                \
        mla_err e_;                                                                                     \
        if ((call) != MLA_OK) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, e_.msg);                      \
            exit(2);                                                                                    \
        }                                                                                               \
    } while (0)
#define E (&e_)

struct row {
    std::string op, shape;
    double err, bound;
    bool pass;
    double us, gbs, tflops, frac; /* frac of the relevant ceiling; <0: none */
};
static std::vector<row> g_rows;
static double g_copy_gbs = 0, g_bf16_tflops = 790;
static int g_reps = 50;
static gr_rng g_rng = {0x5eed1234ull};
static int g_chain = 8; /* time_gemv_chain's launches a run (--gemvt1: 1, for a profiler) */
/* the streamed GEMV's token limits in force (mla_cuda_set_gemv_stream): the library's defaults */
static int g_gs_dense = MLA_CUDA_GEMVS_DENSE, g_gs_grouped = MLA_CUDA_GEMVS_GROUPED;
/* and its tensor-core form's (mla_cuda_set_gemv_mma, mla_cuda_set_gemv_mma_grouped) */
static int g_gm_min = MLA_CUDA_GEMVM_TMIN, g_gm_max = MLA_CUDA_GEMVM_TMAX, g_gmg_max = MLA_CUDA_GEMVM_GRP_TMAX;

static void *dmalloc(size_t n) {
    void *p;
    CK(cudaMalloc(&p, n ? n : 16));
    return p;
}
static void *dup(const void *h, size_t n, size_t alloc = 0) {
    void *d = dmalloc(alloc > n ? alloc : n);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
static void poison(void *d, size_t n) { CK(cudaMemset(d, 0xff, n)); } /* 0xffffffff = NaN */
static void down(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

/* Median time in microseconds of fn over g_reps runs (after 3 warm-ups); fn(i) may rotate
 * buffers by i. */
static double time_us(const std::function<void(int)> &fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) fn(i);
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < g_reps; i++) {
        CK(cudaEventRecord(a));
        fn(i);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1000.0;
}

static void add_row(const std::string &op, const std::string &shape, double err, double bound, double us,
                    double bytes, double flops, bool mem_bound) {
    row r;
    r.op = op;
    r.shape = shape;
    r.err = err;
    r.bound = bound;
    r.pass = err <= bound; /* NaN/inf fail */
    r.us = us;
    r.gbs = us > 0 ? bytes / us * 1e-3 : 0;
    r.tflops = us > 0 ? flops / us * 1e-6 : 0;
    r.frac = us <= 0 ? -1 : mem_bound ? r.gbs / g_copy_gbs : r.tflops / g_bf16_tflops;
    g_rows.push_back(r);
    printf("%-22s %-30s err %.2e (<= %.0e) %s  %9.2f us %8.1f GB/s %7.2f TFLOP/s\n", op.c_str(), shape.c_str(),
           err, bound, r.pass ? "ok  " : "FAIL", us, r.gbs, r.tflops);
    fflush(stdout);
}

static std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char *f, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* ---------------------------------------------------------------- ceilings */
static void measure_copy(void) {
    size_t n = (size_t)2 << 30; /* 2 GiB each way */
    void *a = dmalloc(n), *b = dmalloc(n);
    CK(cudaMemset(a, 1, n));
    double us = time_us([&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); });
    g_copy_gbs = 2.0 * n / us * 1e-3;
    printf("ceiling: D2D copy %.0f GB/s (read + write, 2 GiB), bf16 dense %.0f TFLOP/s (given)\n", g_copy_gbs,
           g_bf16_tflops);
    CK(cudaFree(a));
    CK(cudaFree(b));
}

/* ---------------------------------------------------------------- quant: matmul */
/* MM_Q8: mla_cuda_matmul_q8 as the model calls it (streamed for Q4_K / Q6_K / Q8_0); MM_Q8ROWS:
 * the same with the streamed GEMV switched off (the per-warp GEMV of every type) */
enum mm_path { MM_AUTO, MM_GEMV, MM_MMA, MM_MMA3, MM_Q8, MM_Q8MMA, MM_H, MM_Q8ROWS, MM_NARROW };


/* y = x W^T on the GPU against dequantized sampled rows dotted in double on the CPU. */
static void check_matmul(uint32_t t, int64_t in, int64_t out, int64_t T, mm_path path, bool timed) {
    size_t rb = ggml_row_bytes(t, in), wbytes = rb * out, walloc = mla_cuda_weight_bytes(t, in, out);
    std::vector<uint8_t> w(wbytes);
    gr_quant_rows(&g_rng, t, w.data(), in, out);
    std::vector<float> x(T * in);
    gr_fill(&g_rng, x.data(), T * in, 1.0f);
    /* weight copies rotated in timing so the working set exceeds the L2 cache */
    int ncopy = timed ? (int)std::min<size_t>(8, std::max<size_t>(1, ((size_t)512 << 20) / walloc)) : 1;
    std::vector<void *> dw;
    for (int i = 0; i < ncopy; i++) dw.push_back(dup(w.data(), wbytes, walloc));
    float *dx = (float *)dup(x.data(), T * in * 4);
    float *dy = (float *)dmalloc(T * out * 4);
    const bool q8 = path == MM_Q8 || path == MM_Q8MMA || path == MM_Q8ROWS;
    void *dq = q8                              ? dmalloc(mla_cuda_q8_bytes(T, in))
             : path == MM_H                    ? dmalloc(mla_cuda_act_h_bytes(T, in))
                                               : NULL;
    auto run = [&](int i) {
        void *wi = dw[i % ncopy];
        if (q8) { /* timed with the quantization of x: what a step pays */
            OK(mla_cuda_quantize_q8(dx, T, in, dq, 0, E));
            if (path == MM_Q8ROWS) mla_cuda_set_gemv_stream(0, 0), mla_cuda_set_gemv_mma(2, 0);
            OK((path == MM_Q8MMA ? mla_cuda_matmul_q8_mma : mla_cuda_matmul_q8)(t, wi, in, out, dq, T, dy, 0, E));
            mla_cuda_set_gemv_stream(g_gs_dense, g_gs_grouped);
            mla_cuda_set_gemv_mma(g_gm_min, g_gm_max);
        } else if (path == MM_H) { /* timed with the conversion of x */
            OK(mla_cuda_act_h(dx, T, in, dq, 0, E));
            OK(mla_cuda_matmul_h(t, wi, in, out, dq, T, dy, 0, E));
        } else if (path == MM_GEMV) OK(mla_cuda_matmul_gemv(t, wi, in, out, dx, T, dy, 0, E));
        else if (path == MM_MMA) OK(mla_cuda_matmul_mma(t, wi, in, out, dx, T, dy, 0, E));
        else if (path == MM_MMA3) OK(mla_cuda_matmul_mma3(t, wi, in, out, dx, T, dy, 0, E));
        else if (path == MM_NARROW) OK(mla_cuda_matmul_narrow(t, wi, in, out, dx, T, dy, 0, E));
        else OK(mla_cuda_matmul(t, wi, in, out, dx, T, dy, 0, E));
    };
    poison(dy, T * out * 4);
    run(0);
    CK(cudaDeviceSynchronize());
    std::vector<float> y(T * out);
    down(y.data(), dy, T * out * 4);
    bool finite = all_finite(y.data(), y.size());
    /* reference on sampled rows (all rows when small); for the integer GEMV, of x as it quantizes it */
    if (q8) gr_q8_round(x.data(), x.data(), T * in);
    int64_t nsamp = std::min<int64_t>(out, T > 64 ? 48 : 256);
    std::vector<float> deq(in), got, ref;
    for (int64_t s = 0; s < nsamp; s++) {
        int64_t o = nsamp == out ? s : (int64_t)(gr_u64(&g_rng) % (uint64_t)out);
        quant_dequant_row(t, w.data() + (size_t)o * rb, deq.data(), in);
        for (int64_t tk = 0; tk < T; tk++) {
            double acc = 0;
            const float *xr = x.data() + tk * in;
            for (int64_t i = 0; i < in; i++) acc += (double)deq[i] * xr[i];
            ref.push_back((float)acc);
            got.push_back(y[tk * out + o]);
        }
    }
    double err = finite ? gr_rel_l2(got.data(), ref.data(), (int64_t)ref.size()) : INFINITY;
    const mla_cuda_mm_policy none = {false, false, false, 0, 0, 0}; /* mla_cuda_matmul's */
    const bool bf16 = path == MM_MMA || (path == MM_AUTO && mla_cuda_mm_choose(&none, &t, &in, 1, T, out) == MLA_CUDA_MM_MMA);
    double us = timed ? time_us(run) : 0;
    const char *pn = path == MM_GEMV ? "gemv" : path == MM_MMA ? "mma"
                   : path == MM_MMA3 ? "mma3 (split bf16)" : path == MM_Q8 ? "gemv q8"
                   : path == MM_Q8ROWS ? "gemv q8 rows"
                   : path == MM_Q8MMA ? "mma q8 (int8)" : path == MM_H ? "mma f16"
                   : path == MM_NARROW ? "narrow (tf32 hi/lo)" : "matmul";
    /* mma3 (hi/lo split, 3 MMAs) is held to the fp32 bound; its speed is arithmetic (TFLOP/s) */
    add_row(fmt("%s %s", pn, ggml_type_name(t)), fmt("%lldx%lld T=%lld", (long long)out, (long long)in, (long long)T),
            err, bf16 ? 1e-2 : path == MM_H ? 2e-3 : 1e-4, us, (double)wbytes + 4.0 * T * (in + out), 2.0 * T * in * out,
            !bf16 && path != MM_MMA3 && T <= 16);
    for (void *p : dw) CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    if (dq) CK(cudaFree(dq));
}

/* gemv_kernel's two row sources on the same weights and x: the grouped form
 * (mla_cuda_matmul_grouped) over a plan of one expert and one tile (T <= 8 tokens, one expert a
 * token: pair p is token p) against the dense form (mlacu_gemv: gemv_kernel over one matrix, for
 * the float types too, which mla_cuda_matmul_gemv gives to gemvf_kernel). The same bits: y, or
 * with fuse (gate w0, up w1) the dense GEMV of each then mla_cuda_swiglu. Both against the CPU
 * reference (dequantized rows dotted in double; silu(g) u) to the GEMV's bound. */
static void check_gemv_grouped(uint32_t t, int64_t in, int64_t out, int64_t T, bool fuse) {
    const size_t rb = ggml_row_bytes(t, in), wbytes = rb * out, walloc = mla_cuda_weight_bytes(t, in, out);
    std::vector<uint8_t> w0(wbytes), w1(wbytes);
    gr_quant_rows(&g_rng, t, w0.data(), in, out);
    gr_quant_rows(&g_rng, t, w1.data(), in, out);
    std::vector<float> x(T * in);
    gr_fill(&g_rng, x.data(), T * in, 1.0f);
    void *dw0 = dup(w0.data(), wbytes, walloc), *dw1 = dup(w1.data(), wbytes, walloc);
    float *dx = (float *)dup(x.data(), T * in * 4);
    const size_t yb = (size_t)T * out * 4;
    float *dg = (float *)dmalloc(yb), *du = (float *)dmalloc(yb), *dd = (float *)dmalloc(yb), *dy = (float *)dmalloc(yb);
    std::vector<int32_t> ids(T, 0);
    int32_t *dids = (int32_t *)dup(ids.data(), T * 4);
    void *mem = dmalloc(mla_cuda_moe_plan_bytes(T, 1, 1));
    mla_cuda_moe_plan pl;
    mla_cuda_moe_plan_init(&pl, mem, T, 1, 1, 0, 1);
    OK(mla_cuda_moe_plan_build(&pl, dids, T, 1, 1, 0, E));
    poison(dd, yb);
    poison(dy, yb);
    if (fuse) {
        CK(mlacu::mlacu_gemv(t, dw0, in, out, dx, T, dg, 0));
        CK(mlacu::mlacu_gemv(t, dw1, in, out, dx, T, du, 0));
        OK(mla_cuda_swiglu(dg, du, dd, T * out, 0, E));
    } else
        CK(mlacu::mlacu_gemv(t, dw0, in, out, dx, T, dd, 0));
    OK(mla_cuda_matmul_grouped(t, dw0, fuse ? dw1 : NULL, walloc, in, out, dx, 1, &pl, dy, 0, E));
    CK(cudaDeviceSynchronize());
    int32_t nt[2];
    down(nt, pl.n_tiles, sizeof nt);
    std::vector<float> yd(T * out), yg(T * out), ref(T * out);
    down(yd.data(), dd, yb);
    down(yg.data(), dy, yb);
    std::vector<float> d0(in), d1(in);
    for (int64_t o = 0; o < out; o++) {
        quant_dequant_row(t, w0.data() + (size_t)o * rb, d0.data(), in);
        quant_dequant_row(t, w1.data() + (size_t)o * rb, d1.data(), in);
        for (int64_t tk = 0; tk < T; tk++) {
            double g = 0, u = 0;
            const float *xr = x.data() + tk * in;
            for (int64_t i = 0; i < in; i++) g += (double)d0[i] * xr[i], u += (double)d1[i] * xr[i];
            ref[tk * out + o] = (float)(fuse ? g / (1.0 + exp(-g)) * u : g);
        }
    }
    const bool same = !memcmp(yd.data(), yg.data(), yb), finite = all_finite(yg.data(), yg.size());
    double err = nt[0] == 1 && same && finite ? std::max(gr_rel_l2(yd.data(), ref.data(), T * out),
                                                         gr_rel_l2(yg.data(), ref.data(), T * out))
                                              : INFINITY;
    if (nt[0] != 1 || !same)
        printf("  gemv grouped %s: %d tiles (1 wanted), %s\n", ggml_type_name(t), nt[0],
               same ? "the same bits" : "bits differ from the dense form");
    add_row(fmt("gemv grouped%s = dense %s", fuse ? " fused" : "", ggml_type_name(t)),
            fmt("%lldx%lld T=%lld 1 expert", (long long)out, (long long)in, (long long)T), err, 1e-4, 0, 0, 0, true);
    for (void *p : {dw0, dw1, (void *)dx, (void *)dg, (void *)du, (void *)dd, (void *)dy, (void *)dids, mem})
        CK(cudaFree(p));
}

/* a MoE router's float weights (V2-Lite's 64 x 2048, V3's 256 x 7168, GLM-5's 256 x 6144) in
 * steps of 9-4096 tokens: the chooser's choice (mla_cuda_matmul: the GEMV up to 64 rows, the
 * narrow kernel above) beside the bf16 tensor cores it replaces and the narrow kernel itself; a
 * partial output tiles and token tiles, F16 weights. quick: fewer rows. */
static void check_router(bool quick) {
    const std::vector<int64_t> rows =
        quick ? std::vector<int64_t>{9, 128, 1024} : std::vector<int64_t>{9, 32, 64, 128, 512, 1024, 4096};
    for (uint32_t t : {GGML_TYPE_F32, GGML_TYPE_BF16})
        for (int64_t T : rows)
            for (auto io : std::vector<std::array<int64_t, 2>>{{2048, 64}, {7168, 256}, {6144, 256}}) {
                check_matmul(t, io[0], io[1], T, MM_AUTO, true);
                check_matmul(t, io[0], io[1], T, MM_MMA, true);
                if (T <= 64) check_matmul(t, io[0], io[1], T, MM_NARROW, true);
            }
    /* partial output and token tiles, in blocks of 16 tokens (77) and of 32 (4133: more blocks
     * of 16 than two waves) */
    for (int64_t T : {77, 4133}) {
        check_matmul(GGML_TYPE_F32, 2048, 100, T, MM_NARROW, false);
        check_matmul(GGML_TYPE_F16, 2048, 100, T, MM_NARROW, false);
    }
    check_matmul(GGML_TYPE_F16, 7168, 256, 300, MM_AUTO, false);
}

/* check_gemv_grouped at shapes with a partial K chunk and a partial row block (1536 x 300, 3
 * tokens), a full tile of short rows (512 x 101, 8 tokens) and one pair (7168 x 64), for every
 * type the GEMV takes, plain and fused */
static void check_gemv_grouped_all(const uint32_t *types, size_t nt) {
    for (size_t i = 0; i < nt; i++)
        for (bool fuse : {false, true}) {
            check_gemv_grouped(types[i], 1536, 300, 3, fuse);
            check_gemv_grouped(types[i], 512, 101, 8, fuse);
            check_gemv_grouped(types[i], 7168, 64, 1, fuse);
        }
}

static void check_get_rows(uint32_t t, int64_t n, int64_t vocab, int64_t T) {
    size_t rb = ggml_row_bytes(t, n);
    std::vector<uint8_t> w(rb * vocab);
    gr_quant_rows(&g_rng, t, w.data(), n, vocab);
    std::vector<int32_t> ids(T);
    for (auto &i : ids) i = (int32_t)(gr_u64(&g_rng) % (uint64_t)vocab);
    void *dw = dup(w.data(), w.size(), mla_cuda_weight_bytes(t, n, vocab));
    int32_t *di = (int32_t *)dup(ids.data(), T * 4);
    float *dy = (float *)dmalloc(T * n * 4);
    poison(dy, T * n * 4);
    OK(mla_cuda_get_rows(t, dw, n, di, T, dy, 0, E));
    std::vector<float> got(T * n), ref(T * n);
    down(got.data(), dy, T * n * 4);
    for (int64_t k = 0; k < T; k++) quant_dequant_row(t, w.data() + (size_t)ids[k] * rb, ref.data() + k * n, n);
    double err = gr_rel_l2(got.data(), ref.data(), T * n);
    double us = time_us([&](int) { OK(mla_cuda_get_rows(t, dw, n, di, T, dy, 0, E)); });
    add_row(fmt("get_rows %s", ggml_type_name(t)), fmt("n=%lld T=%lld", (long long)n, (long long)T), err, 1e-6, us,
            (double)rb * T + 4.0 * T * n, 0, true);
    CK(cudaFree(dw));
    CK(cudaFree(di));
    CK(cudaFree(dy));
}

/* ---------------------------------------------------------------- small ops */
static void check_rmsnorm(int64_t T, int64_t n) {
    std::vector<float> x(T * n), w(n), ref(T * n), got(T * n);
    gr_fill(&g_rng, x.data(), T * n, 3.0f);
    gr_fill(&g_rng, w.data(), n, 1.0f);
    rmsnorm(x.data(), n, T, n, w.data(), 1e-6f, ref.data(), n);
    float *dx = (float *)dup(x.data(), T * n * 4), *dw = (float *)dup(w.data(), n * 4);
    float *dy = (float *)dmalloc(T * n * 4);
    poison(dy, T * n * 4);
    OK(mla_cuda_rmsnorm(dx, n, T, n, dw, 1e-6f, dy, n, 0, E));
    down(got.data(), dy, T * n * 4);
    double err = gr_rel_l2(got.data(), ref.data(), T * n);
    double us = time_us([&](int) { OK(mla_cuda_rmsnorm(dx, n, T, n, dw, 1e-6f, dy, n, 0, E)); });
    add_row("rmsnorm", fmt("T=%lld n=%lld", (long long)T, (long long)n), err, 1e-5, us, 8.0 * T * n + 4.0 * n, 0,
            true);
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dy));
}

/* bytes that differ between two device buffers of n bytes */
static int64_t dev_diff(const void *a, const void *b, size_t n) {
    std::vector<uint8_t> ha(n), hb(n);
    down(ha.data(), a, n);
    down(hb.data(), b, n);
    int64_t d = 0;
    for (size_t i = 0; i < n; i++) d += ha[i] != hb[i];
    return d;
}

/* The fused norm of a step (mla_cuda_rmsnorm_ex): s = x + res, y = rmsnorm(s), y's q8 buffer (a
 * decode step's), y's fp16 buffer (h16: a prompt's); s into another buffer (the model's way:
 * several blocks a row), or in place (x; with res false, y = x: the q-LoRA norm). Against the CPU
 * (x + res, rmsnorm: the float rows; the q8 rounding of y: its values), and bit for bit against
 * mla_cuda_add, mla_cuda_rmsnorm, mla_cuda_quantize_q8 and mla_cuda_act_h in turn. */
static void check_rmsnorm_ex(int64_t T, int64_t n, bool res, bool q8, bool in_place = false, bool h16 = false) {
    std::vector<float> x(T * n), r(T * n), w(n), xr(T * n), ref(T * n), got(T * n), gx(T * n);
    gr_fill(&g_rng, x.data(), T * n, 3.0f);
    gr_fill(&g_rng, r.data(), T * n, 1.0f);
    gr_fill(&g_rng, w.data(), n, 1.0f);
    for (int64_t i = 0; i < T * n; i++) xr[i] = res ? x[i] + r[i] : x[i];
    rmsnorm(xr.data(), n, T, n, w.data(), 1e-6f, ref.data(), n);
    float *dx = (float *)dup(x.data(), T * n * 4), *dx2 = (float *)dup(x.data(), T * n * 4);
    float *dr = (float *)dup(r.data(), T * n * 4), *dw = (float *)dup(w.data(), n * 4);
    float *dy = (float *)dmalloc(T * n * 4), *dy2 = (float *)dmalloc(T * n * 4), *ds = (float *)dmalloc(T * n * 4);
    const size_t qb = mla_cuda_q8_bytes(T, n), hb = mla_cuda_act_h_bytes(T, n);
    void *dq = dmalloc(qb), *dq2 = dmalloc(qb), *dh = dmalloc(hb), *dh2 = dmalloc(hb);
    poison(dh, hb);
    poison(dh2, hb);
    poison(dy, T * n * 4);
    poison(ds, T * n * 4);
    poison(dq, qb);
    poison(dq2, qb);
    /* s: ds, or x itself; y: dy, or x itself (in place without res) */
    float *dsum = res ? (in_place ? dx : ds) : NULL, *dyo = in_place && !res ? dx : dy;
    auto run = [&](int) {
        OK(mla_cuda_rmsnorm_ex(dx, res ? dr : NULL, dsum, n, T, n, dw, 1e-6f, dyo, n, q8 ? dq : NULL, h16 ? dh : NULL, 0,
                               E));
    };
    run(0);
    if (res) OK(mla_cuda_add(dx2, dr, T * n, 0, E));
    OK(mla_cuda_rmsnorm(dx2, n, T, n, dw, 1e-6f, dy2, n, 0, E));
    if (q8) OK(mla_cuda_quantize_q8(dy2, T, n, dq2, 0, E));
    if (h16) OK(mla_cuda_act_h(dy2, T, n, dh2, 0, E));
    CK(cudaDeviceSynchronize());
    down(got.data(), dyo, T * n * 4);
    down(gx.data(), res ? dsum : dx, T * n * 4);
    if (in_place && !res) gx = x; /* x became y: the sum check is y's own */
    double err = std::max(gr_rel_l2(got.data(), ref.data(), T * n), gr_rel_l2(gx.data(), xr.data(), T * n));
    if (q8) { /* the q8 buffer's values (int8 times its unit's scale) against the rounding of the y
               * the kernel wrote (y itself is held to the CPU's above): the CPU's y, a last bit
               * off, can round an element on a boundary the other way, which alone is ~2e-5 */
        std::vector<int8_t> hq(T * n);
        std::vector<float> hs(T * n / 32 * 4), qv(T * n), qr(T * n);
        down(hq.data(), dq, T * n);
        down(hs.data(), (const uint8_t *)dq + (qb - T * n / 32 * 16), T * n / 32 * 16);
        for (int64_t i = 0; i < T * n; i++) qv[i] = hs[i / 32 * 4] * (float)hq[i];
        gr_q8_round(got.data(), qr.data(), T * n);
        err = std::max(err, gr_rel_l2(qv.data(), qr.data(), T * n));
    }
    const int64_t bits = (res ? dev_diff(dsum, dx2, T * n * 4) : 0) + dev_diff(dyo, dy2, T * n * 4) +
                         (q8 ? dev_diff(dq, dq2, qb) : 0);
    const size_t hso = ((size_t)T * n * 2 + 15) / 16 * 16; /* the fp16 rows, then their scales (act_h's layout) */
    const int64_t hbits = h16 ? dev_diff(dh, dh2, (size_t)T * n * 2) +
                                    dev_diff((uint8_t *)dh + hso, (uint8_t *)dh2 + hso, (size_t)T * 4)
                              : 0;
    /* timed out of place (in place: rerun on its own output) */
    if (in_place) dsum = res ? ds : NULL, dyo = dy;
    double us = time_us(run);
    const char *nm = res ? (q8 ? "rmsnorm + residual + q8" : "rmsnorm + residual") : q8 ? "rmsnorm + q8" : "rmsnorm_ex";
    const std::string sh = fmt("T=%lld n=%lld%s", (long long)T, (long long)n, in_place ? " in place" : "");
    add_row(nm, sh, err, 1e-5, us, (res ? 16.0 : 8.0) * T * n, 0, true);
    add_row(fmt("%s = unfused", nm), sh + ", bytes differing", bits ? INFINITY : 0, 0, 0, 0, 0, true);
    if (h16) add_row(fmt("%s + fp16 = act_h", nm), sh + ", bytes differing", hbits ? INFINITY : 0, 0, 0, 0, 0, true);
    for (void *p :
         {(void *)dx, (void *)dx2, (void *)dr, (void *)dw, (void *)dy, (void *)dy2, (void *)ds, dq, dq2, dh, dh2})
        CK(cudaFree(p));
}

/* Two products of one q8 buffer in one kernel (mla_cuda_matmul_q8_pair, and gate / up with
 * swiglu, mla_cuda_matmul_q8_swiglu): bit for bit against mla_cuda_matmul_q8 (each checked
 * against the CPU above) twice, then mla_cuda_swiglu; timed against those. With swiglu (out_a a
 * multiple of 32) the q8 rows of y it makes on the way, byte for byte against
 * mla_cuda_quantize_q8 of y. */
static void check_q8_two(uint32_t t, int64_t in, int64_t out_a, int64_t out_b, int64_t T, bool swiglu) {
    const size_t rb = ggml_row_bytes(t, in);
    std::vector<uint8_t> wa(rb * out_a), wb(rb * out_b);
    gr_quant_rows(&g_rng, t, wa.data(), in, out_a);
    gr_quant_rows(&g_rng, t, wb.data(), in, out_b);
    std::vector<float> x(T * in);
    gr_fill(&g_rng, x.data(), T * in, 1.0f);
    void *dwa = dup(wa.data(), wa.size(), mla_cuda_weight_bytes(t, in, out_a));
    void *dwb = dup(wb.data(), wb.size(), mla_cuda_weight_bytes(t, in, out_b));
    float *dx = (float *)dup(x.data(), T * in * 4);
    void *dq = dmalloc(mla_cuda_q8_bytes(T, in));
    float *ya = (float *)dmalloc(T * out_a * 4), *yb = (float *)dmalloc(T * out_b * 4);
    float *ra = (float *)dmalloc(T * out_a * 4), *rb2 = (float *)dmalloc(T * out_b * 4);
    const bool yq = swiglu && out_a % 32 == 0;
    const size_t yqb = yq ? mla_cuda_q8_bytes(T, out_a) : 16;
    void *dyq = dmalloc(yqb), *dyq2 = dmalloc(yqb);
    OK(mla_cuda_quantize_q8(dx, T, in, dq, 0, E));
    poison(ya, T * out_a * 4);
    poison(yb, T * out_b * 4);
    auto fused = [&](int) {
        if (swiglu) OK(mla_cuda_matmul_q8_swiglu(t, dwa, dwb, in, out_a, dq, T, ya, yb, yq ? dyq : NULL, 0, E));
        else OK(mla_cuda_matmul_q8_pair(t, dwa, out_a, ya, dwb, out_b, yb, in, dq, T, 0, E));
    };
    auto apart = [&](int) {
        OK(mla_cuda_matmul_q8(t, dwa, in, out_a, dq, T, ra, 0, E));
        OK(mla_cuda_matmul_q8(t, dwb, in, out_b, dq, T, rb2, 0, E));
        if (swiglu) OK(mla_cuda_swiglu(ra, rb2, ra, T * out_a, 0, E));
    };
    poison(dyq, yqb);
    fused(0);
    apart(0);
    if (yq) OK(mla_cuda_quantize_q8(ra, T, out_a, dyq2, 0, E));
    CK(cudaDeviceSynchronize());
    std::vector<float> hy(T * out_a);
    down(hy.data(), ya, T * out_a * 4);
    int64_t bits = dev_diff(ya, ra, T * out_a * 4) + (swiglu ? 0 : dev_diff(yb, rb2, T * out_b * 4));
    if (yq) bits += dev_diff(dyq, dyq2, yqb);
    if (!all_finite(hy.data(), hy.size())) bits++;
    /* and the streamed GEMV's two kernels (T = 1: warp-specialized, else the other) the same bits:
     * the fused launch again on the other one, into the apart buffers */
    mla_cuda_set_gemv_ws(0);
    poison(ra, T * out_a * 4);
    poison(rb2, T * out_b * 4);
    if (swiglu) OK(mla_cuda_matmul_q8_swiglu(t, dwa, dwb, in, out_a, dq, T, ra, rb2, NULL, 0, E));
    else OK(mla_cuda_matmul_q8_pair(t, dwa, out_a, ra, dwb, out_b, rb2, in, dq, T, 0, E));
    mla_cuda_set_gemv_ws(1);
    bits += dev_diff(ya, ra, T * out_a * 4) + (swiglu ? 0 : dev_diff(yb, rb2, T * out_b * 4));
    const double us = time_us(fused), us0 = time_us(apart);
    const double bytes = (double)rb * (out_a + out_b);
    add_row(fmt("gemv q8 %s %s = apart = unspecialized", swiglu ? (yq ? "gate+up (+q8)" : "gate+up") : "pair",
                ggml_type_name(t)),
            fmt("%lld+%lldx%lld T=%lld, bytes differing", (long long)out_a, (long long)out_b, (long long)in,
                (long long)T),
            bits ? INFINITY : 0, 0, us, bytes, 0, true);
    add_row(fmt("  (apart: two gemv q8%s)", swiglu ? " + swiglu" : ""), fmt("T=%lld", (long long)T), 0, 0, us0, bytes,
            0, true);
    for (void *p : {dwa, dwb, (void *)dx, dq, (void *)ya, (void *)yb, (void *)ra, (void *)rb2, dyq, dyq2})
        CK(cudaFree(p));
}

/* One-token GEMV inputs for the chains and the timeline: copies of one random W of type t (out
 * rows, or out + out2, or 2 x out for kind 1 / 2 as below; at least min_copies, together past the
 * L2 cache), x and its q8 row, y. launch(i) runs kind 0: one matrix, 1: two of the same input
 * (mla_cuda_matmul_q8_pair, out + out2 rows), 2: gate / up with swiglu (out rows each) on copy i,
 * 3: that and y's q8 buffer (yq). */
struct gemv_inputs {
    uint32_t t;
    int64_t in, out, out2, rows;
    int kind;
    size_t rb, wbytes;
    std::vector<uint8_t *> dw;
    float *dx, *dy;
    void *dq, *yq;
    gemv_inputs(uint32_t t_, int64_t in_, int64_t out_, int kind_, int64_t out2_, int min_copies)
        : t(t_), in(in_), out(out_), out2(out2_), kind(kind_) {
        rb = ggml_row_bytes(t, in);
        rows = kind == 1 ? out + out2 : kind >= 2 ? 2 * out : out;
        wbytes = rb * rows;
        const size_t walloc = mla_cuda_weight_bytes(t, in, rows);
        std::vector<uint8_t> w(wbytes);
        gr_quant_rows(&g_rng, t, w.data(), in, rows);
        const int ncopy = (int)std::min<size_t>(8, std::max<size_t>(min_copies, ((size_t)512 << 20) / walloc));
        for (int i = 0; i < ncopy; i++) dw.push_back((uint8_t *)dup(w.data(), wbytes, walloc + 256));
        std::vector<float> x(in);
        gr_fill(&g_rng, x.data(), in, 1.0f);
        dx = (float *)dup(x.data(), in * 4), dy = (float *)dmalloc(rows * 4 + 64);
        dq = dmalloc(mla_cuda_q8_bytes(1, in));
        yq = dmalloc(mla_cuda_q8_bytes(1, (out + 31) / 32 * 32));
        OK(mla_cuda_quantize_q8(dx, 1, in, dq, 0, E));
    }
    gemv_inputs(const gemv_inputs &) = delete;
    gemv_inputs &operator=(const gemv_inputs &) = delete;
    ~gemv_inputs() {
        for (uint8_t *p : dw) CK(cudaFree(p));
        for (void *p : {(void *)dx, (void *)dy, dq, yq}) CK(cudaFree(p));
    }
    void launch(int i) const {
        uint8_t *wi = dw[(size_t)i % dw.size()];
        uint8_t *w2 = wi + ((size_t)rb * out + 15) / 16 * 16; /* the second matrix: 16-aligned past the first */
        if (kind == 0) OK(mla_cuda_matmul_q8(t, wi, in, out, dq, 1, dy, 0, E));
        else if (kind == 1) OK(mla_cuda_matmul_q8_pair(t, wi, out, dy, w2, out2, dy + out, in, dq, 1, 0, E));
        else OK(mla_cuda_matmul_q8_swiglu(t, wi, w2, in, out, dq, 1, dy, dy + out, kind == 3 ? yq : NULL, 0, E));
    }
};

/* The decode GEMVs of a V3 step at T = 1 as a step runs them: a chain of 8 launches back to back
 * (programmatic launch lets each start under the one before) over copies of W that together pass
 * the L2 cache; us a launch and the copy rate, on both kernels (kind: as gemv_inputs). */
static void time_gemv_chain(uint32_t t, int64_t in, int64_t out, int kind, int64_t out2 = 0) {
    const gemv_inputs G(t, in, out, kind, out2, 1);
    const int64_t rows = G.rows;
    const size_t wbytes = G.wbytes;
    float *dy = G.dy;
    const int chain = g_chain;
    /* the warp-specialized kernel, then the other one (mla_cuda_set_gemv_ws): rows the same bits */
    const int64_t ny = kind == 1 ? out + out2 : out;
    const size_t qb = kind == 3 ? mla_cuda_q8_bytes(1, out) : 0; /* kind 3: y's q8 buffer compared too */
    std::vector<float> res[2];
    std::vector<uint8_t> rq[2];
    for (int ws : {1, 0}) {
        mla_cuda_set_gemv_ws(ws);
        poison(dy, rows * 4);
        if (qb) poison(G.yq, qb);
        const double us = time_us([&](int it) {
            for (int c = 0; c < chain; c++) G.launch(it * chain + c);
        }) / chain;
        res[ws].resize(ny), rq[ws].resize(qb);
        down(res[ws].data(), dy, ny * 4);
        if (qb) down(rq[ws].data(), G.yq, qb);
        const bool same = ws || (memcmp(res[0].data(), res[1].data(), ny * 4) == 0 && all_finite(res[1].data(), ny) &&
                                 rq[0] == rq[1]);
        add_row(fmt("gemv chain %s%s%s", ggml_type_name(t),
                    kind == 1   ? " pair"
                    : kind == 2 ? " gate+up"
                    : kind == 3 ? " gate+up+q8"
                                : "",
                    ws ? "" : " unspecialized = ws"),
                fmt("%lld%sx%lld T=1", (long long)out,
                    kind == 1 ? fmt("+%lld", (long long)out2).c_str() : kind >= 2 ? "x2" : "", (long long)in),
                same ? 0 : INFINITY, 0, us, (double)wbytes, 0, true);
    }
    mla_cuda_set_gemv_ws(1);
}

/* A timeline of the warp-specialized GEMV (mla_cuda_set_gemv_trace): three launches back to back
 * after three untimed ones, every block's stamps, printed as when blocks start, pass the wait on
 * the launch before, see their first and last stage land and end (us from the first launch's
 * first block), the bytes landed in each microsecond, and how long stages take from post to
 * landing by their place in the block. kind: as gemv_inputs (0 one matrix, 2 gate + up). */
static void trace_gemv(uint32_t t, int64_t in, int64_t out, int kind) {
    const int N = MLA_CUDA_GEMV_TRACE_N, L = 3;
    const gemv_inputs G(t, in, out, kind, 0, 2);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t per = (size_t)4 * sms * N; /* stamps a launch: up to 4 blocks an SM */
    unsigned long long *st = (unsigned long long *)dmalloc(per * L * 8);
    CK(cudaMemset(st, 0, per * L * 8));
    for (int i = 0; i < 3; i++) G.launch(i);
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < L; i++) {
        mla_cuda_set_gemv_trace(st + per * i);
        G.launch(3 + i);
    }
    mla_cuda_set_gemv_trace(NULL);
    CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(per * L);
    down(h.data(), st, h.size() * 8);
    unsigned long long t0 = ~0ull;
    for (size_t b = 0; b < per / N; b++)
        if (h[b * N]) t0 = std::min(t0, h[b * N]);
    printf("gemv timeline %s %lldx%lld%s: %d launches back to back, us from the first block's start\n",
           ggml_type_name(t), (long long)out, (long long)in, kind == 2 ? " gate+up" : "", L);
    auto pct = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? std::string("-")
                         : fmt("%6.2f %6.2f %6.2f", v[0], v[v.size() / 2], v.back());
    };
    for (int i = 0; i < L; i++) {
        const unsigned long long *H = h.data() + per * i;
        std::vector<double> ent, wt, first, last, end, lat[4];
        std::vector<double> bins(200, 0.0);
        long nb = 0, stages = 0;
        for (size_t b = 0; b < per / N; b++) {
            const unsigned long long *B = H + b * N;
            if (!B[0]) continue;
            nb++;
            const int nk = (int)B[3];
            stages += nk;
            auto us = [&](unsigned long long v) { return (double)(v - t0) * 1e-3; };
            ent.push_back(us(B[0])), wt.push_back(us(B[1])), end.push_back(us(B[2]));
            if (nk > 0 && B[4]) first.push_back(us(B[4]));
            if (nk > 0 && nk <= N / 2 - 4 && B[4 + nk - 1]) last.push_back(us(B[4 + nk - 1]));
            for (int k = 0; k < nk && k < N / 2 - 4; k++) {
                const double tl = us(B[4 + k]);
                if (tl >= 0 && tl < (double)bins.size()) bins[(size_t)tl] += 1;
                if (B[N / 2 + k]) lat[std::min(k, 3)].push_back(tl - us(B[N / 2 + k]));
            }
        }
        const double sbytes = stages ? (double)G.wbytes / (double)stages : 0; /* a stage's bytes, on average */
        printf("  launch %d: %ld blocks, %ld stages (min / median / max, us)\n", i + 1, nb, stages);
        printf("    start %s | kernel before done %s | first stage landed %s\n", pct(ent).c_str(), pct(wt).c_str(),
               pct(first).c_str());
        printf("    last stage landed %s | end %s\n", pct(last).c_str(), pct(end).c_str());
        printf("    post -> landed, stage 0: %s, 1: %s, 2: %s, 3+: %s\n", pct(lat[0]).c_str(), pct(lat[1]).c_str(),
               pct(lat[2]).c_str(), pct(lat[3]).c_str());
        std::string r;
        size_t hi = 0;
        for (size_t k = 0; k < bins.size(); k++)
            if (bins[k] > 0) hi = k;
        for (size_t k = 0; k <= hi; k++) r += fmt(" %.0f", bins[k] * sbytes * 1e-3); /* bytes a us, in GB/s */
        printf("    GB/s landed a microsecond:%s\n", r.c_str());
    }
    CK(cudaFree(st));
}

static void time_gemv_v3(void) {
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 18432, 0);       /* dense gate (or up) */
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 18432, 2);       /* gate + up + swiglu */
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 18432, 3);       /* and its q8 rounding */
    time_gemv_chain(GGML_TYPE_Q4_K, 18432, 7168, 0);       /* dense down */
    time_gemv_chain(GGML_TYPE_Q8_0, 16384, 7168, 0);       /* attention output */
    time_gemv_chain(GGML_TYPE_Q8_0, 1536, 24576, 0);       /* q_b */
    time_gemv_chain(GGML_TYPE_Q8_0, 7168, 1536, 0);        /* q_a */
    time_gemv_chain(GGML_TYPE_Q8_0, 7168, 576, 0);         /* kv_a */
    time_gemv_chain(GGML_TYPE_Q8_0, 7168, 1536, 1, 576);   /* q_a + kv_a */
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 2048, 2);        /* shared expert gate + up */
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 2048, 3);
    time_gemv_chain(GGML_TYPE_Q6_K, 7168, 129280, 0);      /* output */
    /* the same types at the other one's length: is a rate the type's or the launch length's? */
    time_gemv_chain(GGML_TYPE_Q4_K, 7168, 129280, 0);
    time_gemv_chain(GGML_TYPE_Q6_K, 7168, 18432, 0);
    time_gemv_chain(GGML_TYPE_Q8_0, 7168, 18432, 0);
}

static void check_fused_paged(void); /* gpu_check_attn.inc: the cache side (paged caches) and the MoE plan */

static void check_fused_decode(void) {
    for (int64_t T : {1, 3})
        for (int64_t n : {7168, 1536, 2048, 6144})
            for (int v = 0; v < 3; v++) check_rmsnorm_ex(T, n, v != 1, v != 0);
    check_rmsnorm_ex(2, 9216, true, true); /* past 8192: the two-pass loop, then quantized apart */
    check_rmsnorm_ex(1, 9216, true, false);
    for (int64_t T : {1, 20}) { /* in place: one block a row (T = 20: more rows than slicing takes) */
        check_rmsnorm_ex(T, 7168, true, true, true);
        check_rmsnorm_ex(T, 1536, false, true, true);
        check_rmsnorm_ex(2, 9216, true, true, true);
    }
    check_rmsnorm_ex(20, 7168, true, true);
    /* a prompt's norms with their fp16 rows (the residual's, in place, past 8192: converted apart;
     * and a decode row's bulk copy) */
    check_rmsnorm_ex(300, 7168, true, false, false, true);
    check_rmsnorm_ex(130, 6144, true, false, true, true);
    check_rmsnorm_ex(70, 2048, false, false, false, true);
    check_rmsnorm_ex(3, 9216, true, false, false, true);
    check_rmsnorm_ex(2, 7168, true, true, false, true);
    /* V3's q_a + kv_a (Q8_0), GLM-5's indexer pair, shapes with partial stages */
    for (int64_t T : {1, 2}) {
        check_q8_two(GGML_TYPE_Q8_0, 7168, 1536, 576, T, false);
        check_q8_two(GGML_TYPE_Q8_0, 6144, 2048, 576, T, false);
        check_q8_two(GGML_TYPE_Q4_K, 2048, 77, 333, T, false);
        check_q8_two(GGML_TYPE_Q6_K, 7168, 130, 7, T, false);
        check_q8_two(GGML_TYPE_Q5_0, 1408, 300, 65, T, false);
    }
    /* dense FFN gate / up: V3 (18432), a shared expert (2048), GLM-5 (12288), V2-Lite (10944) */
    for (int64_t T : {1, 2})
        for (uint32_t t : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0}) {
            check_q8_two(t, 7168, 18432, 18432, T, true);
            check_q8_two(t, 7168, 2048, 2048, T, true);
            if (T == 1) check_q8_two(t, 2048, 10944, 10944, T, true);
            /* 48-row stages: 32-row units split over stages of other blocks, the last stage short */
            check_q8_two(t, t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q5_0 ? 256 : 512, 1088, 1088, T, true);
        }
    check_q8_two(GGML_TYPE_Q4_K, 6144, 12288, 12288, 1, true);
    check_fused_paged();
}

static void check_layernorm(int64_t T, int64_t n) {
    std::vector<float> x(T * n), w(n), b(n), ref(T * n), got(T * n);
    gr_fill(&g_rng, x.data(), T * n, 3.0f);
    gr_fill(&g_rng, w.data(), n, 1.0f);
    gr_fill(&g_rng, b.data(), n, 1.0f);
    for (int64_t i = 0; i < T * n; i++) x[i] += 0.5f;
    layernorm(x.data(), n, T, n, w.data(), b.data(), 1e-6f, ref.data(), n);
    float *dx = (float *)dup(x.data(), T * n * 4), *dw = (float *)dup(w.data(), n * 4),
          *db = (float *)dup(b.data(), n * 4);
    float *dy = (float *)dmalloc(T * n * 4);
    poison(dy, T * n * 4);
    OK(mla_cuda_layernorm(dx, n, T, n, dw, db, 1e-6f, dy, n, 0, E));
    down(got.data(), dy, T * n * 4);
    double err = gr_rel_l2(got.data(), ref.data(), T * n);
    double us = time_us([&](int) { OK(mla_cuda_layernorm(dx, n, T, n, dw, db, 1e-6f, dy, n, 0, E)); });
    add_row("layernorm", fmt("T=%lld n=%lld", (long long)T, (long long)n), err, 1e-5, us, 8.0 * T * n + 8.0 * n, 0,
            true);
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(db));
    CK(cudaFree(dy));
}

static void check_swiglu_add(int64_t n) {
    std::vector<float> g(n), u(n), ref(n), got(n);
    gr_fill(&g_rng, g.data(), n, 2.0f);
    gr_fill(&g_rng, u.data(), n, 1.0f);
    act_swiglu(g.data(), u.data(), ref.data(), n);
    float *dg = (float *)dup(g.data(), n * 4), *du = (float *)dup(u.data(), n * 4), *dy = (float *)dmalloc(n * 4);
    poison(dy, n * 4);
    OK(mla_cuda_swiglu(dg, du, dy, n, 0, E));
    down(got.data(), dy, n * 4);
    double err = gr_rel_l2(got.data(), ref.data(), n);
    double us = time_us([&](int) { OK(mla_cuda_swiglu(dg, du, dy, n, 0, E)); });
    add_row("swiglu", fmt("n=%lld", (long long)n), err, 1e-5, us, 12.0 * n, 0, true);
    /* add: y = g; y += u */
    std::vector<float> ref2(g);
    act_add(ref2.data(), u.data(), n);
    CK(cudaMemcpy(dy, dg, n * 4, cudaMemcpyDeviceToDevice));
    OK(mla_cuda_add(dy, du, n, 0, E));
    down(got.data(), dy, n * 4);
    err = gr_rel_l2(got.data(), ref2.data(), n);
    us = time_us([&](int) { OK(mla_cuda_add(dy, du, n, 0, E)); });
    add_row("add", fmt("n=%lld", (long long)n), err, 1e-6, us, 12.0 * n, 0, true);
    CK(cudaFree(dg));
    CK(cudaFree(du));
    CK(cudaFree(dy));
}

static void check_rope(const char *name, const rope_params *rp, int mode, int64_t T, int64_t n_vec, int64_t stride,
                       int64_t pos0) {
    rope_table tb;
    rope_table_init(&tb, rp);
    int64_t tok = n_vec * stride, n = T * tok;
    std::vector<float> x(n), ref, got(n);
    gr_fill(&g_rng, x.data(), n, 1.0f);
    ref = x;
    for (int64_t t = 0; t < T; t++) rope_apply(&tb, (enum rope_mode)mode, ref.data() + t * tok, n_vec, stride, pos0 + t);
    float *dx = (float *)dup(x.data(), n * 4);
    OK(mla_cuda_rope(&tb, mode, dx, T, n_vec, stride, tok, pos0, NULL, 0, E));
    down(got.data(), dx, n * 4);
    double err = gr_rel_l2(got.data(), ref.data(), n);
    double us = time_us([&](int) { OK(mla_cuda_rope(&tb, mode, dx, T, n_vec, stride, tok, pos0, NULL, 0, E)); });
    add_row(name, fmt("T=%lld %lldx%d pos=%lld", (long long)T, (long long)n_vec, rp->n_dims, (long long)pos0), err,
            1e-5, us, 8.0 * T * n_vec * rp->n_dims, 0, true);
    CK(cudaFree(dx));
}

static void check_route(const char *name, const moe_route_params *p, int64_t T, bool with_bias) {
    int n = p->n_expert, k = p->n_used;
    std::vector<float> logits(T * n), bias(n), w_ref(T * k), w_got(T * k);
    std::vector<int32_t> id_ref(T * k), id_got(T * k);
    gr_fill(&g_rng, logits.data(), T * n, 2.0f);
    gr_fill(&g_rng, bias.data(), n, 0.1f);
    for (int64_t t = 0; t < T; t++)
        moe_route(p, logits.data() + t * n, with_bias ? bias.data() : NULL, id_ref.data() + t * k, w_ref.data() + t * k);
    float *dl = (float *)dup(logits.data(), T * n * 4), *db = (float *)dup(bias.data(), n * 4);
    int32_t *di = (int32_t *)dmalloc(T * k * 4);
    float *dw = (float *)dmalloc(T * k * 4);
    poison(di, T * k * 4);
    poison(dw, T * k * 4);
    OK(mla_cuda_moe_route(p, dl, with_bias ? db : NULL, T, di, dw, 0, E));
    down(id_got.data(), di, T * k * 4);
    down(w_got.data(), dw, T * k * 4);
    int64_t mism = 0;
    for (int64_t i = 0; i < T * k; i++) mism += id_got[i] != id_ref[i];
    double err = mism ? INFINITY : gr_rel_l2(w_got.data(), w_ref.data(), T * k);
    if (mism) printf("  moe_route: %lld of %lld expert ids differ\n", (long long)mism, (long long)(T * k));
    double us = time_us([&](int) { OK(mla_cuda_moe_route(p, dl, with_bias ? db : NULL, T, di, dw, 0, E)); });
    add_row(name, fmt("T=%lld E=%d k=%d g=%d/%d", (long long)T, n, k, p->n_group, p->n_group_used), err, 1e-5, us,
            4.0 * T * n, 0, true);
    CK(cudaFree(dl));
    CK(cudaFree(db));
    CK(cudaFree(di));
    CK(cudaFree(dw));
}

static void check_argmax(int64_t T, int64_t n) {
    std::vector<float> l(T * n);
    gr_fill(&g_rng, l.data(), T * n, 3.0f);
    /* a planted tie: the lower index must win */
    l[n / 3] = 100.f;
    l[n / 2] = 100.f;
    std::vector<int32_t> ref(T), got(T);
    for (int64_t t = 0; t < T; t++) {
        int64_t b = 0;
        for (int64_t i = 1; i < n; i++)
            if (l[t * n + i] > l[t * n + b]) b = i;
        ref[t] = (int32_t)b;
    }
    float *dl = (float *)dup(l.data(), T * n * 4);
    int32_t *di = (int32_t *)dmalloc(T * 4);
    poison(di, T * 4);
    OK(mla_cuda_argmax(dl, T, n, di, 0, E));
    down(got.data(), di, T * 4);
    int64_t mism = 0;
    for (int64_t t = 0; t < T; t++) mism += got[t] != ref[t];
    double us = time_us([&](int) { OK(mla_cuda_argmax(dl, T, n, di, 0, E)); });
    add_row("argmax", fmt("T=%lld n=%lld", (long long)T, (long long)n), mism ? INFINITY : 0.0, 0, us, 4.0 * T * n, 0,
            true);
    CK(cudaFree(dl));
    CK(cudaFree(di));
}

#include "tests/gpu/gpu_check_attn.inc"
#include "tests/gpu/gpu_check_prefill.inc"
#include "tests/gpu/gpu_check_dsa.inc"
#include "tests/gpu/gpu_check_sample.inc"

/* The small-batch paths of one weight matrix at several token counts, weights made once: the
 * streamed GEMV (T <= 8; its tensor-core form from MLA_CUDA_GEMVM_TMIN to 16 tokens where it
 * takes the type), the per-warp GEMV and the fp16 tensor cores (split K up to 64 tokens),
 * each checked on sampled rows against the exact product (of x as each path rounds it) and
 * timed, weights rotated past the L2 cache. The rows of each T are where the model's thresholds
 * come from (MLA_CUDA_GEMVS_DENSE, MLA_CUDA_GEMV_TMAX). */
static void sweep_matmul(uint32_t t, int64_t in, int64_t out, const std::vector<int64_t> &Ts) {
    const size_t rb = ggml_row_bytes(t, in), wbytes = rb * out, walloc = mla_cuda_weight_bytes(t, in, out);
    std::vector<uint8_t> w(wbytes);
    gr_quant_rows(&g_rng, t, w.data(), in, out);
    const int ncopy = (int)std::min<size_t>(8, std::max<size_t>(1, ((size_t)512 << 20) / walloc));
    std::vector<void *> dw;
    for (int i = 0; i < ncopy; i++) dw.push_back(dup(w.data(), wbytes, walloc));
    const int64_t Tmax = *std::max_element(Ts.begin(), Ts.end()), nsamp = std::min<int64_t>(out, 24);
    std::vector<int64_t> rows(nsamp);
    std::vector<float> deq(nsamp * in);
    for (int64_t s = 0; s < nsamp; s++) {
        rows[s] = nsamp == out ? s : (int64_t)(gr_u64(&g_rng) % (uint64_t)out);
        quant_dequant_row(t, w.data() + (size_t)rows[s] * rb, deq.data() + s * in, in);
    }
    std::vector<float> x(Tmax * in), xq(Tmax * in), y(Tmax * out);
    gr_fill(&g_rng, x.data(), x.size(), 1.0f);
    gr_q8_round(x.data(), xq.data(), (int64_t)x.size());
    float *dx = (float *)dup(x.data(), x.size() * 4), *dy = (float *)dmalloc(Tmax * out * 4);
    void *dq = dmalloc(std::max(mla_cuda_q8_bytes(Tmax, in), mla_cuda_act_h_bytes(Tmax, in)));
    enum { STREAM, WARP, F16 };
    for (int64_t T : Ts)
        for (int path : {STREAM, WARP, F16}) {
            if (path == STREAM && (T > MLA_CUDA_GEMVM_TMAX || !mla_cuda_q8_supported(t) ||
                                   (T > 8 && !mla_cuda_gemvm_takes(t, in, T))))
                continue;
            if (path == F16 && !mla_cuda_mmh_supported(t, in)) continue;
            auto run = [&](int i) {
                void *wi = dw[i % ncopy];
                if (path == F16) {
                    OK(mla_cuda_act_h(dx, T, in, dq, 0, E));
                    OK(mla_cuda_matmul_h(t, wi, in, out, dq, T, dy, 0, E));
                    return;
                }
                OK(mla_cuda_quantize_q8(dx, T, in, dq, 0, E));
                mla_cuda_set_gemv_stream(path == STREAM ? 8 : 0, g_gs_grouped);
                mla_cuda_set_gemv_mma(g_gm_min, path == STREAM ? MLA_CUDA_GEMVM_TMAX : 0);
                OK(mla_cuda_matmul_q8(t, wi, in, out, dq, T, dy, 0, E));
                mla_cuda_set_gemv_stream(g_gs_dense, g_gs_grouped);
                mla_cuda_set_gemv_mma(g_gm_min, g_gm_max);
            };
            poison(dy, T * out * 4);
            run(0);
            CK(cudaDeviceSynchronize());
            down(y.data(), dy, T * out * 4);
            const float *xr = path == F16 ? x.data() : xq.data();
            std::vector<float> got, ref;
            for (int64_t s = 0; s < nsamp; s++)
                for (int64_t tk = 0; tk < T; tk++) {
                    double acc = 0;
                    for (int64_t i = 0; i < in; i++) acc += (double)deq[s * in + i] * xr[tk * in + i];
                    ref.push_back((float)acc);
                    got.push_back(y[tk * out + rows[s]]);
                }
            const bool finite = all_finite(y.data(), T * out);
            const double err = finite ? gr_rel_l2(got.data(), ref.data(), (int64_t)ref.size()) : INFINITY;
            const double us = time_us(run);
            add_row(fmt("%s %s", path == STREAM ? "gemv q8" : path == WARP ? "gemv q8 rows" : "mma f16",
                        ggml_type_name(t)),
                    fmt("%lldx%lld T=%lld", (long long)out, (long long)in, (long long)T), err,
                    path == F16 ? 2e-3 : 1e-4, us, (double)wbytes + 4.0 * T * (in + out), 2.0 * T * in * out, true);
        }
    for (void *p : dw) CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dq));
}

/* The per-warp integer GEMV (steps of 2-8 tokens) timed on DeepSeek-V3's dense products of a
 * decode step of 4 and 8 tokens, checked as check_matmul does (--gemvq). */
static void time_gemvq_v3(void) {
    for (int64_t T : {4, 8}) {
        check_matmul(GGML_TYPE_Q4_K, 7168, 18432, T, MM_Q8ROWS, true);  /* dense gate / up */
        check_matmul(GGML_TYPE_Q4_K, 18432, 7168, T, MM_Q8ROWS, true);  /* dense down */
        check_matmul(GGML_TYPE_Q8_0, 16384, 7168, T, MM_Q8ROWS, true);  /* attention output */
        check_matmul(GGML_TYPE_Q8_0, 1536, 24576, T, MM_Q8ROWS, true);  /* q_b */
        check_matmul(GGML_TYPE_Q6_K, 7168, 129280, T, MM_Q8ROWS, true); /* output */
    }
}

/* The streamed tensor-core GEMV of 2-16 tokens (kernels/gemvm_cuda.cu; 9-16 as two n-tiles of 8)
 * against the exact product of the quantized x: token counts 2-9, 12, 16 (and 11, 13, 15 outside
 * the quick set), rows not a multiple of a band (32), row lengths with a short last chunk,
 * odd row offsets (Q8_0 / Q6_K rows not 16-aligned), at 8 or fewer tokens and at 9-16; gate + up
 * with swiglu (one launch for Q8_0 where it fits, one a matrix for the K types: gemvm_cuda.cu)
 * and the pair launch bit for bit against single launches; then DeepSeek-V3's dense products of a
 * decode step of 2, 4 and 8 tokens timed beside the per-warp GEMV, and of 9, 12 and 16 tokens
 * (V3's, V2-Lite's and its 102400 x 2048 Q6_K output) beside the fp16 tensor cores that took them
 * before ("mma f16": mla_cuda_matmul_h with x's fp16 conversion; sweep_matmul) (--gemvm). */
static void check_gemvm(bool quick) {
    g_gm_min = 2; /* every token count it can take (restored below) */
    mla_cuda_set_gemv_mma(g_gm_min, g_gm_max);
    for (uint32_t t : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0}) {
        const int64_t k = t == GGML_TYPE_Q8_0 ? 32 : 256;
        for (int64_t T = 2; T <= 16; T++)
            if (T <= 9 || T == 12 || T == 16 || (!quick && T % 2))
                check_matmul(t, 7168, T % 2 ? 77 : 333, T, MM_Q8, false);
        for (auto io : std::vector<std::array<int64_t, 2>>{{k * 5, 1000}, {k * 3, 33}, {18432, 64}, {16384, 31},
                                                           {1536, 301}, {512, 1}, {k, 40}, {2048 + k, 97}}) {
            check_matmul(t, io[0], io[1], quick ? 8 : 3, MM_Q8, false);
            check_matmul(t, io[0], io[1], quick ? 16 : 11, MM_Q8, false);
        }
        for (int64_t T : {4, 12}) check_q8_two(t, 7168, 1536, 576, T, false);
        for (int64_t T : {8, 16}) {
            check_q8_two(t, 2048 + k, 77, 333, T, false);
            check_q8_two(t, 7168, 2048, 2048, T, true);
        }
        for (int64_t T : {3, 9}) check_q8_two(t, 512 + k, 1088, 1088, T, true);
    }
    check_matmul(GGML_TYPE_Q8_0, 1408, 300, 5, MM_Q8, false);  /* 44 units: 1.375 chunks */
    check_matmul(GGML_TYPE_Q8_0, 1408, 300, 13, MM_Q8, false); /* the same, two n-tiles */
    for (int64_t T : quick ? std::vector<int64_t>{} : std::vector<int64_t>{2, 4, 8}) {
        check_matmul(GGML_TYPE_Q4_K, 7168, 18432, T, MM_Q8, true);  /* dense gate / up */
        check_matmul(GGML_TYPE_Q4_K, 18432, 7168, T, MM_Q8, true);  /* dense down */
        check_matmul(GGML_TYPE_Q8_0, 16384, 7168, T, MM_Q8, true);  /* attention output */
        check_matmul(GGML_TYPE_Q8_0, 1536, 24576, T, MM_Q8, true);  /* q_b */
        check_matmul(GGML_TYPE_Q6_K, 7168, 129280, T, MM_Q8, true); /* output */
        check_q8_two(GGML_TYPE_Q4_K, 7168, 18432, 18432, T, true);  /* gate + up + swiglu */
        check_q8_two(GGML_TYPE_Q8_0, 7168, 1536, 576, T, false);    /* q_a + kv_a */
    }
    if (!quick) time_gemvq_v3(); /* the per-warp GEMV at 4 and 8 tokens, beside */
    /* 9-16 tokens, weights made once a shape: the int8 tensor-core GEMV ("gemv q8") beside the
     * fp16 tensor cores ("mma f16"), the path the model took there before, and the per-warp
     * GEMV ("gemv q8 rows"), each against the CPU reference */
    if (!quick) {
        const size_t r0 = g_rows.size();
        const std::vector<int64_t> Ts = {9, 12, 16};
        sweep_matmul(GGML_TYPE_Q4_K, 7168, 18432, Ts);  /* V3 dense gate / up */
        sweep_matmul(GGML_TYPE_Q4_K, 18432, 7168, Ts);  /* V3 dense down */
        sweep_matmul(GGML_TYPE_Q8_0, 16384, 7168, Ts);  /* V3 attention output */
        sweep_matmul(GGML_TYPE_Q8_0, 1536, 24576, Ts);  /* V3 q_b */
        sweep_matmul(GGML_TYPE_Q6_K, 7168, 129280, Ts); /* V3 output */
        sweep_matmul(GGML_TYPE_Q4_K, 2048, 10944, Ts);  /* V2-Lite dense gate / up */
        sweep_matmul(GGML_TYPE_Q8_0, 2048, 3072, Ts);   /* V2-Lite q */
        sweep_matmul(GGML_TYPE_Q8_0, 2048, 2048, Ts);   /* V2-Lite attention output */
        sweep_matmul(GGML_TYPE_Q6_K, 2048, 102400, Ts); /* V2-Lite output */
        /* the two beside each other: each "gemv q8" row and the "mma f16" row of its shape */
        printf("\n9-16 tokens, the int8 tensor-core GEMV (new) against the fp16 tensor cores (before), us:\n"
               "%-32s %9s %9s %8s %s\n",
               "type shape", "new", "fp16", "fp16/new", "checks");
        for (size_t i = r0; i < g_rows.size(); i++) {
            const row &a = g_rows[i];
            if (a.op.rfind("gemv q8 ", 0) != 0 || a.op.find("rows") != std::string::npos) continue;
            const std::string ty = a.op.substr(8);
            for (size_t j = r0; j < g_rows.size(); j++) {
                const row &b = g_rows[j];
                if (b.op != "mma f16 " + ty || b.shape != a.shape) continue;
                printf("%-32s %9.1f %9.1f %8.2f %s\n", (ty + " " + a.shape).c_str(), a.us, b.us,
                       a.us > 0 ? b.us / a.us : 0.0, a.pass && b.pass ? "ok" : "FAIL");
            }
        }
    }
    g_gm_min = MLA_CUDA_GEMVM_TMIN;
    mla_cuda_set_gemv_mma(g_gm_min, g_gm_max);
}

/* The streamed GEMV (Q4_K, Q6_K, Q8_0: kernels/gemvs_cuda.cu) against the exact product of the
 * quantized x: 1-4 items a thread, groups of 32-256 threads (1-8 groups a block), stages of 1-64
 * rows, ragged last stages, 1-8 tokens a step; over MoE plans of one token and of several (tiles
 * of 1-8 pairs; fused gate/up and down, mixed types, a TP rank); the fp16 tensor cores with K
 * split (1-64 tokens, partial rows); then the decode shapes of DeepSeek-V3 and GLM-5 at 1-64
 * tokens on each path (sweep_matmul), and the experts of decode steps of 1-64 tokens with and
 * without the streamed GEMV. --gemv runs these alone. */
/* The paths of the experts' products the checks compare (mla_cuda_matmul_grouped_q8): the
 * streamed GEMV's grouped limit and the grouped tensor-core GEMV's; MOE_PATHS[2 ..] are the ones
 * that take a plan of several tokens apart, [3] the default. */
struct moe_path {
    const char *name;
    int grouped, gmg; /* mla_cuda_set_gemv_stream's grouped_tmax, mla_cuda_set_gemv_mma_grouped's tmax */
};
static const moe_path MOE_PATHS[5] = {{" streamed", 1 << 30, 0},
                                      {" rows", 0, 0},
                                      {" singles + rows", MLA_CUDA_GEMVS_GROUPED, 0},
                                      {" singles + grouped tc", MLA_CUDA_GEMVS_GROUPED, MLA_CUDA_GEMVM_GRP_TMAX},
                                      {" grouped tc", 0, MLA_CUDA_GEMVM_GRP_TMAX}};
static void set_moe_path(const moe_path &p) {
    mla_cuda_set_gemv_stream(g_gs_dense, p.grouped);
    mla_cuda_set_gemv_mma_grouped(p.gmg);
}

static void check_gemv_stream(bool quick) {
    mla_cuda_set_gemv_stream(8, 1 << 30); /* every step it can take */
    mla_cuda_set_gemv_mma_grouped(0);     /* the experts of several tokens too (until the last part) */
    for (uint32_t t : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0}) {
        for (auto io : std::vector<std::array<int64_t, 2>>{{768, 77}, {7168, 333}, {18432, 37}, {16384, 50},
                                                           {32768, 9}, {512, 1000}, {1536, 301}, {2048, 7168}})
            check_matmul(t, io[0], io[1], 1, MM_Q8, false);
        for (int64_t T : {2, 3, 5, 8}) check_matmul(t, T == 3 ? 18432 : 1536, T == 5 ? 7168 : 301, T, MM_Q8, false);
    }
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 256, 8, 7168, 256, 1, 0, 1, false, true);
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 1, 1, 2, false, true);
    check_moe(GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, 8, 2, 1024, 256, 1, 0, 1, false, true);
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 64, 8, 7168, 256, 9, 0, 1, false, true);  /* 1-4 pairs a tile */
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 37, 1, 2, false, true); /* full tiles of 8 */
    check_moe(GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 8, 2, 1024, 256, 13, 0, 1, false, true);
    /* DeepSeek-V2-Lite's experts: 1408 inputs of the down projection, Q5_0 (not whole Q4_K blocks) */
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 64, 6, 2048, 1408, 1, 0, 1, false, true);
    check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 64, 6, 2048, 1408, 11, 0, 1, false, true);
    check_matmul(GGML_TYPE_Q8_0, 1408, 300, 3, MM_Q8, false);
    /* the same inputs streamed and per-warp: the q8 rounding of x and h is the error of both */
    for (int k = 0; k < 3; k++) {
        const gr_rng r0 = g_rng;
        check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 1, 1, 2, false, true);
        g_rng = r0;
        mla_cuda_set_gemv_stream(0, 0);
        check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 1, 1, 2, false, true);
        g_rows.back().op += " rows";
        mla_cuda_set_gemv_stream(8, 1 << 30);
    }
    /* where the grouped tensor-core GEMV does not take a product (sm_120's shared memory): the tiles
     * of one pair streamed, the others per-warp; then the default, the others on the grouped
     * tensor-core GEMV; then every tile there (gate + up of Q4_K / Q8_0 in one launch; Q6_K's,
     * whose two stages do not fit, stay on the pair above; Q5_0 down of 1408 inputs: two chunks,
     * the second of 12 units), ranks 0 and 1 of 2, 1 of 4, tiles of 1-8 pairs, plans of 2 to 64
     * tokens, against the same q8 reference (every row a multiple of 32 here, as in every MoE whose
     * products are of these types) */
    struct moe_case {
        uint32_t gt, dt;
        int64_t experts, used, emb, ff, tokens;
        int rank, world;
        bool grouped_only; /* a case for the grouped form alone */
    };
    const moe_case cases[] = {
        {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 64, 8, 7168, 256, 9, 0, 1, false},
        {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 37, 1, 2, false},
        {GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 64, 6, 2048, 1408, 11, 0, 1, false},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 8, 2, 1024, 256, 13, 0, 1, false},
        {GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 8, 6, 2048, 1408, 2, 0, 1, true}, /* 2 tokens, 6 of 8 experts: tiles of 2 */
        {GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 64, 6, 2048, 1408, 8, 1, 2, true},
        {GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 16, 4, 2048, 512, 6, 0, 2, true},
        {GGML_TYPE_Q6_K, GGML_TYPE_Q6_K, 64, 4, 2048, 1536, 8, 0, 1, true},
        {GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, 16, 4, 1024, 320, 64, 0, 1, true}, /* full tiles */
        {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, 32, 8, 2560, 768, 5, 1, 4, true},
    };
    for (int v = 2; v < 5; v++) {
        set_moe_path(MOE_PATHS[v]);
        for (const moe_case &c : cases) {
            if (c.grouped_only && v == 2) continue;
            check_moe(c.gt, c.dt, c.experts, c.used, c.emb, c.ff, c.tokens, c.rank, c.world, false, true);
            g_rows.back().op += MOE_PATHS[v].name;
        }
    }
    mla_cuda_set_gemv_stream(g_gs_dense, g_gs_grouped);
    for (uint32_t t : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0})
        for (int64_t T : {1, 7, 16, 33, 64}) check_matmul(t, T == 33 ? 1536 : 7168, T == 7 ? 77 : 2048, T, MM_H, false);
    std::vector<int64_t> Ts = {1, 2, 4, 8, 16, 32, 64};
    if (quick) Ts = {1, 4, 32};
    for (auto sh : std::vector<std::array<int64_t, 3>>{{GGML_TYPE_Q4_K, 7168, 18432}, {GGML_TYPE_Q4_K, 18432, 7168},
                                                       {GGML_TYPE_Q4_K, 7168, 2048}, {GGML_TYPE_Q4_K, 6144, 12288},
                                                       {GGML_TYPE_Q8_0, 16384, 7168}, {GGML_TYPE_Q8_0, 1536, 24576},
                                                       {GGML_TYPE_Q8_0, 7168, 1536}, {GGML_TYPE_Q8_0, 7168, 576},
                                                       {GGML_TYPE_Q6_K, 7168, 32768}})
        sweep_matmul((uint32_t)sh[0], sh[1], sh[2], Ts);
    if (!quick) sweep_matmul(GGML_TYPE_Q6_K, 6144, 154880, {1, 8, 32}); /* GLM-5's output matrix */
    sweep_matmul(GGML_TYPE_Q5_0, 1408, 2048, {1, 4});                      /* a V2-Lite expert's down */
    /* the experts of decode steps: all tiles streamed, all per-warp, and the default (sparse
     * plans streamed; else the tiles of one pair streamed, the others per-warp), routed evenly
     * (one pair an expert up to 32 tokens) and clustered (tiles of 1-8 pairs mixed) */
    for (int64_t T : {1, 4, 8, 16, 32, 64})
        for (bool cl : {false, true}) {
            if ((quick && T != 1 && T != 32) || (cl && T == 1)) continue;
            const gr_rng r0 = g_rng;
            for (int v = 0; v < 5; v++) {
                if (T == 1 && v >= 3) continue; /* plans of one token stay streamed */
                g_rng = r0;
                set_moe_path(MOE_PATHS[v]);
                time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, T, true, 0, cl);
                g_rows.back().op += MOE_PATHS[v].name;
                if (cl) g_rows.back().op += " clustered";
            }
            if (T >= 16 && !cl) {
                time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, T, true, 1);
                g_rows.back().op += " f16";
            }
        }
    /* V2-Lite's experts (64 of 2048 x 1408, 6 a token, Q5_0 down) at the steps of a served load */
    for (int64_t T : {2, 8, 16, 32})
        for (int v = 2; v < 5; v++) {
            const gr_rng r0 = g_rng;
            set_moe_path(MOE_PATHS[v]);
            time_moe_real(GGML_TYPE_Q4_K, 64, 6, 2048, 1408, T, true, 0, true, GGML_TYPE_Q5_0);
            g_rows.back().op += std::string(MOE_PATHS[v].name) + " clustered";
            g_rng = r0;
        }
    mla_cuda_set_gemv_stream(g_gs_dense, g_gs_grouped);
    mla_cuda_set_gemv_mma_grouped(g_gmg_max);
}

/* The fp16 tensor cores (mla_cuda_matmul_h), dense; --mmh runs these and the experts' alone. */
static void check_mmh_all(const uint32_t *types, size_t ntypes) {
    /* the fp16 tensor cores (the prompt path): every quantized type, partial tiles of tokens and
     * rows, 4-byte copies (Q8_0, Q6_K: chunks not a multiple of 16 bytes), then the V3 prompt
     * shapes beside the int8 kernel */
    for (size_t k = 0; k < ntypes; k++) {
        const uint32_t t = types[k];
        if (!mla_cuda_mmh_supported(t, 7168)) continue; /* 512 and 1792: multiples of 128 too */
        check_matmul(t, 7168, 2048, 256, MM_H, true);
        check_matmul(t, 512, 101, 77, MM_H, false);
        check_matmul(t, 1536 + 256, 70, 131, MM_H, false);
    }
    check_matmul(GGML_TYPE_Q8_0, 1664, 70, 5, MM_H, false); /* 13 chunks of four blocks */
    for (int64_t T : {128, 512, 2048}) check_matmul(GGML_TYPE_Q4_K, 7168, 2048, T, MM_H, true);
    for (auto sh : std::vector<std::array<int64_t, 3>>{{GGML_TYPE_Q4_K, 7168, 18432}, {GGML_TYPE_Q4_K, 18432, 7168},
                                                       {GGML_TYPE_Q8_0, 16384, 7168}, {GGML_TYPE_Q8_0, 1536, 24576},
                                                       {GGML_TYPE_Q6_K, 7168, 32768}, {GGML_TYPE_IQ2_XXS, 7168, 2048}}) {
        check_matmul((uint32_t)sh[0], sh[1], sh[2], 512, MM_H, true);
        check_matmul((uint32_t)sh[0], sh[1], sh[2], 512, MM_Q8MMA, true);
        check_matmul((uint32_t)sh[0], sh[1], sh[2], 2048, MM_H, true);
    }
}


#ifdef MLA_CUDA_WGMMA
/* The warpgroup kernel (kernels/wgmma_cuda.cu, Q4_K, Q8_0 and Q5_0 on sm_90a) behind mla_cuda_matmul_h
 * (prompts) and mla_cuda_matmul_grouped_h (experts): each tile shape forced in turn on partial
 * tiles of tokens and rows, ragged expert counts, TP ranks, for both types; then timed against the
 * mma.sync kernel (mode 0) at DeepSeek-V3's expert and dense shapes and GLM-5's Q8_0 attention
 * products. --wg runs these alone. */
/* Layout probe: x one-hot at column k0 (token n weighted 1 + n % 7), so that y[n][o] is W[o][k0]
 * times the weight: every (k0, row, token) of one 512 x 128 product, T = 128, checked against the
 * dequantized element to a bound of the row's largest: Q4_K 1% (the fp16 dequantization is
 * ~2^-11 of d sc q and dmin m; any other element of the row differs by d sc or more, ~7% of the
 * largest), Q8_0 0.1% (q d rounded once; another element differs by d or more, about 1/127 of its
 * block's largest). Prints the first misplaced elements. */
static void probe_wg(int mode, uint32_t ty, int64_t in = 512) {
    const int64_t out = 128, T = 128;
    const double tol = ty == GGML_TYPE_Q4_K ? 1e-2 : 1e-3;
    const size_t rb = ggml_row_bytes(ty, in);
    std::vector<uint8_t> w(rb * out);
    gr_quant_rows(&g_rng, ty, w.data(), in, out);
    std::vector<float> deq(in * out), x(T * in, 0.f), y(T * out);
    for (int64_t o = 0; o < out; o++) quant_dequant_row(ty, w.data() + o * rb, deq.data() + o * in, in);
    void *dw = dup(w.data(), w.size());
    float *dx = (float *)dmalloc(T * in * 4), *dy = (float *)dmalloc(T * out * 4);
    void *dh = dmalloc(mla_cuda_act_h_bytes(T, in));
    mlacu_wg_set(mode);
    std::vector<double> rmax(out, 0.0); /* a misplaced element is another weight of the row: off by d sc or more */
    for (int64_t o = 0; o < out; o++)
        for (int64_t k = 0; k < in; k++) rmax[o] = std::max(rmax[o], (double)fabsf(deq[o * in + k]));
    int64_t bad = 0, badk = 0;
    for (int64_t k0 = 0; k0 < in; k0++) {
        for (int64_t n = 0; n < T; n++) x[n * in + k0] = (float)(1 + n % 7);
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        for (int64_t n = 0; n < T; n++) x[n * in + k0] = 0.f;
        OK(mla_cuda_act_h(dx, T, in, dh, 0, E));
        OK(mla_cuda_matmul_h(ty, dw, in, out, dh, T, dy, 0, E));
        down(y.data(), dy, y.size() * 4);
        int64_t nb = 0;
        for (int64_t n = 0; n < T; n++)
            for (int64_t o = 0; o < out; o++) {
                const double want = deq[o * in + k0] * (1 + n % 7), got = y[n * out + o];
                if (!(fabs(got - want) <= tol * rmax[o] * (1 + n % 7))) {
                    if (bad < 12)
                        printf("  probe wg%d %s: k0 %lld row %lld token %lld: got %.6g want %.6g\n", mode,
                               ggml_type_name(ty), (long long)k0, (long long)o, (long long)n, got, want);
                    bad++, nb++;
                }
            }
        badk += nb > 0;
    }
    printf("  probe wg%d %s: %lld of %lld elements misplaced, in %lld of %lld columns\n", mode, ggml_type_name(ty),
           (long long)bad, (long long)(in * out * T), (long long)badk, (long long)in);
    const bool took = mlacu_wg_usable(ty, in, out, T, dw, 0); /* else the probe read the mma.sync kernel */
    add_row(fmt("wg layout probe wg%d", mode), fmt("%s %lldx128 T=128 one-hot", ggml_type_name(ty), (long long)in),
            bad || !took ? INFINITY : 0.0, 0, 0, 0, 0, true);
    mlacu_wg_set(1);
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dh));
}

static void check_wg(void) {
    const int modes[] = {1601, 1602, 3201, 3202, 6401, 6402, 12801, 12802};
    if (!mlacu_wg_usable(GGML_TYPE_Q4_K, 7168, 2048, 2048, (const void *)256, 0)) {
        printf("wgmma: not usable here (needs compute capability 9.0 and no MLA_CUDA_SMEM_CAP)\n");
        return;
    }
    for (uint32_t ty : {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0})
        for (int m : modes) probe_wg(m, ty);
    for (int m : modes) probe_wg(m, GGML_TYPE_Q5_0, 1408); /* rows 8 mod 16 bytes: the 8-byte copies */
    for (int m : modes) {
        mlacu_wg_set(m);
        const size_t r0 = g_rows.size();
        for (uint32_t ty : {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0}) {
            check_matmul(ty, 512, 101, 77, MM_H, false);   /* partial rows and tokens */
            check_matmul(ty, 1536, 300, 131, MM_H, false); /* 12 stages: each buffer used thrice or four times */
            check_matmul(ty, 7168, 2048, 200, MM_H, false);
            check_moe(ty, ty, 16, 4, 7168, 512, 64, 0, 1, false, true, 1);
            check_moe(ty, ty, 8, 2, 1024, 1024, 300, 1, 2, false, true, 1); /* 2-3 tiles an expert */
            check_moe(ty, ty, 32, 8, 2048, 512, 270, 2, 4, false, true, 1);
        }
        check_matmul(GGML_TYPE_Q8_0, 768, 130, 70, MM_H, false); /* Q8_0: in a multiple of 256, not of 512 */
        /* Q4_K rows of an odd number of blocks (V2-Lite's shared-expert down: 2816 = 11 x 256) and
         * Q5_0 rows of 8-byte multiples: the warpgroup kernel takes them (not the mma.sync fallback) */
        for (auto tin : {std::make_pair(GGML_TYPE_Q4_K, 768), std::make_pair(GGML_TYPE_Q5_0, 1408)})
            if (!mlacu_wg_usable(tin.first, tin.second, 130, 300, (const void *)256, 0)) {
                printf("  wgmma does not take %s rows of %d\n", ggml_type_name(tin.first), tin.second);
                add_row("wg takes", fmt("%s in=%d", ggml_type_name(tin.first), tin.second), INFINITY, 0, 0, 0, 0, true);
            }
        check_matmul(GGML_TYPE_Q4_K, 768, 130, 70, MM_H, false);
        check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q4_K, 8, 2, 768, 1280, 300, 1, 2, false, true, 1);
        /* Q5_0 rows of 8-byte multiples (1408: V2-Lite's expert down) */
        check_matmul(GGML_TYPE_Q5_0, 1408, 130, 70, MM_H, false);
        check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, 8, 2, 512, 1408, 300, 0, 1, false, true, 1);
        check_moe(GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, 4, 4, 512, 512, 150, 0, 1, false, true, 1); /* down: mma.sync */
        for (size_t i = r0; i < g_rows.size(); i++) g_rows[i].op += fmt(" wg%d", m);
    }
    for (int m : {0, 1}) { /* mma.sync, then the default tiles */
        mlacu_wg_set(m);
        const size_t r0 = g_rows.size();
        for (int64_t T : {256, 512, 2048, 4096}) time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, T, true, 1);
        /* V2-Lite's experts at a 1k prompt (the down's 1408-wide rows are Q5_0 in a Q4_K_M file) and
         * its shared experts' down (2816 = 11 Q4_K blocks) */
        time_moe_real(GGML_TYPE_Q4_K, 64, 6, 2048, 1408, 1024, true, 1, false, GGML_TYPE_Q5_0);
        check_matmul(GGML_TYPE_Q4_K, 2816, 2048, 1024, MM_H, true);
        check_matmul(GGML_TYPE_Q4_K, 7168, 18432, 2048, MM_H, true);
        check_matmul(GGML_TYPE_Q4_K, 18432, 7168, 2048, MM_H, true);
        check_matmul(GGML_TYPE_Q8_0, 2048, 16384, 2048, MM_H, true); /* GLM-5's q_b */
        check_matmul(GGML_TYPE_Q8_0, 16384, 6144, 2048, MM_H, true); /* GLM-5's output projection */
        check_matmul(GGML_TYPE_Q8_0, 7168, 1536, 2048, MM_H, true);  /* V3's q_a */
        for (size_t i = r0; i < g_rows.size(); i++) g_rows[i].op += m ? " wgmma" : " mma.sync";
    }
    for (int m : {12801, 12802, 6401, 6402}) { /* Q8_0's dense tiles (three buffers at 256 x 128) */
        mlacu_wg_set(m);
        check_matmul(GGML_TYPE_Q8_0, 16384, 6144, 2048, MM_H, true);
        g_rows.back().op += fmt(" wg%d", m);
    }
    for (int m : {1601, 1602, 3201, 3202, 6401}) /* the small tiles at 8 and 16 pairs an expert */
        for (int64_t T : {256, 512}) {
            mlacu_wg_set(m);
            time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, T, true, 1);
            g_rows.back().op += fmt(" wg%d", m);
            time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, T, true, 1, true); /* as a router spreads them */
            g_rows.back().op += fmt(" clustered wg%d", m);
        }
    mlacu_wg_set(1);
}
#else
static void check_wg(void) { printf("wgmma: not built (no sm_90 in the CUDA architectures)\n"); }
#endif

/* ---------------------------------------------------------------- main */
int main(int argc, char **argv) {
    bool quick = false, mma3_only = false, mmh_only = false, moe512 = false, gemv_only = false, wg_only = false, wg_prof = false,
         attn_only = false, fused_only = false, gemvt = false, gemvtrace = false, gemvq = false, gemvm = false, gemvm1 = false, attn1 = false,
         gemvgrp = false, prefill = false, prefill1 = false, dsa_only = false, attnlong = false, sample_only = false, head_wg = false,
         ceilings = false, router_only = false, prefill_glm = false;
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--ceilings")) ceilings = true; /* the copy rate alone, for a roofline elsewhere */
        else if (!strcmp(argv[i], "--mma3")) mma3_only = true;
        else if (!strcmp(argv[i], "--router")) router_only = true;
        else if (!strcmp(argv[i], "--mmh")) mmh_only = true;
        else if (!strcmp(argv[i], "--moe512")) moe512 = true; /* one timed run: for a profiler */
        else if (!strcmp(argv[i], "--gemv")) gemv_only = true;
        else if (!strcmp(argv[i], "--gemvgrp")) gemvgrp = true; /* the grouped float GEMV against the dense one */
        else if (!strcmp(argv[i], "--gemvq")) gemvq = true; /* the integer GEMV of 2-8 tokens, timed */
        else if (!strcmp(argv[i], "--gemvm")) gemvm = true; /* its tensor-core form, checked and timed */
        else if (!strcmp(argv[i], "--gemvm1")) gemvm1 = true; /* V3's dense products at 8 tokens, once: for a profiler */
        else if (!strcmp(argv[i], "--wg")) wg_only = true;
        else if (!strcmp(argv[i], "--wgprof")) wg_prof = true; /* one timed run each: for a profiler */
        else if (!strcmp(argv[i], "--attn")) attn_only = true;  /* the attention-side ops (quick set) */
        else if (!strcmp(argv[i], "--attn1")) attn1 = true; /* one token's attention, grid shapes timed */
        else if (!strcmp(argv[i], "--dsa")) dsa_only = true; /* the DSA indexer, old vs new timed */
        else if (!strcmp(argv[i], "--head")) head_wg = true; /* the per-head products of prompts, wgmma vs mma.sync */
        else if (!strcmp(argv[i], "--sample")) sample_only = true; /* device sampling vs the host's, timed */
        else if (!strcmp(argv[i], "--attnlong")) attnlong = true; /* V3's decode at 1k-128k keys, checked and timed */
        else if (!strcmp(argv[i], "--fused")) fused_only = true; /* the fused decode ops */
        else if (!strcmp(argv[i], "--gemvt")) gemvt = true;       /* V3's decode GEMVs in chains, timed */
        else if (!strcmp(argv[i], "--gemvt1")) gemvt = true, g_chain = 1, g_reps = 1; /* the same, once: for a profiler */
        else if (!strcmp(argv[i], "--gemvtrace")) gemvtrace = true; /* the warp-specialized GEMV's timeline */
        else if (!strcmp(argv[i], "--prefill")) prefill = true; /* the non-absorbed prompt attention, timed */
        else if (!strcmp(argv[i], "--prefill1")) prefill1 = true; /* its kernels once each: for a profiler */
        else if (!strcmp(argv[i], "--prefill-glm")) prefill_glm = true; /* at GLM's widths alone, timed */
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--ceilings] [--router] [--mma3] [--mmh] [--moe512] [--gemv] [--wg] [--wgprof] [--attn] [--attn1] [--attnlong] [--dsa] [--head] [--sample] [--fused] [--gemvt] [--gemvt1] [--gemvtrace] [--gemvq] [--gemvm] [--gemvm1] [--gemvgrp] [--prefill] [--prefill1] [--prefill-glm] [--out FILE]\n", argv[0]);
            return 2;
        }
    }
    if (getenv("MLA_BF16_TFLOPS")) g_bf16_tflops = atof(getenv("MLA_BF16_TFLOPS"));
    if (quick) g_reps = 10;
    mla_err e0;
    if (mla_cuda_init(0, &e0) != MLA_OK) {
        fprintf(stderr, "mla-gpu-check: %s\n", e0.msg);
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d%d, %d SMs, %.0f GiB, L2 %d MiB\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize >> 20);
    {
        mla_cuda_config cc;
        mla_cuda_config_get(&cc, 512, 64, true);
        char ccs[256];
        mla_cuda_config_str(&cc, ccs, sizeof ccs);
        printf("configuration: %s (attention of a 512 + 64 latent)\n", ccs);
    }
    measure_copy();
    if (ceilings) return 0;
    {
        mla_err e1;
        int rc = cuda_selfcheck(&e1);
        add_row("cuda_selfcheck", "small known-answer", rc == MLA_OK ? 0.0 : INFINITY, 0, 0, 0, 0, true);
        if (rc != MLA_OK) printf("  selfcheck: %s\n", e1.msg);
    }

    static const uint32_t types[] = {MLA_CUDA_WEIGHT_TYPE_LIST}; /* every type the kernels take */
    if (moe512) { /* the experts of a 512-token V3 prompt on the fp16 tensor cores, once */
        g_reps = 1;
        time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, 512, true, 1);
    } else if (attn_only) {
        check_attn_all(true, true);
    } else if (attn1) {
        time_attn_decode1();
    } else if (prefill) {
        check_prefill_all(false, !quick);
    } else if (prefill1) {
        prof_prefill();
    } else if (prefill_glm) {
        check_prefill_glm();
    } else if (attnlong) {
        check_attn_long(true);
    } else if (dsa_only) {
        check_dsa_all(quick);
    } else if (head_wg) {
        check_head_wg();
    } else if (sample_only) {
        check_sample_all(quick);
    } else if (fused_only) {
        check_fused_decode();
    } else if (gemvtrace) { /* V3's dense gate, gate + up and down; a long launch */
        trace_gemv(GGML_TYPE_Q4_K, 7168, 18432, 0);
        trace_gemv(GGML_TYPE_Q4_K, 7168, 18432, 2);
        trace_gemv(GGML_TYPE_Q4_K, 18432, 7168, 0);
        trace_gemv(GGML_TYPE_Q8_0, 16384, 7168, 0);
        trace_gemv(GGML_TYPE_Q4_K, 7168, 73728, 0);
    } else if (gemvt) {
        time_gemv_v3();
    } else if (gemvq) {
        time_gemvq_v3();
    } else if (gemvm) {
        check_gemvm(false);
    } else if (gemvm1) {
        check_matmul(GGML_TYPE_Q4_K, 7168, 18432, 8, MM_Q8, false);
        check_matmul(GGML_TYPE_Q8_0, 16384, 7168, 8, MM_Q8, false);
        check_matmul(GGML_TYPE_Q6_K, 7168, 129280, 8, MM_Q8, false);
    } else if (gemvgrp) {
        check_gemv_grouped_all(types, sizeof types / sizeof types[0]);
    } else if (gemv_only) {
        check_gemv_stream(quick);
    } else if (wg_only) {
        check_wg();
    } else if (wg_prof) { /* V3's experts at 64 and 128 pairs a expert, and a dense prompt product, once */
        g_reps = 1;
        time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, 2048, true, 1);
        time_moe_real(GGML_TYPE_Q4_K, 256, 8, 7168, 2048, 4096, true, 1);
        check_matmul(GGML_TYPE_Q4_K, 7168, 18432, 2048, MM_H, true);
    } else if (mmh_only) { /* the fp16 tensor-core paths alone */
        check_mmh_all(types, sizeof types / sizeof types[0]);
        check_moe_mmh();
    } else if (router_only) {
        check_router(quick);
    } else if (mma3_only) { /* the prefill paths side by side: fp32 GEMV, bf16 mma, split-bf16 mma3 */
        check_router(false);
        for (uint32_t t : {GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ2_XXS}) {
            for (int64_t T : {16, 64, 256, 1024}) {
                check_matmul(t, 7168, 2048, T, MM_GEMV, true);
                check_matmul(t, 7168, 2048, T, MM_MMA, true);
                check_matmul(t, 7168, 2048, T, MM_MMA3, true);
            }
            check_matmul(t, 512, 100, 77, MM_MMA3, false);
            check_matmul(t, 7168, 18432, 2048, MM_MMA3, true);
            check_matmul(t, 7168, 18432, 2048, MM_MMA, true);
        }
    } else { /* every op */
    /* decode GEMV: expert/dense shapes of DeepSeek-V3 (7168) and GLM-5 (6144) */
    for (uint32_t t : types) {
        check_matmul(t, 7168, 2048, 1, MM_GEMV, true);
        check_matmul(t, 7168, 2048, 8, MM_GEMV, true);
        check_matmul(t, 512, 100, 5, MM_GEMV, false);   /* partial block of rows, short row */
        check_matmul(t, 1536, 300, 3, MM_GEMV, false);  /* partial K chunk */
    }
    check_gemv_grouped_all(types, sizeof types / sizeof types[0]);
    check_router(quick);
    /* the integer GEMV (int8 activations): every quantized type, partial row blocks, short rows,
     * token counts over one pass (8) */
    for (uint32_t t : types) {
        if (!mla_cuda_q8_supported(t)) continue;
        check_matmul(t, 7168, 2048, 1, MM_Q8, true);
        check_matmul(t, 7168, 2048, 8, MM_Q8, true);
        check_matmul(t, 512, 101, 5, MM_Q8, false);
        check_matmul(t, 1536, 300, 13, MM_Q8, false);
        check_matmul(t, 256, 3, 2, MM_Q8, false);
    }
    /* decode shapes of DeepSeek-V3 at T = 1 (fp32 GEMV beside the integer one), and the integer
     * GEMV against the tensor cores as T grows (where mm() switches, Q8_TMAX) */
    for (auto sh : std::vector<std::array<int64_t, 3>>{{GGML_TYPE_Q4_K, 7168, 18432}, {GGML_TYPE_Q4_K, 2048, 7168},
                                                       {GGML_TYPE_Q8_0, 16384, 7168}, {GGML_TYPE_Q8_0, 1536, 24576},
                                                       {GGML_TYPE_Q6_K, 7168, 32768}}) {
        check_matmul((uint32_t)sh[0], sh[1], sh[2], 1, MM_Q8, true);
        if (!quick) check_matmul((uint32_t)sh[0], sh[1], sh[2], 1, MM_GEMV, true);
    }
    for (int64_t T : {2, 4, 16, 32, 64, 128}) check_matmul(GGML_TYPE_Q4_K, 7168, 2048, T, MM_Q8, true);
    for (int64_t T : {16, 64, 128}) check_matmul(GGML_TYPE_Q4_K, 7168, 2048, T, MM_MMA3, true);
    /* the int8 tensor cores: every quantized type (edges: partial tiles of tokens and rows, a K
     * that is not a multiple of the 4-unit stage), then the crossover with the GEMV and prefill */
    for (uint32_t t : types) {
        if (!mla_cuda_q8_supported(t)) continue;
        check_matmul(t, 7168, 2048, 256, MM_Q8MMA, true);
        check_matmul(t, 512, 101, 77, MM_Q8MMA, false);
        check_matmul(t, 1536 + 256, 70, 3, MM_Q8MMA, false);
    }
    check_matmul(GGML_TYPE_Q8_0, 1632, 70, 5, MM_Q8MMA, false); /* 51 units: a partial stage */
    for (int64_t T : {8, 16, 32, 64, 128, 512}) check_matmul(GGML_TYPE_Q4_K, 7168, 2048, T, MM_Q8MMA, true);
    for (auto sh : std::vector<std::array<int64_t, 3>>{{GGML_TYPE_Q4_K, 7168, 18432}, {GGML_TYPE_Q8_0, 16384, 7168},
                                                       {GGML_TYPE_Q6_K, 18432, 7168}, {GGML_TYPE_IQ2_XXS, 7168, 2048}})
        check_matmul((uint32_t)sh[0], sh[1], sh[2], 2048, MM_Q8MMA, true);
    check_mmh_all(types, sizeof types / sizeof types[0]);
    check_wg();
    check_gemv_stream(quick);
    check_gemvm(true);
    if (!quick) {
        uint32_t big[] = {GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ2_XXS};
        for (uint32_t t : big) {
            check_matmul(t, 7168, 18432, 1, MM_GEMV, true);
            check_matmul(t, 2048, 7168, 1, MM_GEMV, true);
            check_matmul(t, 6144, 2048, 4, MM_GEMV, true);
        }
    }
    /* prefill: tensor cores */
    for (uint32_t t : types) {
        check_matmul(t, 7168, 2048, 256, MM_MMA, true);
        check_matmul(t, 512, 100, 77, MM_MMA, false);
        check_matmul(t, 7168, 2048, 256, MM_MMA3, true);
        check_matmul(t, 512, 100, 77, MM_MMA3, false);
    }
    if (!quick) {
        uint32_t big[] = {GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_IQ2_XXS};
        for (uint32_t t : big) check_matmul(t, 7168, 18432, 2048, MM_MMA, true);
        check_matmul(GGML_TYPE_Q4_K, 7168, 2048, 16, MM_AUTO, true);
    }
    for (uint32_t t : {GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K})
        check_get_rows(t, 7168, 1000, 64);
    check_get_rows(GGML_TYPE_Q4_K, 6144, 300, 7);

    check_rmsnorm(1, 512);
    check_rmsnorm(4, 1536);
    check_rmsnorm(64, 7168);
    check_rmsnorm(33, 6144);
    check_rmsnorm(1, 7168);  /* a decode step: one block, registers */
    check_rmsnorm(3, 9000);  /* past 8192: the two-pass loop */
    check_rmsnorm(2, 577);
    check_layernorm(16, 128);
    check_swiglu_add(64 * 18432 + 7);
    check_fused_decode();
    {
        rope_params yarn = {64, 10000.0, true, 40.0, 4096.0, 32.0, 1.0, 1.0};
        rope_params plain = {64, 1e6, false, 1.0, 0.0, 0.0, 0.0, 1.0};
        check_rope("rope adjacent yarn", &yarn, ROPE_ADJACENT, 16, 128, 192, 1000);
        check_rope("rope adjacent yarn", &yarn, ROPE_ADJACENT, 1, 1, 576, 163000);
        check_rope("rope adjacent", &plain, ROPE_ADJACENT, 8, 64, 192, 7);
        check_rope("rope neox (indexer)", &plain, ROPE_NEOX, 8, 64, 128, 5000);
    }
    {
        moe_route_params v3 = {256, 8, 8, 4, 2, true, 2.5f};
        moe_route_params g5 = {256, 8, 1, 1, 2, true, 2.5f};
        moe_route_params sm = {64, 6, 1, 1, 1, false, 1.0f};
        moe_route_params tiny = {8, 2, 4, 2, 2, true, 1.0f};
        moe_route_params v2 = {160, 6, 8, 3, 1, false, 16.0f}; /* DeepSeek-V2: softmax, greedy groups */
        check_route("moe_route sigmoid grp", &v3, 64, true);
        check_route("moe_route sigmoid", &g5, 300, true);
        check_route("moe_route softmax", &sm, 17, false);
        check_route("moe_route tiny", &tiny, 9, true);
        check_route("moe_route softmax grp", &v2, 33, false);
    }
    check_argmax(8, 129280);
    check_argmax(1, 2048);
    check_attn_all(quick, false); /* the long-context rows: --attn, --attnlong (their CPU references take ~30 s) */
    check_prefill_all(quick, false);
    check_dsa_all(quick);
    check_head_wg();
    check_sample_all(true);
    } /* every op */

    /* table */
    FILE *fo = out_path ? fopen(out_path, "w") : NULL;
    int fails = 0;
    for (int pass = 0; pass < 2; pass++) {
        FILE *f = pass ? fo : stdout;
        if (!f) continue;
        fprintf(f, "\n| op | shape | rel err | bound | ok | time us | GB/s | TFLOP/s | %% ceiling |\n");
        fprintf(f, "|---|---|---|---|---|---|---|---|---|\n");
        for (const row &r : g_rows) {
            if (!pass && !r.pass) fails++;
            fprintf(f, "| %s | %s | %.2e | %.0e | %s | %.2f | %.1f | %.2f | %s |\n", r.op.c_str(), r.shape.c_str(),
                    r.err, r.bound, r.pass ? "ok" : "FAIL", r.us, r.gbs, r.tflops,
                    r.frac >= 0 ? fmt("%.0f%%", 100 * r.frac).c_str() : "-");
        }
        fprintf(f, "\n%d checks, %d failed. Ceilings: copy %.0f GB/s, bf16 %.0f TFLOP/s. Device: %s\n",
                (int)g_rows.size(), fails, g_copy_gbs, g_bf16_tflops, prop.name);
    }
    if (fo) fclose(fo);
    return fails ? 1 : 0;
}
