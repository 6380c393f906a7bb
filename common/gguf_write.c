/* gguf_write: streaming GGUF v3 writer (see gguf_write.h). */
#include "gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml_types.h"
#include "gguf.h"
#include "outfile.h"

#define GW_ALIGN 32u
#define GW_BUF (8u << 20)

typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void b_put(bytes *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->n + n) c *= 2;
        b->p = mla_xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void b_u32(bytes *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(bytes *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(bytes *b, const char *s) {
    uint64_t n = strlen(s);
    b_u64(b, n);
    b_put(b, s, n);
}

typedef struct tinfo {
    uint64_t size;   /* bytes of data */
    uint64_t offset; /* inside the data section */
} tinfo;

struct gguf_writer {
    char *path;
    outfile of; /* written whole or not at all (outfile.h) */
    bytes kv, ti;
    uint64_t n_kv;
    tinfo *t;
    size_t n_t, cap_t;
    uint64_t data_end; /* offset of the end of the last tensor inside the data section */
    bool begun;
    /* streaming state */
    uint8_t *buf;
    size_t buf_n;
    size_t cur;       /* tensor being written */
    uint64_t cur_done; /* its bytes written so far */
    uint64_t pos;      /* bytes written into the data section */
};

int gguf_write_open(gguf_writer **out, const char *path, mla_err *err) {
    *out = NULL;
    gguf_writer *w = mla_xcalloc(1, sizeof *w);
    w->path = mla_xstrdup(path);
    if (outfile_open(&w->of, w->path, err)) {
        free(w->path);
        free(w);
        return MLA_ERR;
    }
    *out = w;
    return MLA_OK;
}

static void kv_head(gguf_writer *w, const char *key, uint32_t vt) {
    MLA_ASSERT(!w->begun);
    b_str(&w->kv, key);
    b_u32(&w->kv, vt);
    w->n_kv++;
}

void gguf_write_kv_u16(gguf_writer *w, const char *key, uint16_t v) {
    kv_head(w, key, GGUF_VT_UINT16);
    b_put(&w->kv, &v, 2);
}
void gguf_write_kv_u32(gguf_writer *w, const char *key, uint32_t v) {
    kv_head(w, key, GGUF_VT_UINT32);
    b_u32(&w->kv, v);
}
void gguf_write_kv_i32(gguf_writer *w, const char *key, int32_t v) {
    kv_head(w, key, GGUF_VT_INT32);
    b_put(&w->kv, &v, 4);
}
void gguf_write_kv_f32(gguf_writer *w, const char *key, float v) {
    kv_head(w, key, GGUF_VT_FLOAT32);
    b_put(&w->kv, &v, 4);
}
void gguf_write_kv_bool(gguf_writer *w, const char *key, bool v) {
    kv_head(w, key, GGUF_VT_BOOL);
    uint8_t u = v ? 1 : 0;
    b_put(&w->kv, &u, 1);
}
void gguf_write_kv_str(gguf_writer *w, const char *key, const char *v) {
    kv_head(w, key, GGUF_VT_STRING);
    b_str(&w->kv, v);
}
void gguf_write_kv_arr_str(gguf_writer *w, const char *key, const char *const *v, size_t n) {
    kv_head(w, key, GGUF_VT_ARRAY);
    b_u32(&w->kv, GGUF_VT_STRING);
    b_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) b_str(&w->kv, v[i]);
}
void gguf_write_kv_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    kv_head(w, key, GGUF_VT_ARRAY);
    b_u32(&w->kv, GGUF_VT_INT32);
    b_u64(&w->kv, n);
    b_put(&w->kv, v, n * sizeof *v);
}
void gguf_write_kv_arr_bool(gguf_writer *w, const char *key, const bool *v, size_t n) {
    kv_head(w, key, GGUF_VT_ARRAY);
    b_u32(&w->kv, GGUF_VT_BOOL);
    b_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) {
        uint8_t u = v[i] ? 1 : 0;
        b_put(&w->kv, &u, 1);
    }
}

static uint64_t align_up(uint64_t x) { return (x + GW_ALIGN - 1) / GW_ALIGN * GW_ALIGN; }

int gguf_write_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                          uint32_t type, mla_err *err) {
    MLA_ASSERT(!w->begun);
    MLA_ASSERT(n_dims >= 1 && n_dims <= GGUF_MAX_DIMS);
    const ggml_type_info *ti = ggml_type_get(type);
    if (!ti) return mla_errf(err, "%s: tensor %s: unknown type %u", w->path, name, type);
    int64_t n = 1;
    for (uint32_t i = 0; i < n_dims; i++) {
        if (ne[i] < 0) return mla_errf(err, "%s: tensor %s: negative dimension", w->path, name);
        n *= ne[i];
    }
    if (ne[0] % ti->block_elems)
        return mla_errf(err, "%s: tensor %s: row of %lld elements is not a whole number of %s blocks", w->path,
                        name, (long long)ne[0], ti->name);
    uint64_t size = (uint64_t)(n / ti->block_elems) * ti->block_bytes;
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 64;
        w->t = mla_xrealloc(w->t, w->cap_t * sizeof *w->t);
    }
    uint64_t off = align_up(w->data_end);
    w->t[w->n_t++] = (tinfo){size, off};
    w->data_end = off + size;
    b_str(&w->ti, name);
    b_u32(&w->ti, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) b_u64(&w->ti, (uint64_t)ne[i]);
    b_u32(&w->ti, type);
    b_u64(&w->ti, off);
    return MLA_OK;
}

uint64_t gguf_write_data_size(const gguf_writer *w) { return align_up(w->data_end); }

static int flush(gguf_writer *w, mla_err *err) {
    if (outfile_write(&w->of, w->buf, w->buf_n, err)) return MLA_ERR;
    w->buf_n = 0;
    return MLA_OK;
}

static int put(gguf_writer *w, const void *p, size_t n, mla_err *err) {
    const uint8_t *s = p;
    while (n) {
        size_t k = GW_BUF - w->buf_n;
        if (k > n) k = n;
        memcpy(w->buf + w->buf_n, s, k);
        w->buf_n += k;
        s += k;
        n -= k;
        if (w->buf_n == GW_BUF && flush(w, err) < 0) return MLA_ERR;
    }
    return MLA_OK;
}

static int pad_to(gguf_writer *w, uint64_t target, mla_err *err) {
    static const uint8_t zeros[GW_ALIGN];
    while (w->pos < target) {
        size_t k = (size_t)(target - w->pos);
        if (k > GW_ALIGN) k = GW_ALIGN;
        if (put(w, zeros, k, err) < 0) return MLA_ERR;
        w->pos += k;
    }
    return MLA_OK;
}

/* Skip over finished (and empty) tensors, padding up to the next one's offset. */
static int advance(gguf_writer *w, mla_err *err) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].size) {
        w->cur++;
        w->cur_done = 0;
        uint64_t next = w->cur < w->n_t ? w->t[w->cur].offset : align_up(w->data_end);
        if (pad_to(w, next, err) < 0) return MLA_ERR;
    }
    return MLA_OK;
}

int gguf_write_begin_data(gguf_writer *w, mla_err *err) {
    MLA_ASSERT(!w->begun);
    w->begun = true;
    w->buf = mla_xmalloc(GW_BUF);
    bytes h = {0};
    b_put(&h, "GGUF", 4);
    b_u32(&h, 3);
    b_u64(&h, w->n_t);
    b_u64(&h, w->n_kv);
    int rc = put(w, h.p, h.n, err);
    free(h.p);
    if (rc < 0) return rc;
    if (put(w, w->kv.p, w->kv.n, err) < 0) return MLA_ERR;
    if (put(w, w->ti.p, w->ti.n, err) < 0) return MLA_ERR;
    uint64_t hdr = 24 + w->kv.n + w->ti.n;
    static const uint8_t zeros[GW_ALIGN];
    if (put(w, zeros, (size_t)(align_up(hdr) - hdr), err) < 0) return MLA_ERR;
    free(w->kv.p);
    free(w->ti.p);
    w->kv = (bytes){0};
    w->ti = (bytes){0};
    w->cur = 0;
    w->cur_done = 0;
    w->pos = 0;
    if (w->n_t && pad_to(w, w->t[0].offset, err) < 0) return MLA_ERR;
    return advance(w, err);
}

int gguf_write_data(gguf_writer *w, const void *p, size_t n, mla_err *err) {
    MLA_ASSERT(w->begun);
    const uint8_t *s = p;
    while (n) {
        if (w->cur >= w->n_t)
            return mla_errf(err, "%s: %zu bytes of tensor data beyond the last tensor", w->path, n);
        uint64_t left = w->t[w->cur].size - w->cur_done;
        size_t k = left < n ? (size_t)left : n;
        if (put(w, s, k, err) < 0) return MLA_ERR;
        w->cur_done += k;
        w->pos += k;
        s += k;
        n -= k;
        if (advance(w, err) < 0) return MLA_ERR;
    }
    return MLA_OK;
}

static void release(gguf_writer *w) {
    outfile_close(&w->of, 0, NULL); /* (nothing left to do after a close that kept it) */
    free(w->kv.p);
    free(w->ti.p);
    free(w->t);
    free(w->buf);
    free(w->path);
    free(w);
}

int gguf_write_close(gguf_writer *w, mla_err *err) {
    if (!w) return MLA_OK;
    int rc = MLA_OK;
    if (!w->begun) {
        rc = gguf_write_begin_data(w, err);
    }
    if (rc == MLA_OK && w->cur < w->n_t)
        rc = mla_errf(err, "%s: closed after %zu of %zu tensors were written", w->path, w->cur, w->n_t);
    if (rc == MLA_OK) rc = flush(w, err);
    if (rc == MLA_OK) rc = outfile_close(&w->of, 1, err);
    release(w);
    return rc;
}

void gguf_write_abort(gguf_writer *w) {
    if (!w) return;
    release(w);
}
