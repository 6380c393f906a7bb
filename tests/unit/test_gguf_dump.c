/* Canonical dump of a GGUF file through our reader, in the format of tests/gguf/gguf_dump.py
 * (gguf-py); tests/gguf/compare_dump.py compares the two.
 * Usage: test_gguf_dump [--memory] FILE
 *   default: gguf_open (mmap); --memory: the file is read into a buffer and parsed with
 *   gguf_open_memory (single part, no split handling). Exit 1 with the reader's message on
 *   failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_buf(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static void qstr(const char *s, uint64_t n) {
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    putchar('"');
}

static void value(const gguf_value *v) {
    switch (v->type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        printf("%llu", (unsigned long long)v->v.u);
        break;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        printf("%lld", (long long)v->v.i);
        break;
    case GGUF_VT_FLOAT32: printf("%.9g", (double)(float)v->v.f); break;
    case GGUF_VT_FLOAT64: printf("%.17g", v->v.f); break;
    case GGUF_VT_BOOL: printf("%s", v->v.b ? "true" : "false"); break;
    case GGUF_VT_STRING: qstr(v->v.s.ptr, v->v.s.len); break;
    case GGUF_VT_ARRAY:
        printf("[%s: ", gguf_vtype_name(v->v.arr.elem));
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            if (i) putchar(',');
            value(&v->v.arr.items[i]);
        }
        putchar(']');
        break;
    }
}

int main(int argc, char **argv) {
    int memory = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--memory") == 0)
            memory = 1;
        else
            path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: %s [--memory] FILE\n", argv[0]);
        return 2;
    }
    crc_init();
    gguf_ctx *ctx = NULL;
    mla_err err = {{0}};
    uint8_t *buf = NULL;
    if (memory) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            perror(path);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc(n > 0 ? (size_t)n : 1);
        if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
            fprintf(stderr, "%s: read failed\n", path);
            return 1;
        }
        fclose(f);
        if (gguf_open_memory(&ctx, buf, (size_t)n, path, &err) != MLA_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    } else if (gguf_open(&ctx, path, &err) != MLA_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("version %u\n", gguf_version(ctx));
    printf("tensor_count %zu\n", gguf_n_tensors(ctx));
    printf("kv_count %zu\n", gguf_n_kv(ctx));
    printf("alignment %u\n", gguf_alignment(ctx));
    printf("data_offset %llu\n", (unsigned long long)gguf_part_data_offset(ctx, 0));
    for (size_t i = 0; i < gguf_n_kv(ctx); i++) {
        const gguf_kv *kv = gguf_kv_at(ctx, i);
        printf("kv ");
        qstr(kv->key, strlen(kv->key));
        printf(" %s ", gguf_vtype_name(kv->val.type));
        value(&kv->val);
        putchar('\n');
    }
    for (size_t i = 0; i < gguf_n_tensors(ctx); i++) {
        const gguf_tensor *t = gguf_tensor_at(ctx, i);
        printf("tensor ");
        qstr(t->name, strlen(t->name));
        printf(" type=%u dims=", t->type);
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%lld", d ? "," : "", (long long)t->ne[d]);
        printf(" elems=%lld bytes=%zu offset=%llu crc32=%08x\n", (long long)t->n_elems, t->nbytes,
               (unsigned long long)t->file_offset, t->nbytes ? crc32_buf(t->data, t->nbytes) : 0u);
    }
    gguf_close(ctx);
    free(buf);
    return 0;
}
