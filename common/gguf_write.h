/* gguf_write: a streaming writer of GGUF v3 files (one file; split models are written as
 * several writers by the caller, each part carrying the split.* keys).
 *
 * Use:  gguf_write_open → gguf_write_kv_* (any order) → gguf_write_add_tensor (in file order)
 *       → gguf_write_begin_data (writes header, metadata and tensor infos)
 *       → gguf_write_data (the bytes of the tensors, in the order they were added, in pieces of
 *         any size; padding between tensors is inserted by the writer)
 *       → gguf_write_close (checks every tensor got exactly its bytes; closes the file).
 * Metadata and tensor infos are buffered in memory (they are small); tensor data is streamed
 * through a fixed-size buffer, never held whole.
 *
 * The file is written whole or not at all (outfile.h): into a temporary file beside it, renamed
 * over it by a gguf_write_close that succeeds, removed by one that fails, by gguf_write_abort or by
 * a signal; a path that is not a regular file (a device, a pipe) is written in place.
 *
 * Ownership: gguf_write_open returns a writer owned by the caller and released by
 * gguf_write_close (always, even on error) or gguf_write_abort (closes it, nothing kept).
 * Keys, names and strings are copied. Errors (I/O, misuse by input) return MLA_ERR with a
 * message naming the file; calling the steps out of order is a bug and aborts. */
#ifndef GGUF_WRITE_H
#define GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mla_err.h"

typedef struct gguf_writer gguf_writer;

int gguf_write_open(gguf_writer **out, const char *path, mla_err *err);

void gguf_write_kv_u16(gguf_writer *w, const char *key, uint16_t v);
void gguf_write_kv_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_write_kv_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_write_kv_f32(gguf_writer *w, const char *key, float v);
void gguf_write_kv_bool(gguf_writer *w, const char *key, bool v);
void gguf_write_kv_str(gguf_writer *w, const char *key, const char *v);
/* Arrays: n strings (NUL-terminated) / n int32 / n bools. */
void gguf_write_kv_arr_str(gguf_writer *w, const char *key, const char *const *v, size_t n);
void gguf_write_kv_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n);
void gguf_write_kv_arr_bool(gguf_writer *w, const char *key, const bool *v, size_t n);

/* Declares the next tensor (ne[0] contiguous, n_dims 1..4, type an enum ggml_type). Returns
 * MLA_ERR when the shape is not a whole number of blocks of the type. */
int gguf_write_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                          uint32_t type, mla_err *err);
/* Bytes the tensor data section will take (tensors and padding), known after the adds. */
uint64_t gguf_write_data_size(const gguf_writer *w);

int gguf_write_begin_data(gguf_writer *w, mla_err *err);
int gguf_write_data(gguf_writer *w, const void *p, size_t n, mla_err *err);
int gguf_write_close(gguf_writer *w, mla_err *err);
void gguf_write_abort(gguf_writer *w);

#endif
