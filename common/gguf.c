/* gguf: validating, mmap-based GGUF v2/v3 reader (see gguf.h).
 *
 * Format facts (checked against the GGUF spec and llama.cpp's gguf-split):
 *  - header: "GGUF", u32 version, u64 tensor count, u64 kv count. v1 used 32-bit counts and
 *    string lengths and is refused; v2 switched every count/length to 64 bits; v3 only added
 *    big-endian files (recognised by a byte-swapped version field, refused here). A
 *    little-endian v2 file therefore parses exactly like v3.
 *  - kv: string key (u64 length + bytes), u32 value type, value. Array: u32 element type,
 *    u64 count, items (arrays of arrays allowed, each item carrying its own type and count).
 *  - tensor info: name, u32 n_dims, n_dims x i64 ne, u32 ggml type, u64 offset relative to the
 *    data section, which starts after the infos padded to general.alignment (u32, default 32).
 *  - split files NAME-%05d-of-%05d.gguf: gguf-split writes split.no (u16, 0-based),
 *    split.count (u16) and split.tensors.count (i32, tensors of all parts) into every part;
 *    the other metadata only into the first part. Offsets are relative to each part's own data
 *    section.
 *
 * Validation choices: n_dims must be 1..4; each ne >= 0 (an empty dimension is accepted, as
 * ggml does: the tensor then has no bytes); the element count must fit int64 and the byte size
 * size_t; ne0 must be a multiple of the type's block size; tensor data must be aligned and lie
 * inside the file and must not overlap other tensors' data; names and keys must be non-empty
 * and NUL-free; bools must be 0 or 1; duplicate keys (within one part) and duplicate tensor
 * names (across all parts) are refused; counts and lengths are checked against the bytes left
 * before anything is allocated, so memory stays proportional to the file's metadata size;
 * arrays nest at most GGUF_MAX_ARRAY_DEPTH deep; a part may hold at most 2^24 metadata values
 * (array items included) and 2^20 tensors. Values are parsed in place from the mapping; only
 * keys, tensor names and the value tree are copied. Opening never reads tensor data.
 */
#include "gguf.h"
#include "mla_hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_HEADER_BYTES 24u
/* Smallest possible encodings, used to bound counts by the bytes left. */
#define MIN_KV_BYTES 14u     /* key length 8 + 1 key byte + type 4 + 1 value byte */
#define MIN_TINFO_BYTES 33u  /* name length 8 + 1 name byte + n_dims 4 + ne 8 + type 4 + offset 8 */
/* Metadata values (array items included) of one part are materialised as gguf_value (32 bytes
 * each); past this many the file is refused instead of allocating gigabytes. Real files hold
 * well under a million (tokenizer tokens + merges). */
#define MAX_META_VALUES (1u << 24)
#define MAX_TENSORS (1u << 20) /* per part; DeepSeek-V3 has ~1.8k (~45k with unfused experts) */

/* ---------------------------------------------------------------- arena */

typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} arena_blk;

static void *arena_alloc(arena_blk **a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!*a || (*a)->cap - (*a)->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_blk *b = mla_xmalloc(sizeof *b + cap);
        b->next = *a;
        b->used = 0;
        b->cap = cap;
        *a = b;
    }
    void *p = (*a)->mem + (*a)->used;
    (*a)->used += n;
    return p;
}

static void arena_free(arena_blk *a) {
    while (a) {
        arena_blk *n = a->next;
        free(a);
        a = n;
    }
}

/* ---------------------------------------------------------------- string hash table */

/* Open addressing; stores indices + 1 (0 = empty). The key of index i comes from keyf. */
typedef struct strtab {
    uint32_t *slots;
    size_t cap; /* power of two */
} strtab;

typedef const char *(*strtab_keyf)(const void *owner, size_t idx);

static void strtab_init(strtab *t, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 1) cap <<= 1;
    t->slots = mla_xcalloc(cap, sizeof *t->slots);
    t->cap = cap;
}

/* Returns the index holding key, or (size_t)-1; when insert_idx != (size_t)-1 and the key is
 * absent, inserts it. */
static size_t strtab_find(strtab *t, const char *key, strtab_keyf kf, const void *owner,
                          size_t insert_idx) {
    if (!t->slots) return (size_t)-1;
    size_t h = (size_t)mla_fnv1a(key, strlen(key), MLA_FNV_BASIS) & (t->cap - 1);
    for (;;) {
        uint32_t s = t->slots[h];
        if (!s) {
            if (insert_idx != (size_t)-1) t->slots[h] = (uint32_t)(insert_idx + 1);
            return (size_t)-1;
        }
        if (strcmp(kf(owner, s - 1), key) == 0) return s - 1;
        h = (h + 1) & (t->cap - 1);
    }
}

/* ---------------------------------------------------------------- context */

typedef struct gguf_part {
    char *path;
    const uint8_t *base;
    uint64_t size;
    int mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    gguf_kv *kvs;
    uint64_t n_tensors;
    uint64_t meta_end;   /* end of tensor infos */
    uint64_t data_start; /* meta_end padded to the alignment */
} gguf_part;

struct gguf_ctx {
    int n_parts;
    gguf_part *parts;
    arena_blk *arena;
    const gguf_kv **kvs; /* unique keys, first part wins */
    size_t n_kv;
    strtab kv_tab;
    gguf_tensor *tensors;
    size_t n_tensors, cap_tensors;
    strtab t_tab;
    uint64_t hash;
};

static const char *kv_key(const void *owner, size_t i) {
    return ((const gguf_ctx *)owner)->kvs[i]->key;
}
static const char *tensor_key(const void *owner, size_t i) {
    return ((const gguf_ctx *)owner)->tensors[i].name;
}

/* ---------------------------------------------------------------- reader */

typedef struct rd {
    const uint8_t *p;
    uint64_t size, pos;
    const char *file;
    mla_err *err;
    arena_blk **arena;
    uint64_t n_values; /* metadata values materialised so far */
} rd;

__attribute__((format(printf, 3, 4))) static int fail_at(rd *r, uint64_t off, const char *fmt, ...) {
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return mla_errf(r->err, "%s: offset %llu: %s", r->file, (unsigned long long)off, buf);
}

static uint64_t rd_left(const rd *r) { return r->size - r->pos; }

static int rd_need(rd *r, uint64_t n, const char *what) {
    if (n > rd_left(r))
        return fail_at(r, r->pos, "truncated %s: needs %llu bytes, %llu left in the file", what,
                       (unsigned long long)n, (unsigned long long)rd_left(r));
    return MLA_OK;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_uint(rd *r, int n, uint64_t *v, const char *what) {
    if (rd_need(r, (uint64_t)n, what)) return MLA_ERR;
    *v = le(r->p + r->pos, n);
    r->pos += (uint64_t)n;
    return MLA_OK;
}

static int rd_u32(rd *r, uint32_t *v, const char *what) {
    uint64_t x;
    if (rd_uint(r, 4, &x, what)) return MLA_ERR;
    *v = (uint32_t)x;
    return MLA_OK;
}

/* Reads a length-prefixed string (pointer into the buffer). */
static int rd_str(rd *r, gguf_str *s, const char *what) {
    uint64_t start = r->pos, len;
    if (rd_uint(r, 8, &len, what)) return MLA_ERR;
    if (len > rd_left(r)) {
        r->pos = start;
        return fail_at(r, start, "%s length %llu exceeds the %llu bytes left in the file", what,
                       (unsigned long long)len, (unsigned long long)rd_left(r) - 8);
    }
    s->ptr = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += len;
    return MLA_OK;
}

/* Printable, one-line rendering of a name from the file, for messages (truncated with "..."). */
static const char *shown(const char *s, size_t len, char *buf, size_t cap) {
    size_t o = 0, i = 0;
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 4 + 4 >= cap) break; /* room for one escape + "..." + NUL */
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
            buf[o++] = (char)c;
        } else {
            static const char hx[] = "0123456789abcdef";
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hx[c >> 4];
            buf[o++] = hx[c & 15];
        }
    }
    if (i < len) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* Copies a name/key into the arena as a C string; refuses empty names and embedded NULs. */
static int rd_name(rd *r, const char **out, const char *what) {
    uint64_t start = r->pos;
    gguf_str s = {0};
    if (rd_str(r, &s, what)) return MLA_ERR;
    if (s.len == 0) return fail_at(r, start, "empty %s", what);
    if (memchr(s.ptr, 0, (size_t)s.len)) {
        char b[160];
        return fail_at(r, start, "%s '%s' contains a NUL byte", what, shown(s.ptr, (size_t)s.len, b, sizeof b));
    }
    char *c = arena_alloc(r->arena, (size_t)s.len + 1);
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = '\0';
    *out = c;
    return MLA_OK;
}

static const char *const k_vtype_names[] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *gguf_vtype_name(enum gguf_vtype t) {
    if ((unsigned)t <= GGUF_VT_FLOAT64) return k_vtype_names[t];
    return "unknown";
}

static int vtype_fixed_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

static int rd_vtype(rd *r, uint32_t *t, const char *what) {
    uint64_t start = r->pos;
    if (rd_u32(r, t, what)) return MLA_ERR;
    if (*t > GGUF_VT_FLOAT64) return fail_at(r, start, "unknown metadata value type %u", *t);
    return MLA_OK;
}

static int parse_value(rd *r, uint32_t t, gguf_value *v, int depth) {
    uint64_t start = r->pos, x;
    v->type = (enum gguf_vtype)t;
    int sz = vtype_fixed_size(t);
    if (sz) {
        if (rd_uint(r, sz, &x, "metadata value")) return MLA_ERR;
        switch (t) {
        case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
            v->v.u = x;
            break;
        case GGUF_VT_INT8: v->v.i = (int8_t)(uint8_t)x; break;
        case GGUF_VT_INT16: v->v.i = (int16_t)(uint16_t)x; break;
        case GGUF_VT_INT32: v->v.i = (int32_t)(uint32_t)x; break;
        case GGUF_VT_INT64: v->v.i = (int64_t)x; break;
        case GGUF_VT_FLOAT32: {
            uint32_t b = (uint32_t)x;
            float f;
            memcpy(&f, &b, 4);
            v->v.f = f;
            break;
        }
        case GGUF_VT_FLOAT64: {
            double d;
            memcpy(&d, &x, 8);
            v->v.f = d;
            break;
        }
        case GGUF_VT_BOOL:
            if (x > 1) return fail_at(r, start, "bool value %llu is neither 0 nor 1", (unsigned long long)x);
            v->v.b = x != 0;
            break;
        }
        return MLA_OK;
    }
    if (t == GGUF_VT_STRING) return rd_str(r, &v->v.s, "string");
    /* array */
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return fail_at(r, start, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    if (rd_vtype(r, &et, "array element type")) return MLA_ERR;
    uint64_t cnt_off = r->pos, n;
    if (rd_uint(r, 8, &n, "array count")) return MLA_ERR;
    uint64_t min = vtype_fixed_size(et);
    if (et == GGUF_VT_STRING) min = 8;
    if (et == GGUF_VT_ARRAY) min = 12;
    if (n > rd_left(r) / min)
        return fail_at(r, cnt_off, "array count %llu of %s exceeds what the %llu bytes left in the file can hold",
                       (unsigned long long)n, gguf_vtype_name((enum gguf_vtype)et),
                       (unsigned long long)rd_left(r));
    if (n > MAX_META_VALUES - r->n_values)
        return fail_at(r, cnt_off, "array count %llu: the metadata would hold more than %u values",
                       (unsigned long long)n, MAX_META_VALUES);
    r->n_values += n;
    v->v.arr.elem = (enum gguf_vtype)et;
    v->v.arr.n = n;
    v->v.arr.items = n ? arena_alloc(r->arena, (size_t)n * sizeof(gguf_value)) : NULL;
    /* items of an array of arrays each carry their own element type and count */
    for (uint64_t i = 0; i < n; i++)
        if (parse_value(r, et, &v->v.arr.items[i], depth + 1)) return MLA_ERR;
    return MLA_OK;
}

/* ---------------------------------------------------------------- coercion helpers */

/* Integer view of a scalar: 1 ok (signed flag says which member), 0 not an integer type. */
static int value_int(const gguf_value *v, int64_t *si, uint64_t *ui, int *is_signed) {
    switch (v->type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        *ui = v->v.u;
        *is_signed = 0;
        return 1;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        *si = v->v.i;
        *is_signed = 1;
        return 1;
    case GGUF_VT_BOOL:
        *ui = v->v.b;
        *is_signed = 0;
        return 1;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: {
        double d = v->v.f;
        if (!(d == floor(d))) return 0; /* NaN or fractional */
        if (d >= 0 && d < 18446744073709551616.0) {
            *ui = (uint64_t)d;
            *is_signed = 0;
            return 1;
        }
        if (d < 0 && d >= -9223372036854775808.0) {
            *si = (int64_t)d;
            *is_signed = 1;
            return 1;
        }
        return 0;
    }
    default:
        return 0;
    }
}

/* The value as u64 within [0, max]; 1 ok, 0 does not fit / not numeric. */
static int value_u64(const gguf_value *v, uint64_t max, uint64_t *out) {
    int64_t si;
    uint64_t ui;
    int sg;
    if (!value_int(v, &si, &ui, &sg)) return 0;
    if (sg) {
        if (si < 0) return 0;
        ui = (uint64_t)si;
    }
    if (ui > max) return 0;
    *out = ui;
    return 1;
}

/* ---------------------------------------------------------------- parsing one part */

static gguf_kv *part_find_kv(const gguf_part *p, const char *key) {
    for (uint64_t i = 0; i < p->n_kv; i++)
        if (strcmp(p->kvs[i].key, key) == 0) return &p->kvs[i];
    return NULL;
}

static void push_tensor(gguf_ctx *c, const gguf_tensor *t) {
    if (c->n_tensors == c->cap_tensors) {
        c->cap_tensors = c->cap_tensors ? 2 * c->cap_tensors : 64;
        c->tensors = mla_xrealloc(c->tensors, c->cap_tensors * sizeof *c->tensors);
    }
    c->tensors[c->n_tensors++] = *t;
}

typedef struct span {
    uint64_t off, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static const char *part_kv_key(const void *owner, size_t i) {
    return ((const gguf_part *)owner)->kvs[i].key;
}

/* Reads one tensor info (starting at toff) and appends it to c->tensors; the offset stays
 * relative to the data section until the data ranges are checked. */
static int read_tinfo(gguf_ctx *c, gguf_part *p, int pi, rd *r, uint64_t toff) {
    char nb[160];
    gguf_tensor t;
    memset(&t, 0, sizeof t);
    if (rd_name(r, &t.name, "tensor name")) return MLA_ERR;
    const char *tn = shown(t.name, strlen(t.name), nb, sizeof nb);
    uint64_t x;
    if (rd_u32(r, &t.n_dims, "tensor n_dims")) return MLA_ERR;
    if (t.n_dims < 1 || t.n_dims > GGUF_MAX_DIMS)
        return fail_at(r, toff, "tensor '%s': n_dims %u is outside 1..%d", tn, t.n_dims, GGUF_MAX_DIMS);
    int64_t ne_all = 1;
    int overflow = 0;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = 1;
    for (uint32_t d = 0; d < t.n_dims; d++) {
        if (rd_uint(r, 8, &x, "tensor dimension")) return MLA_ERR;
        t.ne[d] = (int64_t)x;
        if (t.ne[d] < 0)
            return fail_at(r, toff, "tensor '%s': dimension %u is negative (%lld)", tn, d, (long long)t.ne[d]);
    }
    for (uint32_t d = 0; d < t.n_dims; d++)
        if (__builtin_mul_overflow(ne_all, t.ne[d], &ne_all)) overflow = 1;
    if (overflow) {
        /* an empty dimension makes the product 0 whatever the others are */
        int zero = 0;
        for (uint32_t d = 0; d < t.n_dims; d++) zero |= t.ne[d] == 0;
        if (!zero)
            return fail_at(r, toff, "tensor '%s': element count overflows (ne %lld x %lld x %lld x %lld)", tn,
                           (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2], (long long)t.ne[3]);
        ne_all = 0;
    }
    if (rd_u32(r, &t.type, "tensor type")) return MLA_ERR;
    const ggml_type_info *ti = ggml_type_get(t.type);
    if (!ti) return fail_at(r, toff, "tensor '%s': unknown tensor type %u", tn, t.type);
    if (t.ne[0] % ti->block_elems)
        return fail_at(r, toff, "tensor '%s': ne0 %lld is not a multiple of the %s block size %u", tn,
                       (long long)t.ne[0], ti->name, ti->block_elems);
    uint64_t off;
    if (rd_uint(r, 8, &off, "tensor data offset")) return MLA_ERR;
    if (off % p->alignment)
        return fail_at(r, toff, "tensor '%s': data offset %llu is misaligned (not a multiple of the alignment %u)",
                       tn, (unsigned long long)off, p->alignment);
    t.n_elems = ne_all;
    uint64_t nb64;
    if (__builtin_mul_overflow((uint64_t)ne_all / ti->block_elems, (uint64_t)ti->block_bytes, &nb64) ||
        nb64 > SIZE_MAX)
        return fail_at(r, toff, "tensor '%s': byte size overflows", tn);
    t.nbytes = (size_t)nb64;
    t.part = pi;
    t.file_offset = off; /* relative for now */
    size_t dup = strtab_find(&c->t_tab, t.name, tensor_key, c, (size_t)-1);
    if (dup != (size_t)-1) {
        const gguf_tensor *o = &c->tensors[dup];
        if (o->part == pi) return fail_at(r, toff, "duplicate tensor '%s'", tn);
        return fail_at(r, toff, "duplicate tensor '%s' (also in part %d: %s)", tn, o->part + 1,
                       c->parts[o->part].path);
    }
    push_tensor(c, &t);
    strtab_find(&c->t_tab, t.name, tensor_key, c, c->n_tensors - 1);
    return MLA_OK;
}

static int parse_part(gguf_ctx *c, int pi, mla_err *err) {
    gguf_part *p = &c->parts[pi];
    rd r = {.p = p->base, .size = p->size, .pos = 0, .file = p->path, .err = err, .arena = &c->arena};
    char nb[160];

    /* header */
    if (p->size < 4)
        return fail_at(&r, 0, "truncated header: file has %llu bytes, a GGUF header needs %u",
                       (unsigned long long)p->size, GGUF_HEADER_BYTES);
    if (memcmp(p->base, "GGUF", 4) != 0)
        return fail_at(&r, 0, "bad magic '%s', expected 'GGUF' (not a GGUF file)",
                       shown((const char *)p->base, 4, nb, sizeof nb));
    if (p->size < GGUF_HEADER_BYTES)
        return fail_at(&r, p->size, "truncated header: file has %llu bytes, a GGUF header needs %u",
                       (unsigned long long)p->size, GGUF_HEADER_BYTES);
    r.pos = 4;
    uint32_t ver;
    rd_u32(&r, &ver, "version");
    if (ver == 1)
        return fail_at(&r, 4, "GGUF version 1 is not supported (32-bit counts); convert the model again");
    if (ver != 2 && ver != 3) {
        if ((ver & 0xffffu) == 0 && (ver >> 24) >= 1 && (ver >> 24) <= 3)
            return fail_at(&r, 4, "big-endian GGUF file (version field 0x%08x) is not supported", ver);
        return fail_at(&r, 4, "unsupported GGUF version %u (supported: 2, 3)", ver);
    }
    p->version = ver;
    uint64_t n_t, n_kv;
    rd_uint(&r, 8, &n_t, "tensor count");
    rd_uint(&r, 8, &n_kv, "kv count");
    uint64_t left = rd_left(&r);
    if (n_t > left / MIN_TINFO_BYTES)
        return fail_at(&r, 8, "tensor count %llu exceeds what the file can hold (%llu bytes left)",
                       (unsigned long long)n_t, (unsigned long long)left);
    if (n_t > MAX_TENSORS)
        return fail_at(&r, 8, "tensor count %llu exceeds the limit of %u tensors per file",
                       (unsigned long long)n_t, MAX_TENSORS);
    if (n_kv > (left - n_t * MIN_TINFO_BYTES) / MIN_KV_BYTES)
        return fail_at(&r, 16, "kv count %llu exceeds what the file can hold (%llu bytes left)",
                       (unsigned long long)n_kv, (unsigned long long)left);
    if (n_kv > MAX_META_VALUES)
        return fail_at(&r, 16, "kv count %llu exceeds the limit of %u", (unsigned long long)n_kv, MAX_META_VALUES);
    r.n_values = n_kv;
    p->n_tensors = n_t;

    /* metadata */
    p->kvs = arena_alloc(&c->arena, (size_t)(n_kv ? n_kv : 1) * sizeof *p->kvs);
    strtab local;
    strtab_init(&local, (size_t)n_kv);
    int rc = MLA_OK;
    for (uint64_t i = 0; i < n_kv && rc == MLA_OK; i++) {
        gguf_kv *kv = &p->kvs[i];
        kv->file_offset = r.pos;
        uint32_t t;
        if (rd_name(&r, &kv->key, "key") || rd_vtype(&r, &t, "value type") ||
            parse_value(&r, t, &kv->val, 0)) {
            rc = MLA_ERR;
            break;
        }
        p->n_kv = i + 1;
        size_t prev = strtab_find(&local, kv->key, part_kv_key, p, (size_t)i);
        if (prev != (size_t)-1)
            rc = fail_at(&r, kv->file_offset, "duplicate key '%s' (first at offset %llu)",
                         shown(kv->key, strlen(kv->key), nb, sizeof nb),
                         (unsigned long long)p->kvs[prev].file_offset);
    }
    free(local.slots);
    if (rc) return rc;

    /* alignment */
    p->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = part_find_kv(p, "general.alignment");
    if (al) {
        if (al->val.type != GGUF_VT_UINT32)
            return fail_at(&r, al->file_offset, "general.alignment has type %s, expected uint32",
                           gguf_vtype_name(al->val.type));
        uint64_t a = al->val.v.u;
        if (a == 0 || (a & (a - 1)))
            return fail_at(&r, al->file_offset, "general.alignment %llu is not a nonzero power of two",
                           (unsigned long long)a);
        p->alignment = (uint32_t)a;
    }

    /* tensor infos: the name table (all parts) keeps at most half its slots full */
    size_t first = c->n_tensors;
    if (2 * (first + (size_t)n_t) + 1 > c->t_tab.cap) {
        free(c->t_tab.slots);
        strtab_init(&c->t_tab, first + (size_t)n_t);
        for (size_t k = 0; k < first; k++) strtab_find(&c->t_tab, c->tensors[k].name, tensor_key, c, k);
    }
    uint64_t *info_off = mla_xmalloc((size_t)(n_t ? n_t : 1) * sizeof *info_off);
    for (uint64_t i = 0; i < n_t; i++) {
        info_off[i] = r.pos; /* for data-range messages */
        if (read_tinfo(c, p, pi, &r, info_off[i])) {
            free(info_off);
            return MLA_ERR;
        }
    }
    p->meta_end = r.pos;
    uint64_t pad = (p->alignment - p->meta_end % p->alignment) % p->alignment;
    p->data_start = p->meta_end + pad;

    /* data ranges */
    span *sp = n_t ? mla_xmalloc((size_t)n_t * sizeof *sp) : NULL;
    size_t ns = 0;
    for (size_t i = first; i < c->n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        uint64_t toff = info_off[i - first];
        const char *tn = shown(t->name, strlen(t->name), nb, sizeof nb);
        uint64_t rel = t->file_offset;
        uint64_t avail = p->data_start <= p->size ? p->size - p->data_start : 0;
        if (p->data_start > p->size || rel > avail || t->nbytes > avail - rel) {
            rc = fail_at(&r, toff, "tensor '%s': data [%llu, +%zu) at offset %llu of the data section lies past the end of the file (data section has %llu bytes)",
                         tn, (unsigned long long)(p->data_start + rel), t->nbytes, (unsigned long long)rel,
                         (unsigned long long)avail);
            break;
        }
        t->file_offset = p->data_start + rel;
        t->data = p->base + t->file_offset;
        if (t->nbytes) sp[ns++] = (span){t->file_offset, t->file_offset + t->nbytes, i};
    }
    if (!rc && ns > 1) {
        qsort(sp, ns, sizeof *sp, span_cmp);
        for (size_t i = 1; i < ns; i++) {
            if (sp[i].off < sp[i - 1].end) {
                char nb2[160];
                const gguf_tensor *a = &c->tensors[sp[i - 1].idx], *b = &c->tensors[sp[i].idx];
                rc = fail_at(&r, b->file_offset, "tensor '%s' data overlaps tensor '%s'",
                             shown(b->name, strlen(b->name), nb, sizeof nb),
                             shown(a->name, strlen(a->name), nb2, sizeof nb2));
                break;
            }
        }
    }
    free(sp);
    free(info_off);
    return rc;
}

/* ---------------------------------------------------------------- context assembly */

static int split_key(const gguf_part *p, const char *key, uint64_t max, uint64_t *v, int *found,
                     mla_err *err) {
    const gguf_kv *kv = part_find_kv(p, key);
    *found = kv != NULL;
    if (!kv) return MLA_OK;
    if (kv->val.type == GGUF_VT_STRING || kv->val.type == GGUF_VT_ARRAY || kv->val.type == GGUF_VT_BOOL ||
        kv->val.type == GGUF_VT_FLOAT32 || kv->val.type == GGUF_VT_FLOAT64)
        return mla_errf(err, "%s: offset %llu: %s has type %s, expected an integer", p->path,
                        (unsigned long long)kv->file_offset, key, gguf_vtype_name(kv->val.type));
    if (!value_u64(&kv->val, max, v))
        return mla_errf(err, "%s: offset %llu: %s value is out of range", p->path,
                        (unsigned long long)kv->file_offset, key);
    return MLA_OK;
}

static int check_split(gguf_ctx *c, bool split_named, mla_err *err) {
    uint64_t v;
    int found;
    for (int i = 0; i < c->n_parts; i++) {
        gguf_part *p = &c->parts[i];
        if (split_key(p, "split.count", UINT16_MAX, &v, &found, err)) return MLA_ERR;
        if (found && v != (uint64_t)c->n_parts) {
            const gguf_kv *kv = part_find_kv(p, "split.count");
            if (!split_named)
                return mla_errf(err, "%s: offset %llu: split.count is %llu but the file name does not follow the split naming scheme NAME-00001-of-%05llu.gguf",
                                p->path, (unsigned long long)kv->file_offset, (unsigned long long)v,
                                (unsigned long long)v);
            return mla_errf(err, "%s: offset %llu: split.count mismatch: split.count is %llu but the file name says %d parts",
                            p->path, (unsigned long long)kv->file_offset, (unsigned long long)v, c->n_parts);
        }
        if (split_key(p, "split.no", UINT16_MAX, &v, &found, err)) return MLA_ERR;
        if (found && v != (uint64_t)i) {
            const gguf_kv *kv = part_find_kv(p, "split.no");
            return mla_errf(err, "%s: offset %llu: split.no mismatch: split.no is %llu but this is part %d (split.no %d)",
                            p->path, (unsigned long long)kv->file_offset, (unsigned long long)v, i + 1, i);
        }
        if (split_key(p, "split.tensors.count", INT32_MAX, &v, &found, err)) return MLA_ERR;
        if (found && v != (uint64_t)c->n_tensors) {
            const gguf_kv *kv = part_find_kv(p, "split.tensors.count");
            return mla_errf(err, "%s: offset %llu: split.tensors.count mismatch: it says %llu tensors but the %d part(s) hold %zu",
                            p->path, (unsigned long long)kv->file_offset, (unsigned long long)v, c->n_parts,
                            c->n_tensors);
        }
    }
    return MLA_OK;
}

static void finish(gguf_ctx *c) {
    size_t total = 0;
    for (int i = 0; i < c->n_parts; i++) total += (size_t)c->parts[i].n_kv;
    c->kvs = mla_xmalloc((total ? total : 1) * sizeof *c->kvs);
    strtab_init(&c->kv_tab, total);
    for (int i = 0; i < c->n_parts; i++) {
        gguf_part *p = &c->parts[i];
        for (uint64_t k = 0; k < p->n_kv; k++) {
            size_t at = strtab_find(&c->kv_tab, p->kvs[k].key, kv_key, c, c->n_kv);
            if (at == (size_t)-1) c->kvs[c->n_kv++] = &p->kvs[k];
        }
    }
    uint64_t h = MLA_FNV_BASIS;
    for (int i = 0; i < c->n_parts; i++) h = mla_fnv1a(c->parts[i].base, (size_t)c->parts[i].meta_end, h);
    c->hash = h;
}

static gguf_ctx *ctx_new(int n_parts) {
    gguf_ctx *c = mla_xcalloc(1, sizeof *c);
    c->n_parts = n_parts;
    c->parts = mla_xcalloc((size_t)n_parts, sizeof *c->parts);
    return c;
}

void gguf_close(gguf_ctx *c) {
    if (!c) return;
    for (int i = 0; i < c->n_parts; i++) {
        gguf_part *p = &c->parts[i];
        if (p->mapped && p->base) munmap((void *)p->base, (size_t)p->size);
        free(p->path);
    }
    free(c->parts);
    free(c->kvs);
    free(c->kv_tab.slots);
    free(c->tensors);
    free(c->t_tab.slots);
    arena_free(c->arena);
    free(c);
}

int gguf_open_memory(gguf_ctx **out, const void *buf, size_t len, const char *name, mla_err *err) {
    *out = NULL;
    gguf_ctx *c = ctx_new(1);
    c->parts[0].path = mla_xstrdup(name ? name : "<memory>");
    c->parts[0].base = buf;
    c->parts[0].size = buf ? len : 0;
    strtab_init(&c->t_tab, 0);
    if (parse_part(c, 0, err)) {
        gguf_close(c);
        return MLA_ERR;
    }
    finish(c);
    *out = c;
    return MLA_OK;
}

static int map_part(gguf_part *p, int idx, int n, mla_err *err) {
    int fd = open(p->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (n > 1)
            return mla_errf(err, "%s: offset 0: cannot open split part %d of %d (missing split part?): %s",
                            p->path, idx + 1, n, strerror(errno));
        return mla_errf(err, "%s: offset 0: cannot open: %s", p->path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mla_errf(err, "%s: offset 0: cannot stat: %s", p->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mla_errf(err, "%s: offset 0: not a regular file", p->path);
    }
    p->size = (uint64_t)st.st_size;
    if (p->size == 0 || p->size > SIZE_MAX) {
        close(fd);
        if (p->size == 0) return MLA_OK; /* parse_part reports the truncated header */
        return mla_errf(err, "%s: offset 0: file too large to map", p->path);
    }
    void *m = mmap(NULL, (size_t)p->size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return mla_errf(err, "%s: offset 0: mmap failed: %s", p->path, strerror(e));
    p->base = m;
    p->mapped = 1;
    /* Parsing reads the header and metadata sequentially from the start; the data section is
     * left at the default advice (readahead helps a worker that then streams its shard) and is
     * never touched here. */
    return MLA_OK;
}

/* Recognises ".../NAME-%05d-of-%05d.gguf": sets *n_of and the prefix length; 0 otherwise. */
static int split_name(const char *path, size_t *prefix_len, int *n_of) {
    size_t L = strlen(path);
    static const char tail[] = "-00000-of-00000.gguf";
    size_t T = sizeof tail - 1;
    if (L <= T) return 0;
    const char *s = path + L - T;
    for (size_t i = 0; i < T; i++) {
        if (tail[i] == '0') {
            if (s[i] < '0' || s[i] > '9') return 0;
        } else if (s[i] != tail[i]) {
            return 0;
        }
    }
    int no = atoi(s + 1), of = atoi(s + 10);
    if (of < 1 || no < 1 || no > of) return 0;
    if (s[-1] == '/') return 0;
    *prefix_len = L - T;
    *n_of = of;
    return 1;
}

int gguf_open(gguf_ctx **out, const char *path, mla_err *err) {
    *out = NULL;
    size_t plen = 0;
    int n = 1;
    bool split_named = split_name(path, &plen, &n);
    gguf_ctx *c = ctx_new(n);
    for (int i = 0; i < n; i++) {
        if (split_named) {
            size_t cap = plen + 32;
            c->parts[i].path = mla_xmalloc(cap);
            snprintf(c->parts[i].path, cap, "%.*s-%05d-of-%05d.gguf", (int)plen, path, i + 1, n);
        } else {
            c->parts[i].path = mla_xstrdup(path);
        }
    }
    strtab_init(&c->t_tab, 0);
    for (int i = 0; i < n; i++) {
        if (map_part(&c->parts[i], i, n, err) || parse_part(c, i, err)) {
            gguf_close(c);
            return MLA_ERR;
        }
    }
    if (check_split(c, split_named, err)) {
        gguf_close(c);
        return MLA_ERR;
    }
    finish(c);
    *out = c;
    return MLA_OK;
}

/* ---------------------------------------------------------------- accessors */

uint32_t gguf_version(const gguf_ctx *c) { return c->parts[0].version; }
int gguf_n_parts(const gguf_ctx *c) { return c->n_parts; }
const char *gguf_part_path(const gguf_ctx *c, int part) {
    MLA_ASSERT(part >= 0 && part < c->n_parts);
    return c->parts[part].path;
}
uint64_t gguf_part_size(const gguf_ctx *c, int part) {
    MLA_ASSERT(part >= 0 && part < c->n_parts);
    return c->parts[part].size;
}
uint64_t gguf_part_data_offset(const gguf_ctx *c, int part) {
    MLA_ASSERT(part >= 0 && part < c->n_parts);
    return c->parts[part].data_start;
}
uint32_t gguf_alignment(const gguf_ctx *c) { return c->parts[0].alignment; }
size_t gguf_n_kv(const gguf_ctx *c) { return c->n_kv; }
const gguf_kv *gguf_kv_at(const gguf_ctx *c, size_t i) {
    MLA_ASSERT(i < c->n_kv);
    return c->kvs[i];
}
const gguf_kv *gguf_find_kv(const gguf_ctx *c, const char *key) {
    size_t i = strtab_find((strtab *)&c->kv_tab, key, kv_key, c, (size_t)-1);
    return i == (size_t)-1 ? NULL : c->kvs[i];
}
size_t gguf_n_tensors(const gguf_ctx *c) { return c->n_tensors; }
const gguf_tensor *gguf_tensor_at(const gguf_ctx *c, size_t i) {
    MLA_ASSERT(i < c->n_tensors);
    return &c->tensors[i];
}
const gguf_tensor *gguf_find_tensor(const gguf_ctx *c, const char *name) {
    size_t i = strtab_find((strtab *)&c->t_tab, name, tensor_key, c, (size_t)-1);
    return i == (size_t)-1 ? NULL : &c->tensors[i];
}
uint64_t gguf_index_hash(const gguf_ctx *c) { return c->hash; }

static int get_num(const gguf_ctx *c, const char *key, const char *want, const gguf_kv **kvo, mla_err *err) {
    const gguf_kv *kv = gguf_find_kv(c, key);
    *kvo = kv;
    if (!kv) return 0;
    if (kv->val.type == GGUF_VT_STRING || kv->val.type == GGUF_VT_ARRAY)
        return mla_errf(err, "metadata key %s has type %s, expected %s", key, gguf_vtype_name(kv->val.type), want);
    return 1;
}

static int not_fit(const gguf_kv *kv, const char *want, mla_err *err) {
    char val[64];
    switch (kv->val.type) {
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        snprintf(val, sizeof val, "%lld", (long long)kv->val.v.i);
        break;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: snprintf(val, sizeof val, "%.17g", kv->val.v.f); break;
    case GGUF_VT_BOOL: snprintf(val, sizeof val, "%s", kv->val.v.b ? "true" : "false"); break;
    default: snprintf(val, sizeof val, "%llu", (unsigned long long)kv->val.v.u); break;
    }
    return mla_errf(err, "metadata key %s (%s) has value %s, which does not fit %s", kv->key,
                    gguf_vtype_name(kv->val.type), val, want);
}

int gguf_get_u64(const gguf_ctx *c, const char *key, uint64_t *out, mla_err *err) {
    const gguf_kv *kv;
    int rc = get_num(c, key, "uint64", &kv, err);
    if (rc != 1) return rc;
    uint64_t v;
    if (!value_u64(&kv->val, UINT64_MAX, &v)) return not_fit(kv, "uint64", err);
    *out = v;
    return 1;
}

int gguf_get_u32(const gguf_ctx *c, const char *key, uint32_t *out, mla_err *err) {
    const gguf_kv *kv;
    int rc = get_num(c, key, "uint32", &kv, err);
    if (rc != 1) return rc;
    uint64_t v;
    if (!value_u64(&kv->val, UINT32_MAX, &v)) return not_fit(kv, "uint32", err);
    *out = (uint32_t)v;
    return 1;
}

int gguf_get_i64(const gguf_ctx *c, const char *key, int64_t *out, mla_err *err) {
    const gguf_kv *kv;
    int rc = get_num(c, key, "int64", &kv, err);
    if (rc != 1) return rc;
    int64_t si;
    uint64_t ui;
    int sg;
    if (!value_int(&kv->val, &si, &ui, &sg)) return not_fit(kv, "int64", err);
    if (!sg) {
        if (ui > (uint64_t)INT64_MAX) return not_fit(kv, "int64", err);
        si = (int64_t)ui;
    }
    *out = si;
    return 1;
}

int gguf_get_f32(const gguf_ctx *c, const char *key, float *out, mla_err *err) {
    const gguf_kv *kv;
    int rc = get_num(c, key, "float32", &kv, err);
    if (rc != 1) return rc;
    switch (kv->val.type) {
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: {
        double d = kv->val.v.f;
        if (isfinite(d) && fabs(d) > (double)3.4028234663852886e38) return not_fit(kv, "float32", err);
        *out = (float)d;
        return 1;
    }
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        *out = (float)kv->val.v.i;
        return 1;
    case GGUF_VT_BOOL: *out = kv->val.v.b ? 1.0f : 0.0f; return 1;
    default: *out = (float)kv->val.v.u; return 1;
    }
}

int gguf_get_bool(const gguf_ctx *c, const char *key, bool *out, mla_err *err) {
    const gguf_kv *kv;
    int rc = get_num(c, key, "bool", &kv, err);
    if (rc != 1) return rc;
    uint64_t v;
    if (!value_u64(&kv->val, 1, &v)) return not_fit(kv, "bool", err);
    *out = v != 0;
    return 1;
}

int gguf_get_str(const gguf_ctx *c, const char *key, gguf_str *out, mla_err *err) {
    const gguf_kv *kv = gguf_find_kv(c, key);
    if (!kv) return 0;
    if (kv->val.type != GGUF_VT_STRING)
        return mla_errf(err, "metadata key %s has type %s, expected string", key, gguf_vtype_name(kv->val.type));
    *out = kv->val.v.s;
    return 1;
}

int gguf_get_arr(const gguf_ctx *c, const char *key, enum gguf_vtype elem, const gguf_value **out,
                 mla_err *err) {
    const gguf_kv *kv = gguf_find_kv(c, key);
    if (!kv) return 0;
    if (kv->val.type != GGUF_VT_ARRAY)
        return mla_errf(err, "metadata key %s has type %s, expected array of %s", key,
                        gguf_vtype_name(kv->val.type), gguf_vtype_name(elem));
    if (kv->val.v.arr.elem != elem)
        return mla_errf(err, "metadata key %s is an array of %s, expected array of %s", key,
                        gguf_vtype_name(kv->val.v.arr.elem), gguf_vtype_name(elem));
    *out = &kv->val;
    return 1;
}

/* ---------------------------------------------------------------- paging hints */

static void advise(const gguf_ctx *c, const void *ptr, size_t len, int adv) {
    if (!c || !ptr || !len) return;
    uintptr_t a = (uintptr_t)ptr;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    for (int i = 0; i < c->n_parts; i++) {
        const gguf_part *p = &c->parts[i];
        if (!p->mapped) continue;
        uintptr_t lo = (uintptr_t)p->base, hi = lo + (uintptr_t)p->size;
        if (a < lo || a >= hi) continue;
        uintptr_t end = (len > hi - a) ? hi : a + len;
        uintptr_t s = a & ~(page - 1);
        uintptr_t e = (end + page - 1) & ~(page - 1);
        (void)madvise((void *)s, e - s, adv);
        return;
    }
}

void gguf_prefetch(const gguf_ctx *c, const void *ptr, size_t len) { advise(c, ptr, len, MADV_WILLNEED); }
void gguf_evict(const gguf_ctx *c, const void *ptr, size_t len) { advise(c, ptr, len, MADV_DONTNEED); }
