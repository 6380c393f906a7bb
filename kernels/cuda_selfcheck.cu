/* cuda_selfcheck: small known-answer tests of the CUDA ops against the CPU references, for a
 * worker to run before serving (catches a wrong build, a broken driver or a bad device). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kernels/attn_prefill_cuda.h"
#include "kernels/cuda_internal.h"
#include "kernels/cuda_rand.h"

extern "C" {
#include "kernels/act.h"
#include "kernels/cuda_types.h"
#include "kernels/mla_attn.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
}

namespace {

/* Device scratch owned by one selfcheck run. */
struct scratch {
    void *p[8];
    int n;
};
void *salloc(scratch *s, size_t bytes, const void *init) {
    void *d = NULL;
    if (s->n >= 8 || cudaMalloc(&d, bytes + 16) != cudaSuccess) return NULL;
    s->p[s->n++] = d;
    if (init && cudaMemcpy(d, init, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    if (!init && cudaMemset(d, 0xff, bytes) != cudaSuccess) return NULL;
    return d;
}
void sfree(scratch *s) {
    for (int i = 0; i < s->n; i++) cudaFree(s->p[i]);
    s->n = 0;
}

int compare(const char *what, const float *got, const float *ref, int64_t n, double bound, mla_err *e) {
    double err = gr_rel_l2(got, ref, n);
    if (!(err <= bound)) return mla_errf(e, "cuda_selfcheck: %s: relative error %.3g > %.1g", what, err, bound);
    return MLA_OK;
}

enum mm_kind { MM_GEMV, MM_MMA, MM_Q8, MM_Q8MMA, MM_H };

int check_matmul(uint32_t t, int64_t in, int64_t out, int64_t T, mm_kind k, gr_rng *r, mla_err *e) {
    size_t rb = ggml_row_bytes(t, in);
    uint8_t *w = (uint8_t *)malloc(rb * out);
    float *x = (float *)malloc(sizeof(float) * (in * T + in + 2 * T * out));
    float *deq = x + in * T, *ref = deq + in, *got = ref + T * out;
    gr_quant_rows(r, t, w, in, out);
    gr_fill(r, x, in * T, 1.0f);
    float *xr = (float *)malloc(sizeof(float) * in * T); /* the reference's x: as the q8 path rounds it */
    if (k == MM_Q8 || k == MM_Q8MMA) gr_q8_round(x, xr, in * T);
    else memcpy(xr, x, sizeof(float) * in * T);
    for (int64_t o = 0; o < out; o++) {
        quant_dequant_row(t, w + o * rb, deq, in);
        for (int64_t j = 0; j < T; j++) {
            double acc = 0;
            for (int64_t i = 0; i < in; i++) acc += (double)deq[i] * xr[j * in + i];
            ref[j * out + o] = (float)acc;
        }
    }
    scratch s = {{0}, 0};
    int rc = MLA_ERR;
    void *dw = salloc(&s, rb * out, w);
    float *dx = (float *)salloc(&s, sizeof(float) * in * T, x);
    float *dy = (float *)salloc(&s, sizeof(float) * T * out, NULL);
    void *dq = k == MM_Q8 || k == MM_Q8MMA ? salloc(&s, mla_cuda_q8_bytes(T, in), NULL)
             : k == MM_H                  ? salloc(&s, mla_cuda_act_h_bytes(T, in), NULL)
                                          : dy;
    int run = MLA_ERR;
    if (!dw || !dx || !dy || !dq) {
        mla_errf(e, "cuda_selfcheck: device allocation failed");
    } else if (k == MM_Q8 || k == MM_Q8MMA) {
        run = mla_cuda_quantize_q8(dx, T, in, dq, 0, e);
        if (run == MLA_OK) run = (k == MM_Q8 ? mla_cuda_matmul_q8 : mla_cuda_matmul_q8_mma)(t, dw, in, out, dq, T, dy, 0, e);
    } else if (k == MM_H) {
        run = mla_cuda_act_h(dx, T, in, dq, 0, e);
        if (run == MLA_OK) run = mla_cuda_matmul_h(t, dw, in, out, dq, T, dy, 0, e);
    } else {
        run = (k == MM_MMA ? mla_cuda_matmul_mma : mla_cuda_matmul_gemv)(t, dw, in, out, dx, T, dy, 0, e);
    }
    if (run == MLA_OK) {
        cudaError_t err = cudaMemcpy(got, dy, sizeof(float) * T * out, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) {
            mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(err));
        } else {
            char what[64];
            snprintf(what, sizeof what, "%s %s",
                     k == MM_MMA ? "mma" : k == MM_Q8 ? "gemv q8" : k == MM_Q8MMA ? "mma q8" : k == MM_H ? "mma f16" : "gemv",
                     ggml_type_name(t));
            rc = compare(what, got, ref, T * out, k == MM_MMA ? 1e-2 : k == MM_H ? 2e-3 : 1e-4, e);
        }
    }
    sfree(&s);
    free(w);
    free(x);
    free(xr);
    return rc;
}

int check_small_ops(gr_rng *r, mla_err *e) {
    const int64_t T = 3, n = 576;
    float x[T * n], w[n], ref[T * n], got[T * n];
    gr_fill(r, x, T * n, 2.0f);
    gr_fill(r, w, n, 1.0f);
    scratch s = {{0}, 0};
    int rc = MLA_ERR;
    float *dx = (float *)salloc(&s, sizeof x, x), *dw = (float *)salloc(&s, sizeof w, w);
    float *dy = (float *)salloc(&s, sizeof x, NULL);
    if (!dx || !dw || !dy) {
        mla_errf(e, "cuda_selfcheck: device allocation failed");
        goto out;
    }
    /* rmsnorm */
    rmsnorm(x, n, T, n, w, 1e-6f, ref, n);
    if (mla_cuda_rmsnorm(dx, n, T, n, dw, 1e-6f, dy, n, 0, e) != MLA_OK) goto out;
    if (cudaMemcpy(got, dy, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
    if (compare("rmsnorm", got, ref, T * n, 1e-5, e) != MLA_OK) goto out;
    /* swiglu */
    act_swiglu(x, x + n, ref, n);
    if (mla_cuda_swiglu(dx, dx + n, dy, n, 0, e) != MLA_OK) goto out;
    if (cudaMemcpy(got, dy, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
    if (compare("swiglu", got, ref, n, 1e-5, e) != MLA_OK) goto out;
    /* swiglu fused into the fp16 rows: the same bits as swiglu then act_h (g the T rows of x, u a
     * copy of them; equal fp16 rows mean equal row scales, which set them) */
    {
        const size_t hb = mla_cuda_act_h_bytes(T, n);
        uint8_t *dh = (uint8_t *)salloc(&s, 2 * hb, NULL);
        float *du = (float *)salloc(&s, sizeof x, x);
        uint16_t a[T * n], b[T * n];
        if (!dh || !du) {
            mla_errf(e, "cuda_selfcheck: device allocation failed");
            goto out;
        }
        if (mla_cuda_swiglu(dx, du, dy, T * n, 0, e) != MLA_OK || mla_cuda_act_h(dy, T, n, dh, 0, e) != MLA_OK ||
            mla_cuda_swiglu_h(dx, du, T, n, dh + hb, 0, e) != MLA_OK)
            goto out;
        if (cudaMemcpy(a, dh, sizeof a, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(b, dh + hb, sizeof b, cudaMemcpyDeviceToHost) != cudaSuccess)
            goto cuda_fail;
        if (memcmp(a, b, sizeof a)) {
            mla_errf(e, "cuda_selfcheck: swiglu_h differs from swiglu then act_h");
            goto out;
        }
    }
    /* rope (YaRN, adjacent pairs) on 9 vectors of 64 per token */
    {
        rope_params rp = {64, 10000.0, true, 40.0, 4096.0, 32.0, 1.0, 1.0};
        rope_table tb;
        rope_table_init(&tb, &rp);
        memcpy(ref, x, sizeof x);
        for (int64_t t = 0; t < T; t++) rope_apply(&tb, ROPE_ADJACENT, ref + t * n, 9, 64, 100 + t);
        if (cudaMemcpy(dy, x, sizeof x, cudaMemcpyHostToDevice) != cudaSuccess) goto cuda_fail;
        if (mla_cuda_rope(&tb, ROPE_ADJACENT, dy, T, 9, 64, n, 100, NULL, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(got, dy, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        if (compare("rope", got, ref, T * n, 1e-5, e) != MLA_OK) goto out;
    }
    /* routing: 64 experts, 4 groups of which 2 used, top 6, sigmoid + bias */
    {
        moe_route_params p = {64, 6, 4, 2, 2, true, 2.5f};
        int32_t ids_ref[T * 6], ids_got[T * 6];
        float w_ref[T * 6], w_got[T * 6];
        for (int64_t t = 0; t < T; t++) moe_route(&p, x + t * 64, w, ids_ref + t * 6, w_ref + t * 6);
        int32_t *dids = (int32_t *)dy;
        float *dwt = dy + T * 6;
        if (mla_cuda_moe_route(&p, dx, dw, T, dids, dwt, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(ids_got, dids, sizeof ids_got, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        if (cudaMemcpy(w_got, dwt, sizeof w_got, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        if (memcmp(ids_ref, ids_got, sizeof ids_ref) != 0) {
            mla_errf(e, "cuda_selfcheck: moe_route chose other experts than the CPU");
            goto out;
        }
        if (compare("moe_route weights", w_got, w_ref, T * 6, 1e-5, e) != MLA_OK) goto out;
    }
    /* greedy */
    {
        int32_t id = -1;
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (x[i] > x[best]) best = i;
        if (mla_cuda_argmax(dx, 1, n, (int32_t *)dy, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(&id, dy, 4, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        if (id != best) {
            mla_errf(e, "cuda_selfcheck: argmax %d, CPU %lld", id, (long long)best);
            goto out;
        }
    }
    rc = MLA_OK;
    goto out;
cuda_fail:
    mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(cudaGetLastError()));
out:
    sfree(&s);
    return rc;
}

/* The absorbed per-head products: float weights (bound 1e-5) and fp16 weights (3e-3: the weights
 * and, on the tensor-core path of T > 8, x rounded to fp16), 3 heads of 96 x 64, T = 1 and 20. */
int check_head(gr_rng *r, int64_t T, bool f16, mla_err *e) {
    enum { H = 3, IN = 64, OUT = 96 };
    std::vector<float> w(H * OUT * IN), x(T * H * IN), ref(T * H * OUT), got(T * H * OUT);
    std::vector<__half> wh(w.size());
    gr_fill(r, w.data(), w.size(), 0.1f);
    gr_fill(r, x.data(), x.size(), 1.0f);
    for (size_t i = 0; i < w.size(); i++) wh[i] = __float2half_rn(w[i]);
    gr_head_matmul_ref(w.data(), x.data(), T, H, IN, OUT, ref.data());
    scratch s = {{0}, 0};
    int rc = MLA_ERR;
    void *dw = f16 ? salloc(&s, wh.size() * 2, wh.data()) : salloc(&s, w.size() * 4, w.data());
    float *dx = (float *)salloc(&s, x.size() * 4, x.data()), *dy = (float *)salloc(&s, got.size() * 4, NULL);
    if (!dw || !dx || !dy) {
        mla_errf(e, "cuda_selfcheck: device allocation failed");
    } else if ((f16 ? mla_cuda_head_matmul_f16(dw, H, IN, OUT, dx, H * IN, IN, T, dy, H * OUT, OUT, NULL, 0, e)
                    : mla_cuda_head_matmul((const float *)dw, H, IN, OUT, dx, H * IN, IN, T, dy, H * OUT, OUT, 0, e)) ==
               MLA_OK) {
        if (cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
            mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(cudaGetLastError()));
        else
            rc = compare(f16 ? "head_matmul fp16" : "head_matmul", got.data(), ref.data(), T * H * OUT, f16 ? 3e-3 : 1e-5, e);
    }
    sfree(&s);
    return rc;
}

/* Absorbed MLA attention, both launch forms, against mla_attn: a prefill-shaped call over one
 * contiguous cache (5 tokens after 20 cached, no split) and a batched decode call over paged
 * caches (3 sequences at positions 40, 5 and 577, their blocks scattered over a pool in a shuffled
 * order, the second layer's rows of each block, grid sized for 600 keys: split over 3 key chunks,
 * some of them empty for the shorter sequences). 12 heads (two head groups of the fp32 kernel, the
 * second partial; one partial group of the tensor-core kernel). The fp32 kernel at kv_lora 64,
 * rope 16 (bound 1e-4), the fp16 tensor-core kernel at 256 + 32 and 512 + 64 (bound 1e-2, fp16
 * rounding).
 * f16: the paged cache holds fp16 rows (the reference reads the same rounded rows). */
int check_attn(gr_rng *r, int L, int R, bool tc, bool f16, mla_err *e) {
    enum { H = 12, T = 5, P0 = 20, B = 3, MAXK = 600, BS = MLA_CUDA_KV_BLOCK, NBS = (MAXK + BS - 1) / BS, POOL = 16 };
    const int ROW = L + R, BLK = 2 * BS * ROW, OFF = BS * ROW; /* in elements */
    const double tol = tc ? 1e-2 : 1e-4;
    static const int32_t pos[B] = {40, 5, 577};
    static const int order[POOL] = {7, 3, 12, 0, 9, 14, 1, 5, 11, 2, 15, 4, 8, 13, 6, 10};
    /* per call (ranks may be threads of one process, each running its own self-check) */
    std::vector<float> qa_v(T * H * L), qp_v(T * H * R), kv_v(B * MAXK * ROW), ref_v(T * H * L), got_v(T * H * L),
        pool_v(POOL * BLK);
    std::vector<__half> pool_h(f16 ? POOL * BLK : 0);
    std::vector<void *> tabs_v(B * NBS + B);
    float *qa = qa_v.data(), *qp = qp_v.data(), *kv = kv_v.data(), *ref = ref_v.data(), *got = got_v.data(),
          *pool = pool_v.data();
    void **tabs = tabs_v.data();
    const size_t qa_b = qa_v.size() * 4, qp_b = qp_v.size() * 4, kv_b = kv_v.size() * 4, got_b = got_v.size() * 4,
                 pool_b = pool_v.size() * (f16 ? 2 : 4), tabs_b = tabs_v.size() * sizeof(void *);
    gr_fill(r, qa, T * H * L, 0.05f);
    gr_fill(r, qp, T * H * R, 0.2f);
    gr_fill(r, kv, B * MAXK * ROW, 1.0f);
    gr_fill(r, pool, POOL * BLK, 1.0f); /* the rows nobody should read stay random */
    const float scale = 0.125f;
    scratch s = {{0}, 0};
    int rc = MLA_ERR;
    float *dqa = (float *)salloc(&s, qa_b, qa), *dqp = (float *)salloc(&s, qp_b, qp);
    float *dkv = (float *)salloc(&s, kv_b, kv), *dout = (float *)salloc(&s, got_b, NULL);
    const size_t wf = mla_cuda_attn_work_floats(B, H, L, 8);
    float *dwork = (float *)salloc(&s, wf * 4, NULL);
    char *dpool = (char *)salloc(&s, pool_b, NULL);
    void **dtabs = (void **)salloc(&s, tabs_b, NULL);
    int32_t *dpos = (int32_t *)salloc(&s, sizeof pos, pos);
    if (!dqa || !dqp || !dkv || !dout || !dwork || !dpool || !dtabs || !dpos) {
        mla_errf(e, "cuda_selfcheck: attention buffers: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    {
        mla_attn_args ca = {qa, qp, T, H, L, R, kv, P0, scale, NULL, NULL, 0, ref};
        mla_attn(NULL, &ca);
        mla_cuda_attn_args a = {dqa, dqp, H * R, R, T, H, L, R, dkv, P0, scale, NULL, NULL, 0, dout, NULL, 0,
                                NULL, 0, NULL, 0, tc, 0, 0, NULL};
        if (mla_cuda_mla_attn(&a, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(got, dout, got_b, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        if (compare(tc ? "mla_attn tensor cores (prefill form)" : "mla_attn (prefill form)", got, ref, T * H * L, tol, e) != MLA_OK) goto out;
    }
    {
        int next = 0;
        if (f16) /* the rows as the fp16 cache holds them, for the references below and the pool */
            for (float &v : kv_v) v = __half2float(__float2half_rn(v));
        for (int b = 0; b < B; b++) {
            const int nb = (pos[b] + 1 + BS - 1) / BS;
            for (int k = 0; k < nb; k++) {
                const int blk = order[next++];
                tabs[b * NBS + k] = dpool + (size_t)blk * BLK * (f16 ? 2 : 4);
                for (int j = k * BS; j < (k + 1) * BS && j <= pos[b]; j++)
                    memcpy(pool + (size_t)blk * BLK + OFF + (size_t)(j - k * BS) * ROW, kv + ((size_t)b * MAXK + j) * ROW,
                           ROW * sizeof(float));
            }
            tabs[B * NBS + b] = dtabs + b * NBS;
            mla_attn_args ca = {qa + b * H * L, qp + b * H * R, 1, H, L, R, kv + (size_t)b * MAXK * ROW, pos[b], scale,
                                NULL, NULL, 0, ref + b * H * L};
            mla_attn(NULL, &ca);
        }
        if (f16)
            for (size_t i = 0; i < pool_h.size(); i++) pool_h[i] = __float2half_rn(pool[i]);
        if (cudaMemcpy(dpool, f16 ? (const void *)pool_h.data() : (const void *)pool, pool_b, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(dtabs, tabs, tabs_b, cudaMemcpyHostToDevice) != cudaSuccess)
            goto cuda_fail;
        mla_cuda_attn_args a = {dqa, dqp, H * R, R, B, H, L, R, NULL, 0, scale, NULL, NULL, 0, dout, dwork, wf,
                                (const float *const *const *)(dtabs + B * NBS), OFF, dpos, MAXK, tc, f16, 0, NULL};
        if (mla_cuda_mla_attn(&a, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(got, dout, (size_t)B * H * L * 4, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
        char what[96];
        snprintf(what, sizeof what, "mla_attn%s (paged%s, batched decode form)", tc ? " tensor cores" : "",
                 f16 ? " fp16 cache" : "");
        if (compare(what, got, ref, B * H * L, tol, e) != MLA_OK) goto out;
    }
    rc = MLA_OK;
    goto out;
cuda_fail:
    mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(cudaGetLastError()));
out:
    sfree(&s);
    return rc;
}

/* The prompt attention in the non-absorbed form (attn_prefill_cuda.h) against mla_attn of q_abs =
 * W_kb q_nope, then W_vb: 70 tokens of one sequence after 60 cached keys (130 keys over 3 blocks
 * of a pool in a shuffled order, the second layer's rows, fp16), 3 heads in groups of 2 (the work
 * area holds two), fp16 or float weights. Bound 1e-2 (fp16 queries, keys, values, weights P). */
int check_prefill(gr_rng *r, int L, int R, int DN, int DV, bool w16, mla_err *e) {
    enum { H = 3, T = 70, P0 = 60, NK = P0 + T, BS = MLA_CUDA_KV_BLOCK, NB = (NK + BS - 1) / BS, POOL = 4 };
    static const int order[NB] = {2, 0, 3};
    const int ROW = L + R, BLK = 2 * BS * ROW, OFF = BS * ROW, DK = DN + R; /* in elements */
    std::vector<float> kv((size_t)NK * ROW), kb((size_t)H * L * DN), vb((size_t)H * DV * L), q((size_t)T * H * DK),
        ref((size_t)T * H * DV), got((size_t)T * H * DV), qabs((size_t)H * L), qpe((size_t)H * R), oabs((size_t)H * L);
    std::vector<__half> pool((size_t)POOL * BLK, __float2half_rn(0.f)), kbh(kb.size()), vbh(vb.size());
    gr_fill(r, kv.data(), (int64_t)kv.size(), 1.0f);
    gr_fill(r, kb.data(), (int64_t)kb.size(), 1.0f / sqrtf((float)L));
    gr_fill(r, vb.data(), (int64_t)vb.size(), 1.0f / sqrtf((float)L));
    gr_fill(r, q.data(), (int64_t)q.size(), 1.5f);
    for (float &v : kv) v = __half2float(__float2half_rn(v)); /* as the fp16 cache and weights hold them */
    for (size_t i = 0; i < kb.size(); i++) kb[i] = __half2float(kbh[i] = __float2half_rn(kb[i]));
    for (size_t i = 0; i < vb.size(); i++) vb[i] = __half2float(vbh[i] = __float2half_rn(vb[i]));
    const float scale = 1.0f / sqrtf((float)DK);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            const float *qh = q.data() + ((size_t)t * H + h) * DK;
            for (int c = 0; c < L; c++) {
                double acc = 0;
                for (int i = 0; i < DN; i++) acc += (double)qh[i] * kb[((size_t)h * L + c) * DN + i];
                qabs[(size_t)h * L + c] = (float)acc;
            }
            for (int i = 0; i < R; i++) qpe[(size_t)h * R + i] = qh[DN + i];
        }
        mla_attn_args ca = {qabs.data(), qpe.data(), 1, H, L, R, kv.data(), P0 + t, scale, NULL, NULL, 0, oabs.data()};
        mla_attn(NULL, &ca);
        for (int h = 0; h < H; h++)
            for (int o = 0; o < DV; o++) {
                double acc = 0;
                for (int c = 0; c < L; c++) acc += (double)vb[((size_t)h * DV + o) * L + c] * oabs[(size_t)h * L + c];
                ref[((size_t)t * H + h) * DV + o] = (float)acc;
            }
    }
    for (int j = 0; j < NK; j++)
        for (int c = 0; c < ROW; c++)
            pool[(size_t)order[j / BS] * BLK + OFF + (size_t)(j % BS) * ROW + c] = __float2half_rn(kv[(size_t)j * ROW + c]);
    scratch s = {{0}, 0};
    int rc = MLA_ERR;
    const size_t wb = mla_cuda_prefill_work_bytes(NK, 2, DN, DV);
    void *dq = salloc(&s, q.size() * 4, q.data()), *dpool = salloc(&s, pool.size() * 2, pool.data());
    void *dkb = w16 ? salloc(&s, kbh.size() * 2, kbh.data()) : salloc(&s, kb.size() * 4, kb.data());
    void *dvb = w16 ? salloc(&s, vbh.size() * 2, vbh.data()) : salloc(&s, vb.size() * 4, vb.data());
    void *dout = salloc(&s, got.size() * 4, NULL), *dwork = salloc(&s, wb, NULL);
    void *tab[NB];
    for (int b = 0; b < NB; b++) tab[b] = dpool ? (char *)dpool + (size_t)order[b] * BLK * 2 : NULL;
    void *dtab = salloc(&s, sizeof tab, tab);
    if (!dq || !dpool || !dkb || !dvb || !dout || !dwork || !dtab) {
        mla_errf(e, "cuda_selfcheck: prompt attention buffers: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    {
        const mla_cuda_prefill_args a = {(const float *)dq, H * DK, DK, T, P0, H, L, R, DN, DV,
                                         (const float *const *)dtab, OFF, dkb, dvb, w16, scale, (float *)dout, H * DV,
                                         DV, dwork, wb};
        if (mla_cuda_prefill_attn(&a, 0, e) != MLA_OK) goto out;
        if (cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
            mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(cudaGetLastError()));
            goto out;
        }
        char what[96];
        snprintf(what, sizeof what, "prompt attention, non-absorbed (%d + %d / %d, %s weights)", DN, R, DV,
                 w16 ? "fp16" : "float");
        if (compare(what, got.data(), ref.data(), (int64_t)got.size(), 1e-2, e) != MLA_OK) goto out;
    }
    rc = MLA_OK;
out:
    sfree(&s);
    return rc;
}

} // namespace

extern "C" int cuda_selfcheck(mla_err *e) {
    gr_rng r = {0xc0ffeeull};
    static const uint32_t types[] = {MLA_CUDA_WEIGHT_TYPE_LIST}; /* every type the kernels take */
    for (uint32_t t : types) {
        if (!quant_supported(t)) continue; /* the CPU reference decides what is checkable */
        if (check_matmul(t, 1280, 40, 3, MM_GEMV, &r, e) != MLA_OK) return MLA_ERR;
        if (check_matmul(t, 512, 130, 20, MM_MMA, &r, e) != MLA_OK) return MLA_ERR;
        if (mla_cuda_q8_supported(t) && check_matmul(t, 1280, 40, 11, MM_Q8, &r, e) != MLA_OK) return MLA_ERR;
        if (mla_cuda_q8_supported(t) && check_matmul(t, 1280, 70, 67, MM_Q8MMA, &r, e) != MLA_OK) return MLA_ERR;
        if (mla_cuda_mmh_supported(t, 1280) && check_matmul(t, 1280, 130, 131, MM_H, &r, e) != MLA_OK) return MLA_ERR;
    }
    if (check_small_ops(&r, e) != MLA_OK) return MLA_ERR;
    for (int64_t T : {1, 20})
        for (bool f16 : {false, true})
            if (check_head(&r, T, f16, e) != MLA_OK) return MLA_ERR;
    for (bool f16 : {false, true}) {
        if (check_attn(&r, 64, 16, false, f16, e) != MLA_OK) return MLA_ERR;
        if (check_attn(&r, 256, 32, true, f16, e) != MLA_OK) return MLA_ERR;
    }
    /* the 512 + 64 tensor-core kernel this device runs (32-key tiles, or 16 within 99 KB a block:
     * sm_120, MLA_CUDA_SMEM_CAP=sm120) over the fp16 cache, the serving default */
    if (check_attn(&r, 512, 64, true, true, e) != MLA_OK) return MLA_ERR;
    /* the prompt attention in the non-absorbed form, the widths with a kernel on this device */
    if (mla_cuda_prefill_supported(256, 32, 64, 64))
        for (bool w16 : {true, false})
            if (check_prefill(&r, 256, 32, 64, 64, w16, e) != MLA_OK) return MLA_ERR;
    if (mla_cuda_prefill_supported(512, 64, 128, 128) && check_prefill(&r, 512, 64, 128, 128, true, e) != MLA_OK)
        return MLA_ERR;
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return mla_errf(e, "cuda_selfcheck: %s", cudaGetErrorString(err));
    return MLA_OK;
}

extern "C" void mla_cuda_config_get(mla_cuda_config *c, int64_t kv_lora, int64_t n_rope, bool attn_tc) {
    const mlacu_devcfg &d = mlacu_devcfg_get();
    c->arch = d.arch;
    c->arch_as = d.arch_as;
    c->smem_dev = d.smem_dev;
    c->smem_cap = d.smem_optin;
#ifdef MLA_CUDA_WGMMA
    c->wgmma = mlacu_hopper_isa();
#else
    c->wgmma = false;
#endif
    c->attn_tile = attn_tc ? mla_cuda_attn_tc_tile(kv_lora, n_rope) : 0;
    c->attn_smem = attn_tc ? mla_cuda_attn_tc_smem(kv_lora, n_rope) : 0;
}

extern "C" const char *mla_cuda_config_attn(const mla_cuda_config *c) {
    return c->attn_tile == 32 ? "tc32" : c->attn_tile == 16 ? "tc16" : "fp32";
}

extern "C" int mla_cuda_config_str(const mla_cuda_config *c, char *buf, size_t n) {
    char as[32] = "";
    if (c->arch_as != c->arch) snprintf(as, sizeof as, " as sm_%d", c->arch_as);
    return snprintf(buf, n,
                    "sm_%d%s, attention %s (%.1f KB a block), shared memory cap %.1f KB a block (device %.1f KB), "
                    "wgmma %s",
                    c->arch, as, mla_cuda_config_attn(c), c->attn_smem / 1024.0, c->smem_cap / 1024.0,
                    c->smem_dev / 1024.0, c->wgmma ? "on" : "off");
}
