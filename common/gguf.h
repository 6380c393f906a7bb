/* gguf: a validating, mmap-based reader of GGUF v2/v3 files, including split files
 * (name-00001-of-0000N.gguf: every part is opened and the tensors form one index).
 *
 * Ownership: gguf_open() returns a gguf_ctx that owns the mappings and every structure
 * reachable from it; strings and tensor data point into the mapped files and stay valid until
 * gguf_close(). Nothing returned by the accessors is to be freed by the caller.
 *
 * Errors: every problem with a file comes back as MLA_ERR with one line in err->msg naming
 * the file, the byte offset and the problem, e.g.
 *   "model.gguf: offset 24: tensor count 18446744073709551615 exceeds what the file can hold".
 */
#ifndef GGUF_H
#define GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml_types.h"
#include "mla_err.h"

enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
};

typedef struct gguf_str {
    const char *ptr; /* into the mapping; NOT NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u;  /* UINT8/16/32/64 */
        int64_t i;   /* INT8/16/32/64 */
        double f;    /* FLOAT32/64 */
        bool b;      /* BOOL */
        gguf_str s;  /* STRING */
        struct {
            enum gguf_vtype elem;
            uint64_t n;
            gguf_value *items; /* n values (nested arrays allowed) */
        } arr;
    } v;
};

typedef struct gguf_kv {
    const char *key; /* NUL-terminated copy */
    gguf_value val;
    uint64_t file_offset; /* where the key-value pair starts, for messages */
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
    const char *name;        /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is contiguous; unused dims are 1 */
    uint32_t type;           /* enum ggml_type */
    int64_t n_elems;
    size_t nbytes;
    const uint8_t *data;     /* into the mapping of its part */
    int part;                /* which split part holds it (0-based) */
    uint64_t file_offset;    /* absolute byte offset of the data inside its part */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* Opens path (and its sibling parts if path is a split name). */
int gguf_open(gguf_ctx **out, const char *path, mla_err *err);
/* Parses a file held in memory (no mmap, no split parts; used by the fuzzer and tests). The
 * buffer must outlive the ctx. name is used in messages. */
int gguf_open_memory(gguf_ctx **out, const void *buf, size_t len, const char *name, mla_err *err);
void gguf_close(gguf_ctx *ctx);

uint32_t gguf_version(const gguf_ctx *ctx);
int gguf_n_parts(const gguf_ctx *ctx);
const char *gguf_part_path(const gguf_ctx *ctx, int part);
uint64_t gguf_part_size(const gguf_ctx *ctx, int part);
uint32_t gguf_alignment(const gguf_ctx *ctx);

/* Metadata. Key-values of every part are visible; the first part's win on duplicates across
 * parts (split files repeat general.* keys). */
size_t gguf_n_kv(const gguf_ctx *ctx);
const gguf_kv *gguf_kv_at(const gguf_ctx *ctx, size_t i);
const gguf_kv *gguf_find_kv(const gguf_ctx *ctx, const char *key);

/* Typed getters with numeric coercion between integer/float/bool types where the value fits.
 * Return 1 and set *out when the key exists and converts; 0 when the key is absent;
 * MLA_ERR (with a message naming the key and its real type) when it exists with a type that
 * does not convert. */
int gguf_get_u32(const gguf_ctx *ctx, const char *key, uint32_t *out, mla_err *err);
int gguf_get_u64(const gguf_ctx *ctx, const char *key, uint64_t *out, mla_err *err);
int gguf_get_i64(const gguf_ctx *ctx, const char *key, int64_t *out, mla_err *err);
int gguf_get_f32(const gguf_ctx *ctx, const char *key, float *out, mla_err *err);
int gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out, mla_err *err);
int gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out, mla_err *err);
/* An array of the given element type (STRING, INT32, FLOAT32, ...); *out points at the value. */
int gguf_get_arr(const gguf_ctx *ctx, const char *key, enum gguf_vtype elem,
                 const gguf_value **out, mla_err *err);

/* Tensors, in file order across parts. */
size_t gguf_n_tensors(const gguf_ctx *ctx);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, size_t i);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name);

/* Hash (FNV-1a 64) over the header, metadata and tensor index of every part, not the data:
 * identifies the model for worker registration. */
uint64_t gguf_index_hash(const gguf_ctx *ctx);

const char *gguf_vtype_name(enum gguf_vtype t);

/* --- additions (additive; the validation rules are listed at the top of common/gguf.c) ---
 * Notable choices: a dimension ne may be 0 (an empty tensor, as ggml accepts; nbytes 0) but not
 * negative; n_dims is 1..4; tensor data must be aligned, inside its part and not overlap other
 * tensors; duplicate keys within a part and duplicate tensor names anywhere are refused; keys
 * of later parts that repeat a key of an earlier part are hidden (first part wins). */

/* Arrays may nest (array of arrays ...) at most this deep; deeper files are refused. */
#define GGUF_MAX_ARRAY_DEPTH 8

/* Byte offset inside part `part` where its tensor data section starts (after the tensor infos,
 * padded to that part's alignment). */
uint64_t gguf_part_data_offset(const gguf_ctx *ctx, int part);

/* Paging hints for a byte range inside a mapping (e.g. one rank's rows of a tensor): opening a
 * file touches only its header, metadata and tensor infos, never tensor data; a worker asks the
 * kernel to read ahead exactly its shard with gguf_prefetch (MADV_WILLNEED) and may drop the
 * pages from its address space once copied (gguf_evict, MADV_DONTNEED; the page cache keeps
 * them). The range is widened to whole pages and clamped to the mapping that holds it; ranges
 * outside every mapping and contexts from gguf_open_memory are ignored. Advisory only. */
void gguf_prefetch(const gguf_ctx *ctx, const void *ptr, size_t len);
void gguf_evict(const gguf_ctx *ctx, const void *ptr, size_t len);

#endif
