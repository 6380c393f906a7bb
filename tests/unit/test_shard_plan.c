/* The tensor-parallel plan (common/shard_plan.c) on synthetic tensor tables built in memory:
 * head splits, block-aligned column splits and their fallbacks, expert ownership, refusals. */
#include <stdint.h>
#include <string.h>

#include "common/gguf.h"
#include "common/shard_plan.h"
#include "mla_test.h"

typedef struct tdesc {
    const char *name;
    int n_dims;
    int64_t ne[3];
    uint32_t type;
} tdesc;

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

static void put(buf *b, const void *src, size_t n) {
    b->p = realloc(b->p, b->n + n);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }

/* A GGUF v3 file with no metadata and the given tensors, data zero-filled and aligned. */
static buf make_gguf(const tdesc *t, int n) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n);
    put_u64(&b, 0);
    uint64_t off = 0, sizes[16];
    for (int i = 0; i < n; i++) {
        put_u64(&b, strlen(t[i].name));
        put(&b, t[i].name, strlen(t[i].name));
        put_u32(&b, (uint32_t)t[i].n_dims);
        int64_t rows = 1;
        for (int d = 0; d < t[i].n_dims; d++) {
            put_u64(&b, (uint64_t)t[i].ne[d]);
            if (d) rows *= t[i].ne[d];
        }
        put_u32(&b, t[i].type);
        put_u64(&b, off);
        sizes[i] = ggml_row_bytes(t[i].type, t[i].ne[0]) * (uint64_t)rows;
        off += (sizes[i] + 31) / 32 * 32;
    }
    size_t pad = (32 - b.n % 32) % 32;
    uint8_t zeros[64] = {0};
    put(&b, zeros, pad);
    uint8_t *data = calloc(1, off ? off : 1);
    put(&b, data, off);
    free(data);
    return b;
}

static gguf_ctx *open_buf(buf *b) {
    gguf_ctx *g = NULL;
    mla_err err;
    if (gguf_open_memory(&g, b->p, b->n, "synthetic.gguf", &err) != MLA_OK) {
        fprintf(stderr, "synthetic file does not open: %s\n", err.msg);
        exit(1);
    }
    return g;
}

static const shard_dims k_dims = {.n_head = 4, .head_k = 96, .head_kv = 128, .head_v = 64,
                                  .n_expert = 8, .n_vocab = 2048};

static void test_heads_and_columns(void) {
    tdesc t[] = {
        {"blk.0.attn_q_b.weight", 2, {256, 384}, GGML_TYPE_Q8_0},
        {"blk.0.attn_k_b.weight", 3, {64, 256, 4}, GGML_TYPE_Q8_0},
        {"blk.0.attn_v_b.weight", 3, {256, 64, 4}, GGML_TYPE_Q8_0},
        {"blk.0.attn_output.weight", 2, {256, 256}, GGML_TYPE_Q8_0},
        {"blk.0.attn_q_a.weight", 2, {256, 256}, GGML_TYPE_Q8_0},
        {"output.weight", 2, {256, 2048}, GGML_TYPE_Q8_0},
    };
    buf b = make_gguf(t, 6);
    gguf_ctx *g = open_buf(&b);
    for (int r = 0; r < 2; r++) {
        shard_plan p;
        REQUIRE(shard_plan_build(&p, g, &k_dims, r, 2, NULL) == MLA_OK);
        CHECK(p.valid);
        const shard_entry *e = shard_plan_find(&p, "blk.0.attn_q_b.weight");
        CHECK(e->kind == SHARD_ROWS && e->begin == r * 192 && e->end == (r + 1) * 192);
        e = shard_plan_find(&p, "blk.0.attn_k_b.weight");
        CHECK(e->kind == SHARD_DIM2 && e->begin == r * 2 && e->end == r * 2 + 2);
        CHECK(e->bytes_rank == e->bytes_total / 2);
        e = shard_plan_find(&p, "blk.0.attn_output.weight");
        CHECK(e->kind == SHARD_COLS && e->begin == r * 128 && e->end == (r + 1) * 128);
        CHECK(!e->gather_input && e->bytes_rank == e->bytes_total / 2);
        e = shard_plan_find(&p, "blk.0.attn_q_a.weight");
        CHECK(e->kind == SHARD_REPLICATE && e->bytes_rank == e->bytes_total);
        e = shard_plan_find(&p, "output.weight");
        CHECK(e->kind == SHARD_ROWS && e->end - e->begin == 1024);
        shard_plan_free(&p);
    }
    /* 3 ranks do not divide 4 heads */
    shard_plan p;
    REQUIRE(shard_plan_build(&p, g, &k_dims, 0, 3, NULL) == MLA_OK);
    CHECK(!p.valid);
    CHECKF(strstr(p.reason, "does not divide the 4 attention heads") != NULL, "%s", p.reason);
    shard_plan_free(&p);
    /* bad rank */
    mla_err err;
    CHECK(shard_plan_build(&p, g, &k_dims, 2, 2, &err) == MLA_ERR);
    CHECK(strstr(err.msg, "rank 2 of world size 2") != NULL);
    gguf_close(g);
    free(b.p);
}

static void test_unaligned_attn_output(void) {
    /* Q4_K blocks are 256 wide: 2 heads x 64 = 128 columns would cut them. */
    tdesc ok_rows[] = {{"blk.1.attn_output.weight", 2, {256, 256}, GGML_TYPE_Q4_K}};
    buf b = make_gguf(ok_rows, 1);
    gguf_ctx *g = open_buf(&b);
    shard_plan p;
    REQUIRE(shard_plan_build(&p, g, &k_dims, 1, 2, NULL) == MLA_OK);
    CHECK(p.valid);
    const shard_entry *e = shard_plan_find(&p, "blk.1.attn_output.weight");
    CHECK(e->kind == SHARD_ROWS && e->gather_input && e->begin == 128 && e->end == 256);
    CHECK(strstr(p.notes, "blk.1.attn_output.weight") != NULL);
    shard_plan_free(&p);
    gguf_close(g);
    free(b.p);

    /* ... and 257 output rows cannot be split 2 ways either: refused, naming the tensor. */
    tdesc bad[] = {{"blk.1.attn_output.weight", 2, {256, 257}, GGML_TYPE_Q4_K}};
    b = make_gguf(bad, 1);
    g = open_buf(&b);
    REQUIRE(shard_plan_build(&p, g, &k_dims, 0, 2, NULL) == MLA_OK);
    CHECK(!p.valid);
    CHECKF(strstr(p.reason, "blk.1.attn_output.weight (Q4_K) cannot be split 2 ways") != NULL, "%s",
           p.reason);
    shard_plan_free(&p);
    /* one rank: nothing to split, always valid */
    REQUIRE(shard_plan_build(&p, g, &k_dims, 0, 1, NULL) == MLA_OK);
    CHECK(p.valid);
    shard_plan_free(&p);
    gguf_close(g);
    free(b.p);
}

static void test_ffn_and_experts(void) {
    tdesc t[] = {
        {"blk.0.ffn_gate.weight", 2, {256, 512}, GGML_TYPE_Q4_K},
        {"blk.0.ffn_up.weight", 2, {256, 512}, GGML_TYPE_Q4_K},
        {"blk.0.ffn_down.weight", 2, {512, 256}, GGML_TYPE_Q4_K},
        {"blk.1.ffn_gate_exps.weight", 3, {256, 256, 8}, GGML_TYPE_Q8_0},
        {"blk.1.ffn_gate_shexp.weight", 2, {256, 256}, GGML_TYPE_Q8_0},
        {"blk.1.ffn_down_shexp.weight", 2, {256, 256}, GGML_TYPE_Q8_0},
    };
    buf b = make_gguf(t, 6);
    gguf_ctx *g = open_buf(&b);
    shard_plan p;
    /* T=2: 256 inputs of ffn_down per rank, block-aligned: split */
    REQUIRE(shard_plan_build(&p, g, &k_dims, 1, 2, NULL) == MLA_OK);
    CHECK(p.valid);
    const shard_entry *e = shard_plan_find(&p, "blk.0.ffn_gate.weight");
    CHECK(e->kind == SHARD_ROWS && e->begin == 256 && e->end == 512 && !e->rank0_only);
    e = shard_plan_find(&p, "blk.0.ffn_down.weight");
    CHECK(e->kind == SHARD_COLS && e->begin == 256 && e->end == 512);
    shard_plan_free(&p);
    /* T=4: 128 inputs per rank cut a Q4_K block: the whole dense FFN is replicated, rank 0 computes */
    REQUIRE(shard_plan_build(&p, g, &k_dims, 3, 4, NULL) == MLA_OK);
    CHECK(p.valid);
    e = shard_plan_find(&p, "blk.0.ffn_up.weight");
    CHECK(e->kind == SHARD_REPLICATE && e->rank0_only);
    e = shard_plan_find(&p, "blk.0.ffn_down.weight");
    CHECK(e->kind == SHARD_REPLICATE && e->rank0_only);
    CHECK(strstr(p.notes, "blk.0.ffn_down.weight") != NULL);
    /* the Q8_0 shared expert splits fine at T=4 (64 columns = 2 blocks) */
    e = shard_plan_find(&p, "blk.1.ffn_down_shexp.weight");
    CHECK(e->kind == SHARD_COLS && e->begin == 192 && e->end == 256);
    shard_plan_free(&p);
    /* experts e mod T == r: T=3 gives ranks 3, 3, 2 experts */
    uint64_t sum = 0;
    const uint64_t per_expert = ggml_row_bytes(GGML_TYPE_Q8_0, 256) * 256;
    for (int r = 0; r < 3; r++) {
        shard_dims d = k_dims;
        d.n_head = 3; /* keep the plan valid for 3 ranks */
        REQUIRE(shard_plan_build(&p, g, &d, r, 3, NULL) == MLA_OK);
        e = shard_plan_find(&p, "blk.1.ffn_gate_exps.weight");
        CHECK(e->kind == SHARD_EXPERTS);
        CHECK(e->bytes_rank == (r < 2 ? 3 : 2) * per_expert);
        sum += e->bytes_rank;
        shard_plan_free(&p);
    }
    CHECK(sum == 8 * per_expert);
    gguf_close(g);
    free(b.p);
}

static void test_roles(void) {
    int l;
    CHECK(shard_role_of("blk.12.attn_kv_b.weight", &l) == ROLE_KV_B && l == 12);
    CHECK(shard_role_of("blk.0.indexer.k_norm.bias", &l) == ROLE_INDEXER && l == 0);
    CHECK(shard_role_of("token_embd.weight", &l) == ROLE_EMBD && l == -1);
    CHECK(shard_role_of("blk.x.attn_q_b.weight", &l) == ROLE_OTHER);
    CHECK(shard_role_of("blk.3.exp_probs_b.bias", &l) == ROLE_ROUTER_BIAS && l == 3);
}

int main(void) {
    test_heads_and_columns();
    test_unaligned_attn_output();
    test_ffn_and_experts();
    test_roles();
    return mla_test_finish();
}
