/* mm_choose_cuda: which matmul family runs a product. The entry points of kernels/cuda_ops.h
 * that take a shape and a batch (mla_cuda_matmul, mla_cuda_matmul_split, mla_cuda_matmul_gemv,
 * mla_cuda_matmul_q8 and its gate+up and pair forms, mla_cuda_matmul_grouped_q8) pick the
 * kernel family here and launch it through its file (mm_*_cuda.cu, gemvs_cuda.cu,
 * gemvm_cuda.cu). The rules: docs/kernels.md. */
#include <cuda_runtime.h>

#include "kernels/gemvs_cuda.h"
#include "kernels/mm_cuda.h"

using namespace mlacu;

extern "C" int mla_cuda_matmul_gemv(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                                    float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    /* the float types (no integer form) in the integer GEMV's layout where x is 16-byte aligned;
     * else the GEMV of every type */
    const cudaError_t err = !mla_cuda_q8_supported(t) && ((uintptr_t)d_x & 15) == 0
                                ? mlacu_gemvf(t, d_w, in, out, d_x, T, d_y, (cudaStream_t)stream)
                                : mlacu_gemv(t, d_w, in, out, d_x, T, d_y, (cudaStream_t)stream);
    MLACU_CHECK(err, e, "gemv %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_split(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                     int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    /* H200, 7168 -> 2048: the GEMV wins up to T = 64 (258 us vs 633), mma3 from T = 256 (608 us
     * vs 1051); crossover near 150 by interpolation (measured on an H200, 2026-11-29) */
    if (T <= 128) return mla_cuda_matmul_gemv(t, d_w, in, out, d_x, T, d_y, stream, e);
    return mla_cuda_matmul_mma3(t, d_w, in, out, d_x, T, d_y, stream, e);
}

/* The rules, in order (docs/kernels.md): the streamed int8 tensor-core GEMV (dense steps of up
 * to gm_max rows it takes, on the q8 family), the fp16 tensor cores, the int8 tensor cores, the
 * integer GEMV (each where allowed, at enough rows, and every matrix's type takes it), then the
 * float-activation forms: the GEMV (exact, or up to MLACU_GV_TMAX rows; up to MLACU_GV_FLOAT_TMAX
 * where every matrix is float with at most MLACU_GV_FLOAT_OUT outputs), past that the narrow
 * kernel for one such matrix, the split, the bf16 tensor cores. */
extern "C" mla_cuda_mm_family mla_cuda_mm_choose(const mla_cuda_mm_policy *p, const uint32_t *types,
                                                 const int64_t *ins, int n, int64_t rows, int64_t out) {
    MLA_ASSERT(n >= 1);
    bool h = p->h_min > 0 && rows >= p->h_min, q8 = p->q8, flt = true, gm = p->gm_max >= rows;
    for (int i = 0; i < n; i++) {
        h = h && mla_cuda_mmh_supported(types[i], ins[i]);
        q8 = q8 && mla_cuda_q8_supported(types[i]);
        gm = gm && mla_cuda_gemvm_takes(types[i], ins[i], rows);
        flt = flt && (types[i] == GGML_TYPE_F32 || types[i] == GGML_TYPE_F16 || types[i] == GGML_TYPE_BF16);
    }
    if (q8 && gm) return MLA_CUDA_MM_Q8;
    if (h) return MLA_CUDA_MM_H;
    if (q8) return p->q8_mma_min > 0 && rows >= p->q8_mma_min ? MLA_CUDA_MM_Q8_MMA : MLA_CUDA_MM_Q8;
    if (p->exact) return MLA_CUDA_MM_GEMV;
    const bool narrow = flt && out <= MLACU_GV_FLOAT_OUT;
    /* one float matrix of few outputs past the GEMV: fp32-class accuracy, as split asks too */
    if (narrow && n == 1 && rows > MLACU_GV_FLOAT_TMAX && mla_cuda_narrow_supported(types[0], ins[0], out))
        return MLA_CUDA_MM_NARROW;
    if (p->split) return MLA_CUDA_MM_SPLIT;
    return rows <= (narrow ? MLACU_GV_FLOAT_TMAX : MLACU_GV_TMAX) ? MLA_CUDA_MM_GEMV : MLA_CUDA_MM_MMA;
}

extern "C" int mla_cuda_matmul(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                               float *d_y, mla_cuda_stream stream, mla_err *e) {
    const mla_cuda_mm_policy none = {false, false, false, 0, 0, 0};
    const mla_cuda_mm_family f = mla_cuda_mm_choose(&none, &t, &in, 1, T, out);
    if (f == MLA_CUDA_MM_GEMV) return mla_cuda_matmul_gemv(t, d_w, in, out, d_x, T, d_y, stream, e);
    if (f == MLA_CUDA_MM_NARROW) return mla_cuda_matmul_narrow(t, d_w, in, out, d_x, T, d_y, stream, e);
    return mla_cuda_matmul_mma(t, d_w, in, out, d_x, T, d_y, stream, e);
}

/* mla_cuda_set_gemv_stream: the streamed GEMV for dense steps of up to g_gs_dense tokens and
 * for the experts of steps of up to g_gs_grouped tokens (0: never; MLA_CUDA_GEMVS_SINGLES: one) */
static int g_gs_dense = MLA_CUDA_GEMVS_DENSE, g_gs_grouped = MLA_CUDA_GEMVS_GROUPED;
extern "C" void mla_cuda_set_gemv_stream(int dense_tmax, int grouped_tmax) {
    MLA_ASSERT(dense_tmax >= 0 && dense_tmax <= MLACU_MOE_TILE && grouped_tmax >= MLA_CUDA_GEMVS_SINGLES);
    g_gs_dense = dense_tmax;
    g_gs_grouped = grouped_tmax;
}
extern "C" void mla_cuda_set_gemv_ws(int on) { gemvs_set_ws(on != 0); }
/* mla_cuda_set_gemv_mma: the streamed tensor-core GEMV for dense steps of g_gm_min .. g_gm_max tokens */
static int g_gm_min = MLA_CUDA_GEMVM_TMIN, g_gm_max = MLA_CUDA_GEMVM_TMAX;
extern "C" void mla_cuda_set_gemv_mma(int tmin, int tmax) {
    MLA_ASSERT(tmin >= 2 && tmax >= 0 && tmax <= MLA_CUDA_GEMVM_TMAX);
    g_gm_min = tmin, g_gm_max = tmax;
}
/* whether a dense step of T tokens over nm matrices of type t takes it */
static bool gm_takes(uint32_t t, int64_t in, int nm, int64_t T) {
    return T >= g_gm_min && T <= g_gm_max && gemvm_supported(t, in, nm, T);
}
extern "C" bool mla_cuda_gemvm_takes(uint32_t t, int64_t in, int64_t T) { return gm_takes(t, in, 1, T); }
/* mla_cuda_set_gemv_mma_grouped: plans of 2 .. g_gmg_max tokens */
static int g_gmg_max = MLA_CUDA_GEMVM_GRP_TMAX;
extern "C" void mla_cuda_set_gemv_mma_grouped(int tmax) {
    MLA_ASSERT(tmax >= 0);
    g_gmg_max = tmax;
}
extern "C" void mla_cuda_set_gemv_trace(unsigned long long *d_stamps) { gemvs_set_trace(d_stamps); }
static bool gs_grouped_on(const mla_cuda_moe_plan *pl) {
    return pl->tokens <= (g_gs_grouped == MLA_CUDA_GEMVS_SINGLES ? 1 : g_gs_grouped);
}

extern "C" int mla_cuda_matmul_q8(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                                  float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_w & 15) == 0);
    if (T == 0) return MLA_OK;
    if (gm_takes(t, in, 1, T)) {
        cudaError_t err = gemvm_dense(t, d_w, NULL, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T,
                                      d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 (tensor cores) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
        return MLA_OK;
    }
    if (T <= g_gs_dense && gemvs_supported(t, in, 1)) {
        cudaError_t err = gemvs_dense(t, d_w, NULL, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T,
                                      d_y, NULL, NULL, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 (streamed) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
        return MLA_OK;
    }
    cudaError_t err = mlacu_gemvq(t, d_w, in, out, d_q8, T, d_y, (cudaStream_t)stream);
    MLACU_CHECK(err, e, "gemv q8 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_q8_swiglu(uint32_t t, const void *d_wg, const void *d_wu, int64_t in, int64_t out,
                                         const void *d_q8, int64_t T, float *d_y, float *d_u, void *d_yq,
                                         mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_wg & 15) == 0 && ((uintptr_t)d_wu & 15) == 0);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && ((uintptr_t)d_yq & 15) == 0));
    if (T == 0) return MLA_OK;
    bool yq_done = false;
    if (gm_takes(t, in, 2, T)) {
        cudaError_t err = gemvm_dense(t, d_wg, d_wu, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in),
                                      T, d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 gate+up (tensor cores) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
    } else if (T <= g_gs_dense && gemvs_supported(t, in, 2)) {
        cudaError_t err = gemvs_dense(t, d_wg, d_wu, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in),
                                      T, d_y, d_yq, &yq_done, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 gate+up (streamed) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
    } else if (mla_cuda_matmul_q8(t, d_wg, in, out, d_q8, T, d_y, stream, e) ||
               mla_cuda_matmul_q8(t, d_wu, in, out, d_q8, T, d_u, stream, e) ||
               mla_cuda_swiglu(d_y, d_u, d_y, T * out, stream, e))
        return MLA_ERR;
    return d_yq && !yq_done ? mla_cuda_quantize_q8(d_y, T, out, d_yq, stream, e) : MLA_OK;
}

extern "C" int mla_cuda_matmul_q8_pair(uint32_t t, const void *d_wa, int64_t out_a, float *d_ya, const void *d_wb,
                                       int64_t out_b, float *d_yb, int64_t in, const void *d_q8, int64_t T,
                                       mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out_a, T);
    check_shape(t, in, out_b, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_wa & 15) == 0 && ((uintptr_t)d_wb & 15) == 0);
    if (T == 0) return MLA_OK;
    if (gm_takes(t, in, 1, T)) {
        cudaError_t err = gemvm_dense_pair(t, d_wa, out_a, d_ya, d_wb, out_b, d_yb, in, d_q8,
                                           (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 pair (tensor cores) %s %lld+%lldx%lld T=%lld", ggml_type_name(t),
                    (long long)out_a, (long long)out_b, (long long)in, (long long)T);
        return MLA_OK;
    }
    if (T <= g_gs_dense && gemvs_supported(t, in, 1)) {
        cudaError_t err = gemvs_dense_pair(t, d_wa, out_a, d_ya, d_wb, out_b, d_yb, in, d_q8,
                                           (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 pair (streamed) %s %lld+%lldx%lld T=%lld", ggml_type_name(t), (long long)out_a,
                    (long long)out_b, (long long)in, (long long)T);
        return MLA_OK;
    }
    if (mla_cuda_matmul_q8(t, d_wa, in, out_a, d_q8, T, d_ya, stream, e)) return MLA_ERR;
    return mla_cuda_matmul_q8(t, d_wb, in, out_b, d_q8, T, d_yb, stream, e);
}

extern "C" int mla_cuda_matmul_grouped_q8(uint32_t t, const void *d_w0, const void *d_w1, size_t estride,
                                          int64_t in, int64_t out, const void *d_q8, int64_t x_rows, int x_div,
                                          const mla_cuda_moe_plan *plan, float *d_y, void *d_yq, mla_cuda_stream stream,
                                          mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(mla_cuda_q8_supported(t) && x_div >= 1 && plan && plan->world >= 1);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && ((uintptr_t)d_yq & 15) == 0));
    MLA_ASSERT(((uintptr_t)d_w0 & 15) == 0 && ((uintptr_t)d_w1 & 15) == 0);
    if (plan->max_tiles <= 0) return MLA_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *sx = (const uint8_t *)d_q8 + mlacu_q8_scale_off(x_rows, in);
    const int64_t y_rows = x_rows * x_div;
    /* the streamed GEMV: every tile (plans of up to g_gs_grouped tokens; by default one), or, by
     * default, the tiles of one pair; the others on the grouped tensor-core GEMV (plans of 2 ..
     * g_gmg_max tokens), else per-warp */
    const int nm = d_w1 ? 2 : 1;
    const bool gs = gemvs_supported(t, in, nm), all = gs && gs_grouped_on(plan);
    const bool singles = gs && !all && g_gs_grouped == MLA_CUDA_GEMVS_SINGLES;
    const bool gm = !all && plan->tokens >= 2 && plan->tokens <= g_gmg_max && gemvm_grouped_supported(t, in, nm);
    bool yq_done = false;
    if (all || singles) {
        cudaError_t err = gemvs_grouped(t, d_w0, d_w1, estride, in, out, d_q8, sx, x_div, plan, singles, d_y, d_yq,
                                        y_rows, &yq_done, s);
        MLACU_CHECK(err, e, "grouped gemv q8 (streamed) %s %lldx%lld", ggml_type_name(t), (long long)out,
                    (long long)in);
    }
    if (gm) {
        /* after the singles' launch the plan's kernel is two back (mla_cuda_moe_plan.settled) */
        mla_cuda_moe_plan pl = *plan;
        pl.settled = plan->settled || singles;
        cudaError_t err = gemvm_grouped(t, d_w0, d_w1, estride, in, out, d_q8, sx, x_div, &pl, singles, d_y, s);
        MLACU_CHECK(err, e, "grouped gemv q8 (tensor cores) %s %lldx%lld", ggml_type_name(t), (long long)out,
                    (long long)in);
    } else if (!all) {
        cudaError_t err = mlacu_grpq(t, d_w0, d_w1, estride, in, out, d_q8, x_rows, x_div, plan, d_y, singles, s);
        MLACU_CHECK(err, e, "grouped gemv q8 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    }
    return d_yq && !yq_done ? mla_cuda_quantize_q8(d_y, y_rows, out, d_yq, stream, e) : MLA_OK;
}
