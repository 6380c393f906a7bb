/* quant_tool: command-line access to kernels/quant for the Python checks (tests/quant/check_*.py).
 *   quant_tool dequant TYPE IN OUT      IN: raw blocks; OUT: float32 of every element
 *   quant_tool dot TYPE ROWS X OUT      ROWS: raw rows of n elements, n = size(X)/4; X: float32;
 *                                       OUT: float32 quant_dot_row(row_r, X) for each row
 * TYPE is a ggml type name (Q4_K, IQ2_XXS, F16...). Each row / the whole input is copied into an
 * exactly sized heap buffer so that AddressSanitizer sees any read past its end. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ggml_types.h"
#include "common/mla_err.h"
#include "kernels/quant.h"

static int find_type(const char *name, uint32_t *t) {
    for (uint32_t i = 0; i < GGML_TYPE_COUNT; i++) {
        const ggml_type_info *ti = ggml_type_get(i);
        if (ti && strcmp(ti->name, name) == 0) {
            *t = i;
            return 0;
        }
    }
    return -1;
}

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = mla_xmalloc(sz > 0 ? (size_t)sz : 1);
    if (sz > 0 && fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fprintf(stderr, "%s: short read\n", path);
        exit(2);
    }
    fclose(f);
    *len = (size_t)sz;
    return buf;
}

static void write_all(const char *path, const void *p, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(p, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

int main(int argc, char **argv) {
    bool deq = argc == 5 && !strcmp(argv[1], "dequant");
    bool dot = argc == 6 && !strcmp(argv[1], "dot");
    if (!deq && !dot) {
        fprintf(stderr, "usage: %s dequant TYPE IN OUT | dot TYPE ROWS X OUT\n", argv[0]);
        return 2;
    }
    uint32_t t;
    if (find_type(argv[2], &t) || !quant_supported(t)) {
        fprintf(stderr, "unsupported type %s\n", argv[2]);
        return 3;
    }
    const ggml_type_info *ti = ggml_type_get(t);
    if (deq) {
        size_t len;
        void *src = read_all(argv[3], &len);
        if (len % ti->block_bytes) {
            fprintf(stderr, "%s: %zu bytes is not a whole number of %s blocks\n", argv[3], len, ti->name);
            return 2;
        }
        int64_t n = (int64_t)(len / ti->block_bytes) * ti->block_elems;
        float *dst = mla_xmalloc(n > 0 ? (size_t)n * sizeof(float) : 1);
        quant_dequant_row(t, src, dst, n);
        write_all(argv[4], dst, (size_t)n * sizeof(float));
        free(dst);
        free(src);
        return 0;
    }
    size_t rlen, xlen;
    uint8_t *rows = read_all(argv[3], &rlen);
    float *x = read_all(argv[4], &xlen);
    int64_t n = (int64_t)(xlen / 4);
    size_t rb = ggml_row_bytes(t, n);
    if (n == 0 || rb == 0 || rlen % rb) {
        fprintf(stderr, "bad row geometry: n=%lld, %zu bytes of rows\n", (long long)n, rlen);
        return 2;
    }
    size_t nrows = rlen / rb;
    float *out = mla_xmalloc(nrows * sizeof(float));
    for (size_t r = 0; r < nrows; r++) {
        void *row = mla_xmalloc(rb);
        memcpy(row, rows + r * rb, rb);
        out[r] = quant_dot_row(t, row, x, n);
        free(row);
    }
    write_all(argv[5], out, nrows * sizeof(float));
    free(out);
    free(x);
    free(rows);
    return 0;
}
