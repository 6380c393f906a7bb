#include "matmul.h"

#include <stdlib.h>
#include <string.h>

#include "common/ggml_types.h"
#include "common/mla_err.h"
#include "quant.h"

mla_mat mla_mat_make(uint32_t type, const void *data, int64_t ne0, int64_t ne1) {
    mla_mat m = {type, data, ggml_row_bytes(type, ne0), ne0, ne1};
    MLA_ASSERT(m.row_stride > 0);
    return m;
}

mla_mat mla_mat_slice(uint32_t type, const void *data, int64_t ne0, int64_t ne1, int64_t s) {
    mla_mat m = mla_mat_make(type, data, ne0, ne1);
    m.data += (size_t)s * (size_t)ne1 * m.row_stride;
    return m;
}

mla_mat mla_mat_rows(const mla_mat *m, int64_t r0, int64_t r1) {
    MLA_ASSERT(0 <= r0 && r0 <= r1 && r1 <= m->n_out);
    mla_mat v = *m;
    v.data += (size_t)r0 * m->row_stride;
    v.n_out = r1 - r0;
    return v;
}

mla_mat mla_mat_cols(const mla_mat *m, int64_t c0, int64_t c1) {
    MLA_ASSERT(0 <= c0 && c0 <= c1 && c1 <= m->n_in);
    const ggml_type_info *ti = ggml_type_get(m->type);
    MLA_ASSERT(ti && c0 % ti->block_elems == 0 && (c1 - c0) % ti->block_elems == 0);
    mla_mat v = *m;
    v.data += ggml_row_bytes(m->type, c0);
    v.n_in = c1 - c0;
    return v;
}

#define ROWS_PER_TASK 8

typedef struct mm_ctx {
    const float *x;
    int64_t ldx, T;
    const mla_mat *W;
    float *y;
    int64_t ldy;
} mm_ctx;

static void mm_task(void *vc, int64_t task) {
    const mm_ctx *c = vc;
    const mla_mat *W = c->W;
    int64_t o0 = task * ROWS_PER_TASK, o1 = o0 + ROWS_PER_TASK;
    if (o1 > W->n_out) o1 = W->n_out;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = W->data + (size_t)o * W->row_stride;
        for (int64_t t = 0; t < c->T; t++)
            c->y[t * c->ldy + o] = quant_dot_row(W->type, row, c->x + t * c->ldx, W->n_in);
    }
}

void matmul(threadpool *tp, const float *x, int64_t ldx, int64_t T, const mla_mat *W, float *y,
            int64_t ldy) {
    if (T <= 0 || W->n_out <= 0) return;
    mm_ctx c = {x, ldx, T, W, y, ldy};
    threadpool_run(tp, (W->n_out + ROWS_PER_TASK - 1) / ROWS_PER_TASK, mm_task, &c);
}

static void mmt_task(void *vc, int64_t t) {
    const mm_ctx *c = vc;
    const mla_mat *W = c->W;
    float *row = mla_xmalloc((size_t)W->n_in * sizeof *row);
    float *y = c->y + t * c->ldy;
    memset(y, 0, (size_t)W->n_in * sizeof *y);
    for (int64_t o = 0; o < W->n_out; o++) {
        float a = c->x[t * c->ldx + o];
        if (a == 0.0f) continue;
        quant_dequant_row(W->type, W->data + (size_t)o * W->row_stride, row, W->n_in);
        for (int64_t i = 0; i < W->n_in; i++) y[i] += a * row[i];
    }
    free(row);
}

void matmul_t(threadpool *tp, const float *x, int64_t ldx, int64_t T, const mla_mat *W, float *y,
              int64_t ldy) {
    if (T <= 0) return;
    mm_ctx c = {x, ldx, T, W, y, ldy};
    threadpool_run(tp, T, mmt_task, &c);
}
