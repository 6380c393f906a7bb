/* matmul: y[T, out] = x[T, in] * W^T for a GGUF weight matrix W (ne0 = in contiguous,
 * ne1 = out rows) of any type quant_dot_row supports, and the transposed product used by
 * legacy attn_kv_b absorption.
 *
 * mla_mat is a view (no ownership): rows/columns of a tensor in the mmap, e.g. one rank's
 * shard or one expert's slice. Column views start on a quant-block boundary. */
#ifndef MATMUL_H
#define MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "common/threadpool.h"

typedef struct mla_mat {
    uint32_t type;        /* enum ggml_type */
    const uint8_t *data;  /* first element of view row 0 */
    size_t row_stride;    /* bytes between rows */
    int64_t n_in;         /* elements per row in the view */
    int64_t n_out;        /* rows in the view */
} mla_mat;

/* A dense view of a whole 2-D matrix (or one ne2 slice when slice >= 0 for 3-D tensors). */
mla_mat mla_mat_make(uint32_t type, const void *data, int64_t ne0, int64_t ne1);
/* Rows [r0, r1) of m. */
mla_mat mla_mat_rows(const mla_mat *m, int64_t r0, int64_t r1);
/* Columns [c0, c1) of m; c0 and c1 - c0 must be multiples of the type's block size. */
mla_mat mla_mat_cols(const mla_mat *m, int64_t c0, int64_t c1);
/* Slice s of a 3-D tensor whose 2-D slices have ne1 rows of ne0 elements. */
mla_mat mla_mat_slice(uint32_t type, const void *data, int64_t ne0, int64_t ne1, int64_t s);

/* y[t*ldy + o] = sum_i x[t*ldx + i] * W[o, i], t < T, o < W->n_out. */
void matmul(threadpool *tp, const float *x, int64_t ldx, int64_t T, const mla_mat *W, float *y,
            int64_t ldy);
/* y[t*ldy + i] = sum_o x[t*ldx + o] * W[o, i] (x has W->n_out columns, y has W->n_in). */
void matmul_t(threadpool *tp, const float *x, int64_t ldx, int64_t T, const mla_mat *W, float *y,
              int64_t ldy);

#endif
