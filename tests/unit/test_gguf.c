/* Unit tests of the GGUF reader.
 * Usage: test_gguf FIXTURES_DIR CORPUS_DIR SPLIT_DIR
 *   FIXTURES_DIR: the shared fixtures (tiny-deepseek3/ and tiny-glm5/ *.gguf)
 *   CORPUS_DIR:   output of tests/gguf/make_broken.py (manifest.tsv, bad/, good/)
 *   SPLIT_DIR:    output of tests/gguf/make_split.py: ds-0000N-of-00003.gguf (3 parts) and
 *                 dse-... (first part without tensors), both of tiny-deepseek3-q4_k_m.gguf
 * Values of the fixtures themselves are compared with gguf-py by tests/gguf/compare_dump.py;
 * here: every broken file fails with its own message, getters and coercion, index lookups,
 * split files equal to the unsplit file, and opening touches no tensor data. */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/stat.h>

#include "common/gguf.h"
#include "mla_test.h"

static const char *g_fixtures, *g_corpus, *g_split;

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    REQUIRE(b != NULL);
    REQUIRE(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* "FILE: offset N: problem" on one line */
static int one_line_with_offset(const char *msg) {
    if (strchr(msg, '\n') || strchr(msg, '\r')) return 0;
    const char *o = strstr(msg, ": offset ");
    if (!o || o == msg) return 0;
    o += 9;
    if (*o < '0' || *o > '9') return 0;
    while (*o >= '0' && *o <= '9') o++;
    return o[0] == ':' && o[1] == ' ' && o[2] != '\0';
}

/* ------------------------------------------------------------ broken corpus */

static void test_corpus(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.tsv", g_corpus);
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[8192];
    int n_bad = 0, n_good = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *fields[16];
        int nf = 0;
        for (char *tok = strtok(line, "\t"); tok && nf < 16; tok = strtok(NULL, "\t")) fields[nf++] = tok;
        REQUIRE(nf >= 2);
        const char *kind = fields[0], *file = fields[1];
        gguf_ctx *ctx = NULL;
        mla_err err;
        memset(&err, 0, sizeof err);
        int rc = gguf_open(&ctx, file, &err);
        if (strcmp(kind, "good") == 0) {
            n_good++;
            CHECKF(rc == MLA_OK, "%s should open: %s", file, err.msg);
            size_t len;
            uint8_t *buf = read_file(file, &len);
            gguf_ctx *mctx = NULL;
            int mrc = gguf_open_memory(&mctx, buf, len, file, &err);
            CHECKF(mrc == MLA_OK, "%s should open from memory: %s", file, err.msg);
            if (rc == MLA_OK && mrc == MLA_OK) {
                CHECK(gguf_index_hash(ctx) == gguf_index_hash(mctx));
                CHECK(gguf_n_tensors(ctx) == gguf_n_tensors(mctx));
                for (size_t i = 0; i < gguf_n_tensors(ctx); i++) {
                    const gguf_tensor *a = gguf_tensor_at(ctx, i), *b = gguf_tensor_at(mctx, i);
                    CHECK(a->nbytes == b->nbytes && a->file_offset == b->file_offset);
                    if (a->nbytes) CHECK(memcmp(a->data, b->data, a->nbytes) == 0);
                    CHECK(gguf_find_tensor(ctx, a->name) == a);
                }
            }
            gguf_close(mctx);
            free(buf);
            gguf_close(ctx);
            continue;
        }
        n_bad++;
        CHECKF(rc == MLA_ERR && ctx == NULL, "%s should fail to open", file);
        CHECKF(one_line_with_offset(err.msg), "%s: message is not one 'FILE: offset N: problem' line: %s", file,
               err.msg);
        for (int w = 2; w < nf; w++)
            CHECKF(strstr(err.msg, fields[w]) != NULL, "%s: message lacks '%s': %s", file, fields[w], err.msg);
        if (strcmp(kind, "bad") == 0) {
            /* the same problem found through gguf_open_memory, with the same message */
            size_t len;
            uint8_t *buf = read_file(file, &len);
            mla_err merr;
            memset(&merr, 0, sizeof merr);
            gguf_ctx *mctx = NULL;
            int mrc = gguf_open_memory(&mctx, len ? buf : NULL, len, file, &merr);
            CHECKF(mrc == MLA_ERR && mctx == NULL, "%s should fail from memory", file);
            CHECKF(strcmp(err.msg, merr.msg) == 0, "%s: memory message differs: %s", file, merr.msg);
            free(buf);
        }
    }
    fclose(f);
    printf("corpus: %d broken, %d valid files\n", n_bad, n_good);
    CHECK(n_bad >= 25);
    CHECK(n_good >= 3);
}

static void test_open_errors(void) {
    gguf_ctx *c = NULL;
    mla_err err;
    CHECK(gguf_open(&c, "/nonexistent/model.gguf", &err) == MLA_ERR && c == NULL);
    CHECK(one_line_with_offset(err.msg) && strstr(err.msg, "cannot open") && strstr(err.msg, "/nonexistent/model.gguf"));
    CHECK(gguf_open(&c, g_corpus, &err) == MLA_ERR && strstr(err.msg, "not a regular file"));
    CHECK(gguf_open_memory(&c, NULL, 0, "nothing", &err) == MLA_ERR && strstr(err.msg, "nothing: offset 0: truncated header"));
}

/* ------------------------------------------------------------ getters */

static void test_getters(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/good/all_value_types.gguf", g_corpus);
    gguf_ctx *c = NULL;
    mla_err err;
    REQUIRE(gguf_open(&c, path, &err) == MLA_OK);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    gguf_str s;
    const gguf_value *arr;

    CHECK(gguf_alignment(c) == 64);
    CHECK(gguf_get_u32(c, "t.u8", &u32, &err) == 1 && u32 == 255);
    CHECK(gguf_get_u32(c, "t.u32", &u32, &err) == 1 && u32 == 4294967295u);
    CHECK(gguf_get_u32(c, "t.i8", &u32, &err) == MLA_ERR && strstr(err.msg, "t.i8") && strstr(err.msg, "-128"));
    CHECK(gguf_get_u32(c, "t.u64", &u32, &err) == MLA_ERR && strstr(err.msg, "does not fit uint32"));
    CHECK(gguf_get_u64(c, "t.u64", &u64, &err) == 1 && u64 == UINT64_MAX);
    CHECK(gguf_get_i64(c, "t.u64", &i64, &err) == MLA_ERR);
    CHECK(gguf_get_i64(c, "t.i64", &i64, &err) == 1 && i64 == INT64_MIN);
    CHECK(gguf_get_i64(c, "t.i16", &i64, &err) == 1 && i64 == -32768);
    CHECK(gguf_get_i64(c, "t.u16", &i64, &err) == 1 && i64 == 65535);
    CHECK(gguf_get_f32(c, "t.f32", &f, &err) == 1 && f == 1.0e-6f);
    CHECK(gguf_get_f32(c, "t.f64", &f, &err) == 1 && f == (float)3.141592653589793);
    CHECK(gguf_get_f32(c, "t.i32", &f, &err) == 1 && f == -2147483648.0f);
    CHECK(gguf_get_u32(c, "t.f32", &u32, &err) == MLA_ERR); /* 1e-6 is not an integer */
    CHECK(gguf_get_bool(c, "t.bool_t", &b, &err) == 1 && b);
    CHECK(gguf_get_bool(c, "t.bool_f", &b, &err) == 1 && !b);
    CHECK(gguf_get_bool(c, "t.u8", &b, &err) == MLA_ERR);
    CHECK(gguf_get_u32(c, "t.bool_t", &u32, &err) == 1 && u32 == 1);
    CHECK(gguf_get_str(c, "t.str", &s, &err) == 1 && s.len == strlen("h\xc3\xa9llo \"q\" \\ ,[]") &&
          memcmp(s.ptr, "h\xc3\xa9llo \"q\" \\ ,[]", s.len) == 0);
    CHECK(gguf_get_str(c, "t.empty_str", &s, &err) == 1 && s.len == 0);
    CHECK(gguf_get_str(c, "t.u32", &s, &err) == MLA_ERR && strstr(err.msg, "t.u32") && strstr(err.msg, "uint32"));
    CHECK(gguf_get_u32(c, "t.str", &u32, &err) == MLA_ERR && strstr(err.msg, "type string"));
    CHECK(gguf_get_u32(c, "no.such.key", &u32, &err) == 0);
    CHECK(gguf_get_str(c, "no.such.key", &s, &err) == 0);
    CHECK(gguf_get_arr(c, "no.such.key", GGUF_VT_STRING, &arr, &err) == 0);
    CHECK(gguf_get_arr(c, "t.arr_str", GGUF_VT_STRING, &arr, &err) == 1 && arr->v.arr.n == 4 &&
          arr->v.arr.items[2].v.s.len == 3 && memcmp(arr->v.arr.items[2].v.s.ptr, "c,d", 3) == 0);
    CHECK(gguf_get_arr(c, "t.arr_str", GGUF_VT_INT32, &arr, &err) == MLA_ERR &&
          strstr(err.msg, "array of string"));
    CHECK(gguf_get_arr(c, "t.u8", GGUF_VT_UINT8, &arr, &err) == MLA_ERR);
    CHECK(gguf_get_arr(c, "t.arr_empty", GGUF_VT_UINT32, &arr, &err) == 1 && arr->v.arr.n == 0);
    REQUIRE(gguf_get_arr(c, "t.nested2", GGUF_VT_ARRAY, &arr, &err) == 1);
    CHECK(arr->v.arr.n == 3 && arr->v.arr.items[1].type == GGUF_VT_ARRAY &&
          arr->v.arr.items[1].v.arr.elem == GGUF_VT_STRING && arr->v.arr.items[1].v.arr.n == 2 &&
          arr->v.arr.items[2].v.arr.elem == GGUF_VT_INT32 && arr->v.arr.items[2].v.arr.n == 0);
    /* depth: nested_max is GGUF_MAX_ARRAY_DEPTH levels */
    REQUIRE(gguf_get_arr(c, "t.nested_max", GGUF_VT_ARRAY, &arr, &err) == 1);
    int depth = 1;
    const gguf_value *v = arr;
    while (v->v.arr.elem == GGUF_VT_ARRAY) {
        v = &v->v.arr.items[0];
        depth++;
    }
    CHECK(depth == GGUF_MAX_ARRAY_DEPTH);
    /* tensors: the empty one and the 4-d one */
    const gguf_tensor *t = gguf_find_tensor(c, "e.weight");
    CHECK(t && t->n_elems == 0 && t->nbytes == 0 && t->n_dims == 3 && t->ne[3] == 1);
    t = gguf_find_tensor(c, "d4.weight");
    CHECK(t && t->n_dims == 4 && t->n_elems == 120 && t->nbytes == 240);
    CHECK(t && (t->file_offset - gguf_part_data_offset(c, 0)) % 64 == 0);
    CHECK(gguf_find_tensor(c, "d4") == NULL && gguf_find_kv(c, "t.u") == NULL);
    CHECK(strcmp(gguf_vtype_name(GGUF_VT_FLOAT64), "float64") == 0);
    CHECK(strcmp(gguf_vtype_name((enum gguf_vtype)99), "unknown") == 0);
    gguf_close(c);
}

/* ------------------------------------------------------------ fixtures */

static size_t rss_of_mapping(const char *path) {
    /* Rss (kB) of the mappings of `path` in this process, from /proc/self/smaps */
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return (size_t)-1;
    char line[8192];
    int in = 0, found = 0;
    char real[4096];
    if (!realpath(path, real)) return (size_t)-1;
    path = real;
    size_t rss = 0, plen = strlen(path);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        unsigned long lo, hi, kb;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) == 3) {
            size_t L = strlen(line);
            in = L >= plen && strcmp(line + L - plen, path) == 0;
            found |= in;
        } else if (in && sscanf(line, "Rss: %lu kB", &kb) == 1) {
            rss += kb;
        }
    }
    fclose(f);
    return found ? rss : (size_t)-1;
}

static void check_fixture(const char *path, uint64_t *hash_out, size_t *rss_out) {
    gguf_ctx *c = NULL;
    mla_err err;
    REQUIRE(gguf_open(&c, path, &err) == MLA_OK);
    CHECK(gguf_n_parts(c) == 1);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    CHECK(gguf_part_size(c, 0) == (uint64_t)st.st_size);
    CHECK(strcmp(gguf_part_path(c, 0), path) == 0);
    uint64_t data_off = gguf_part_data_offset(c, 0);
    CHECK(data_off % gguf_alignment(c) == 0 && data_off < (uint64_t)st.st_size);

    /* opening reads metadata only: the mapping holds about the metadata pages, not the data */
    size_t rss = rss_of_mapping(path);
    CHECKF(rss != (size_t)-1 && rss * 1024 < data_off + (1u << 20) && rss * 1024 < (size_t)st.st_size / 4,
           "%s: %zu kB of the file mapped after open (metadata is %llu bytes)", path, rss,
           (unsigned long long)data_off);

    *rss_out = rss;
    size_t n = gguf_n_tensors(c);
    CHECK(n > 0);
    uint64_t end_max = 0;
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        CHECK(gguf_find_tensor(c, t->name) == t);
        CHECK(t->part == 0 && t->n_dims >= 1 && t->n_dims <= 4);
        int64_t ne = 1;
        for (int d = 0; d < 4; d++) ne *= t->ne[d];
        CHECK(ne == t->n_elems);
        CHECK(t->nbytes == ggml_row_bytes(t->type, t->ne[0]) * (size_t)(t->n_elems / t->ne[0]));
        CHECK(t->file_offset >= data_off && (t->file_offset - data_off) % gguf_alignment(c) == 0);
        CHECK(t->file_offset + t->nbytes <= (uint64_t)st.st_size);
        if (t->file_offset + t->nbytes > end_max) end_max = t->file_offset + t->nbytes;
    }
    CHECK(end_max <= (uint64_t)st.st_size && end_max + gguf_alignment(c) > (uint64_t)st.st_size);

    /* every kv can be found and read through the typed getters of its own type */
    size_t nkv = gguf_n_kv(c);
    CHECK(nkv > 10);
    for (size_t i = 0; i < nkv; i++) {
        const gguf_kv *kv = gguf_kv_at(c, i);
        CHECK(gguf_find_kv(c, kv->key) == kv);
        mla_err e2;
        if (kv->val.type == GGUF_VT_UINT32) {
            uint32_t u;
            CHECK(gguf_get_u32(c, kv->key, &u, &e2) == 1 && u == kv->val.v.u);
            float f;
            CHECK(gguf_get_f32(c, kv->key, &f, &e2) == 1 && f == (float)kv->val.v.u);
        } else if (kv->val.type == GGUF_VT_STRING) {
            gguf_str s;
            CHECK(gguf_get_str(c, kv->key, &s, &e2) == 1 && s.ptr == kv->val.v.s.ptr);
            uint32_t u;
            CHECK(gguf_get_u32(c, kv->key, &u, &e2) == MLA_ERR && strstr(e2.msg, kv->key));
        } else if (kv->val.type == GGUF_VT_FLOAT32) {
            float f;
            CHECK(gguf_get_f32(c, kv->key, &f, &e2) == 1 && f == (float)kv->val.v.f);
        } else if (kv->val.type == GGUF_VT_ARRAY) {
            const gguf_value *a;
            CHECK(gguf_get_arr(c, kv->key, kv->val.v.arr.elem, &a, &e2) == 1 && a == &kv->val);
        }
    }
    /* paging hints on a tensor's range are harmless */
    const gguf_tensor *t0 = gguf_tensor_at(c, 0);
    gguf_prefetch(c, t0->data, t0->nbytes);
    gguf_evict(c, t0->data, t0->nbytes);
    gguf_prefetch(c, "not mapped", 10);

    *hash_out = gguf_index_hash(c);
    gguf_ctx *c2 = NULL;
    REQUIRE(gguf_open(&c2, path, &err) == MLA_OK);
    CHECK(gguf_index_hash(c2) == *hash_out);
    gguf_close(c2);
    gguf_close(c);
}

static void test_fixtures(void) {
    const char *dirs[] = {"tiny-deepseek3", "tiny-glm5"};
    uint64_t hashes[16];
    int nh = 0;
    for (int d = 0; d < 2; d++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", g_fixtures, dirs[d]);
        DIR *dp = opendir(dir);
        REQUIRE(dp != NULL);
        struct dirent *e;
        while ((e = readdir(dp))) {
            size_t L = strlen(e->d_name);
            if (L < 5 || strcmp(e->d_name + L - 5, ".gguf") != 0) continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            REQUIRE(nh < 16);
            size_t rss = 0;
            check_fixture(path, &hashes[nh++], &rss);
            printf("fixture checked: %s (%zu kB of the file mapped after open)\n", path, rss);
        }
        closedir(dp);
    }
    CHECK(nh >= 5);
    for (int i = 0; i < nh; i++)
        for (int j = i + 1; j < nh; j++) CHECK(hashes[i] != hashes[j]);
}

/* ------------------------------------------------------------ split files */

static int values_equal(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case GGUF_VT_STRING: return a->v.s.len == b->v.s.len && memcmp(a->v.s.ptr, b->v.s.ptr, a->v.s.len) == 0;
    case GGUF_VT_ARRAY:
        if (a->v.arr.elem != b->v.arr.elem || a->v.arr.n != b->v.arr.n) return 0;
        for (uint64_t i = 0; i < a->v.arr.n; i++)
            if (!values_equal(&a->v.arr.items[i], &b->v.arr.items[i])) return 0;
        return 1;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: return memcmp(&a->v.f, &b->v.f, sizeof a->v.f) == 0;
    case GGUF_VT_BOOL: return a->v.b == b->v.b;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64: return a->v.i == b->v.i;
    default: return a->v.u == b->v.u;
    }
}

static void check_split(const char *prefix, int first_empty) {
    char src[4096], p1[4096], p2[4096];
    snprintf(src, sizeof src, "%s/tiny-deepseek3/tiny-deepseek3-q4_k_m.gguf", g_fixtures);
    snprintf(p1, sizeof p1, "%s/%s-00001-of-00003.gguf", g_split, prefix);
    snprintf(p2, sizeof p2, "%s/%s-00002-of-00003.gguf", g_split, prefix);
    gguf_ctx *u = NULL, *s = NULL, *s2 = NULL;
    mla_err err;
    REQUIRE(gguf_open(&u, src, &err) == MLA_OK);
    if (gguf_open(&s, p1, &err) != MLA_OK) {
        fprintf(stderr, "open split: %s\n", err.msg);
        REQUIRE(0);
    }
    REQUIRE(gguf_open(&s2, p2, &err) == MLA_OK); /* opening by any part opens the set */
    CHECK(gguf_n_parts(s) == 3 && gguf_n_parts(s2) == 3);
    CHECK(gguf_index_hash(s) == gguf_index_hash(s2));
    CHECK(gguf_index_hash(s) != gguf_index_hash(u));
    CHECK(strcmp(gguf_part_path(s, 0), p1) == 0 && strcmp(gguf_part_path(s2, 1), p2) == 0);
    for (int i = 0; i < 3; i++) {
        struct stat st;
        REQUIRE(stat(gguf_part_path(s, i), &st) == 0);
        CHECK(gguf_part_size(s, i) == (uint64_t)st.st_size);
    }
    /* same tensor index and bytes */
    REQUIRE(gguf_n_tensors(s) == gguf_n_tensors(u));
    int last_part = 0, parts_seen[3] = {0, 0, 0};
    for (size_t i = 0; i < gguf_n_tensors(u); i++) {
        const gguf_tensor *a = gguf_tensor_at(u, i), *b = gguf_tensor_at(s, i);
        CHECKF(strcmp(a->name, b->name) == 0, "tensor %zu: %s vs %s", i, a->name, b->name);
        CHECK(a->type == b->type && a->n_dims == b->n_dims && a->n_elems == b->n_elems && a->nbytes == b->nbytes);
        CHECK(memcmp(a->ne, b->ne, sizeof a->ne) == 0);
        CHECKF(memcmp(a->data, b->data, a->nbytes) == 0, "tensor %s bytes differ", a->name);
        CHECK(gguf_find_tensor(s, a->name) == b);
        CHECK(b->part >= last_part);
        last_part = b->part;
        parts_seen[b->part]++;
        uint64_t ds = gguf_part_data_offset(s, b->part);
        CHECK(b->file_offset >= ds && (b->file_offset - ds) % 32 == 0);
        CHECK(b->file_offset + b->nbytes <= gguf_part_size(s, b->part));
    }
    CHECK(parts_seen[0] == (first_empty ? 0 : parts_seen[0]) && parts_seen[1] > 0 && parts_seen[2] > 0);
    if (!first_empty) CHECK(parts_seen[0] > 0);
    /* metadata: everything of the unsplit file, plus the split keys */
    CHECK(gguf_n_kv(s) == gguf_n_kv(u) + 3);
    for (size_t i = 0; i < gguf_n_kv(u); i++) {
        const gguf_kv *a = gguf_kv_at(u, i), *b = gguf_find_kv(s, a->key);
        CHECKF(b && values_equal(&a->val, &b->val), "kv %s differs in the split", a->key);
    }
    uint32_t v;
    CHECK(gguf_get_u32(s, "split.count", &v, &err) == 1 && v == 3);
    CHECK(gguf_get_u32(s, "split.no", &v, &err) == 1 && v == 0); /* the first part's wins */
    CHECK(gguf_get_u32(s, "split.tensors.count", &v, &err) == 1 && v == gguf_n_tensors(u));
    gguf_close(s2);
    gguf_close(s);
    gguf_close(u);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s FIXTURES_DIR CORPUS_DIR SPLIT_DIR\n", argv[0]);
        return 2;
    }
    g_fixtures = argv[1];
    g_corpus = argv[2];
    g_split = argv[3];
    test_corpus();
    test_open_errors();
    test_getters();
    test_fixtures();
    check_split("ds", 0);
    check_split("dse", 1);
    return mla_test_finish();
}
