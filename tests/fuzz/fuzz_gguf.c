/* libFuzzer target for the GGUF reader: parses the input with gguf_open_memory and, when it
 * opens, walks everything a caller could touch (every kv and nested value, every getter, every
 * tensor's first and last data byte) so that ASan catches any pointer the reader got wrong.
 * Built with -DMLA_FUZZ=ON (clang); tests/fuzz/replay_main.c replays a corpus without
 * libFuzzer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/gguf.h"

static volatile uint64_t g_sink;

static void walk(const gguf_value *v, int depth) {
    if (depth > GGUF_MAX_ARRAY_DEPTH + 1) __builtin_trap(); /* the reader must bound nesting */
    switch (v->type) {
    case GGUF_VT_STRING:
        if (v->v.s.len) g_sink += (unsigned char)v->v.s.ptr[0] + (unsigned char)v->v.s.ptr[v->v.s.len - 1];
        break;
    case GGUF_VT_ARRAY:
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            if (v->v.arr.items[i].type != v->v.arr.elem) __builtin_trap();
            walk(&v->v.arr.items[i], depth + 1);
        }
        break;
    default:
        g_sink += v->v.u;
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_ctx *ctx = NULL;
    mla_err err;
    err.msg[0] = '\0';
    if (gguf_open_memory(&ctx, data, size, "fuzz.gguf", &err) != MLA_OK) {
        /* every failure carries a one-line message */
        if (err.msg[0] == '\0' || strchr(err.msg, '\n')) __builtin_trap();
        return 0;
    }
    for (size_t i = 0; i < gguf_n_kv(ctx); i++) {
        const gguf_kv *kv = gguf_kv_at(ctx, i);
        if (gguf_find_kv(ctx, kv->key) != kv) __builtin_trap();
        walk(&kv->val, 0);
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        bool b;
        gguf_str s;
        const gguf_value *a;
        mla_err e2;
        g_sink += (uint64_t)gguf_get_u32(ctx, kv->key, &u32, &e2) + (uint64_t)gguf_get_u64(ctx, kv->key, &u64, &e2) +
                  (uint64_t)gguf_get_i64(ctx, kv->key, &i64, &e2) + (uint64_t)gguf_get_f32(ctx, kv->key, &f, &e2) +
                  (uint64_t)gguf_get_bool(ctx, kv->key, &b, &e2) + (uint64_t)gguf_get_str(ctx, kv->key, &s, &e2) +
                  (uint64_t)gguf_get_arr(ctx, kv->key, GGUF_VT_STRING, &a, &e2);
    }
    for (size_t i = 0; i < gguf_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_tensor_at(ctx, i);
        if (gguf_find_tensor(ctx, t->name) != t) __builtin_trap();
        if (t->file_offset + t->nbytes > size) __builtin_trap();
        if (t->nbytes) g_sink += t->data[0] + t->data[t->nbytes - 1];
    }
    g_sink += gguf_index_hash(ctx) + gguf_alignment(ctx) + gguf_version(ctx);
    gguf_close(ctx);
    return 0;
}
