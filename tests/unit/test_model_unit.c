/* Unit tests of the model config, shape validation and MoE routing. argv[1]: fixtures folder. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/layer_tensors.h"
#include "common/mla_switch.h"
#include "common/model_config.h"
#include "kernels/moe.h"
#include "mla_test.h"
#include "worker/model.h"

static float logit_of(float p) { return logf(p / (1.0f - p)); } /* sigmoid^-1 */

static void test_routing(void) {
    /* 8 experts in 4 groups of 2, 2 groups used, 2 experts chosen. Expert 0 has the highest
     * single score but its group (0) has the lowest top-2 sum, so group limiting must drop it. */
    const float p[8] = {0.95f, 0.05f, 0.60f, 0.58f, 0.70f, 0.50f, 0.40f, 0.45f};
    float lg[8];
    for (int i = 0; i < 8; i++) lg[i] = logit_of(p[i]);
    moe_route_params rp = {8, 2, 4, 2, 2, true, 2.5f};
    int32_t ids[2];
    float w[2];
    /* group sums: g0 1.00, g1 1.18, g2 1.20, g3 0.85 -> groups 2 and 1 -> experts 4 (0.70), 2 (0.60) */
    moe_route(&rp, lg, NULL, ids, w);
    CHECKF(ids[0] == 4 && ids[1] == 2, "ids %d %d", ids[0], ids[1]);
    CHECK(fabsf(w[0] - 2.5f * 0.70f / 1.30f) < 1e-5f && fabsf(w[1] - 2.5f * 0.60f / 1.30f) < 1e-5f);
    /* without groups expert 0 wins */
    moe_route_params flat = {8, 2, 1, 1, 2, true, 1.0f};
    moe_route(&flat, lg, NULL, ids, w);
    CHECKF(ids[0] == 0 && ids[1] == 4, "flat ids %d %d", ids[0], ids[1]);
    /* bias changes the choice, not the weights: push expert 7 (p .45) up into group 3 */
    float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.5f};
    /* group sums with bias: g3 = 0.40 + 0.95 = 1.35 (best), g2 1.20 -> experts 7 (0.95) and 4 (0.70) */
    moe_route(&rp, lg, bias, ids, w);
    CHECKF(ids[0] == 7 && ids[1] == 4, "biased ids %d %d", ids[0], ids[1]);
    CHECK(fabsf(w[0] - 2.5f * 0.45f / (0.45f + 0.70f)) < 1e-5f);
    /* no normalisation */
    moe_route_params nn = {8, 2, 4, 2, 2, false, 1.0f};
    moe_route(&nn, lg, NULL, ids, w);
    CHECK(fabsf(w[0] - 0.70f) < 1e-5f && fabsf(w[1] - 0.60f) < 1e-5f);
    /* softmax gating: weights are softmax probabilities of the chosen */
    moe_route_params sm = {8, 2, 1, 1, 1, false, 1.0f};
    float z[8] = {1, 2, 3, 0, 0, 0, 0, 5};
    moe_route(&sm, z, NULL, ids, w);
    double den = 0;
    for (int i = 0; i < 8; i++) den += exp(z[i]);
    CHECK(ids[0] == 7 && ids[1] == 2);
    CHECK(fabs(w[0] - exp(5) / den) < 1e-5 && fabs(w[1] - exp(3) / den) < 1e-5);
    /* softmax gating with groups (DeepSeek-V2's group_limited_greedy): a group scores by its best
     * expert. Group 0 holds the best one (p .46) and a near-zero one, group 1 two good ones (p .28,
     * .25): the best-two sum would pick group 1, the best picks group 0 */
    moe_route_params v2 = {8, 2, 4, 1, 1, false, 1.0f};
    float zg[8] = {3.0f, -5, 2.5f, 2.4f, -5, -5, -5, -5};
    moe_route(&v2, zg, NULL, ids, w);
    CHECKF(ids[0] == 0 && ids[1] == 1, "softmax groups ids %d %d", ids[0], ids[1]);
    /* ties resolve to the lower id, the same on every call (every rank) */
    float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    moe_route(&flat, t, NULL, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1);
}

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)sz);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* Finds the tensor info of `name` in a GGUF buffer and returns the offset of its ne[0]. */
static size_t find_ne(const uint8_t *b, size_t n, const char *name) {
    size_t L = strlen(name);
    for (size_t i = 8; i + L + 12 < n; i++) {
        uint64_t len;
        memcpy(&len, b + i - 8, 8);
        if (len == L && !memcmp(b + i, name, L)) return i + L + 4;
    }
    return 0;
}

/* The offset of the first byte after key `key` (its name, in a GGUF buffer), or 0. */
static size_t find_key(const uint8_t *b, size_t n, const char *key) {
    size_t L = strlen(key);
    for (size_t i = 8; i + L + 4 < n; i++) {
        uint64_t len;
        memcpy(&len, b + i - 8, 8);
        if (len == L && !memcmp(b + i, key, L)) return i + L;
    }
    return 0;
}

/* An early DeepSeek-V3 / R1 file (no expert group keys) routes as its config.json does: 8 groups,
 * 4 used; a file of another shape without them keeps one group. The q8_0 fixture's metadata is
 * patched in memory: the group keys renamed away, expert_count and vocab_size set. */
static void test_v3_groups(const char *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-deepseek3/tiny-deepseek3-q8_0.gguf", fx);
    for (int v3 = 0; v3 < 2; v3++) {
        size_t n;
        uint8_t *buf = read_all(path, &n);
        REQUIRE(buf);
        size_t o1 = find_key(buf, n, "deepseek2.expert_group_count"),
               o2 = find_key(buf, n, "deepseek2.expert_group_used_count"), o3 = find_key(buf, n, "deepseek2.expert_count"),
               o4 = find_key(buf, n, "deepseek2.vocab_size");
        REQUIRE(o1 && o2 && o3 && o4);
        buf[o1 - 5] = 'X'; /* "..._group_Xount": not a key mlaserve reads */
        buf[o2 - 5] = 'X';
        uint32_t type, ne = 256, vocab = v3 ? 129280 : 2048;
        memcpy(&type, buf + o3, 4);
        REQUIRE(type == 4); /* u32 */
        memcpy(buf + o3 + 4, &ne, 4);
        memcpy(buf + o4 + 4, &vocab, 4);
        gguf_ctx *g = NULL;
        mla_err err = {{0}};
        REQUIRE(gguf_open_memory(&g, buf, n, "patched.gguf", &err) == MLA_OK);
        mla_config c;
        REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
        CHECK(c.n_expert == 256 && c.n_vocab == vocab && c.gating == MLA_GATING_SIGMOID);
        CHECKF(v3 ? c.n_group == 8 && c.n_group_used == 4 : c.n_group == 1 && c.n_group_used == 1, "v3 %d: groups %lld / %lld",
               v3, (long long)c.n_group, (long long)c.n_group_used);
        int said = 0;
        for (int i = 0; i < c.n_assumed; i++)
            if (strstr(c.assumed[i].key, "expert_group_count") && strstr(c.assumed[i].why, "DeepSeek-V3")) said = 1;
        CHECK(said == v3);
        gguf_close(g);
        free(buf);
    }
}

static void test_config_and_shapes(const char *fx) {
    char path[1024];
    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    snprintf(path, sizeof path, "%s/tiny-deepseek3/tiny-deepseek3-q8_0.gguf", fx);
    REQUIRE(gguf_open(&g, path, &err) == MLA_OK);
    mla_config c;
    REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
    CHECK(c.arch == MLA_ARCH_DEEPSEEK2 && c.n_layer == 4 && c.n_embd == 256 && c.n_vocab == 2048);
    CHECK(c.n_head == 4 && c.q_lora_rank == 256 && c.kv_lora_rank == 256);
    CHECK(c.head_k == 96 && c.head_v == 64 && c.n_rope == 32 && c.head_nope == 64);
    CHECK(c.yarn && c.yarn_factor == 4.0f && c.yarn_orig_ctx == 1024);
    /* mscale = 1 + 0.1 * 1 * ln 4 ; kq_scale = mscale^2 / sqrt(96) */
    double ms = 1.0 + 0.1 * log(4.0);
    CHECK(fabs(c.kq_scale - ms * ms / sqrt(96.0)) < 1e-6);
    CHECK(c.n_expert == 8 && c.n_expert_used == 2 && c.n_group == 4 && c.n_group_used == 2);
    CHECK(c.gating == MLA_GATING_SIGMOID && c.weights_norm && c.weights_scale == 2.5f);
    CHECK(c.n_dense_lead == 1 && c.n_expert_shared == 1 && c.idx_n_head == 0);
    CHECK(mla_config_check_tensors(&c, g, &err) == MLA_OK);
    gguf_close(g);

    /* glm-dsa: no expert_gating_func key -> sigmoid, recorded as assumed */
    snprintf(path, sizeof path, "%s/tiny-glm5/tiny-glm5-q8_0.gguf", fx);
    REQUIRE(gguf_open(&g, path, &err) == MLA_OK);
    REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
    CHECK(c.arch == MLA_ARCH_GLM_DSA && c.gating == MLA_GATING_SIGMOID && !c.yarn);
    CHECK(c.idx_n_head == 4 && c.idx_head_dim == 64 && c.idx_top_k == 32);
    CHECK(fabs(c.kq_scale - 1.0 / sqrt(96.0)) < 1e-7);
    int found = 0;
    for (int i = 0; i < c.n_assumed; i++)
        if (strstr(c.assumed[i].key, "expert_gating_func")) found = 1;
    CHECK(found);
    gguf_close(g);

    /* a wrong shape is named in the error */
    size_t n;
    snprintf(path, sizeof path, "%s/tiny-deepseek3/tiny-deepseek3-q8_0.gguf", fx);
    uint8_t *buf = read_all(path, &n);
    REQUIRE(buf);
    size_t off = find_ne(buf, n, "blk.1.attn_q_b.weight");
    REQUIRE(off > 0);
    int64_t ne1;
    memcpy(&ne1, buf + off + 8, 8);
    CHECK(ne1 == 384);
    ne1 = 352; /* 11 rows of 32: still a valid tensor, wrong for the config */
    memcpy(buf + off + 8, &ne1, 8);
    REQUIRE(gguf_open_memory(&g, buf, n, "patched.gguf", &err) == MLA_OK);
    REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
    CHECK(mla_config_check_tensors(&c, g, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "blk.1.attn_q_b.weight") && strstr(err.msg, "[256, 352]") && strstr(err.msg, "[256, 384]"),
           "message: %s", err.msg);
    mla_model *m = NULL;
    CHECK(mla_model_load(&m, g, NULL, NULL, &err) == MLA_ERR && m == NULL);
    CHECK(strstr(err.msg, "blk.1.attn_q_b.weight") != NULL);
    gguf_close(g);
    free(buf);

    /* the per-layer tensor table (common/layer_tensors.c): each role finds the GGUF tensor of
     * its name, only in the layers it belongs to; a missing one is named */
    snprintf(path, sizeof path, "%s/tiny-deepseek3/tiny-deepseek3-q8_0.gguf", fx);
    REQUIRE(gguf_open(&g, path, &err) == MLA_OK);
    REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
    layer_tensors lt;
    REQUIRE(layer_tensors_find(&c, g, 0, &lt, &err) == MLA_OK);
    CHECK(lt.dense && lt.t[LT_FFN_GATE] && !strcmp(lt.t[LT_FFN_GATE]->name, "blk.0.ffn_gate.weight"));
    CHECK(!lt.t[LT_ROUTER] && !lt.t[LT_EXP_GATE] && !lt.t[LT_Q] && !lt.t[LT_IQ_B]);
    CHECK(lt.t[LT_Q_B] && !strcmp(lt.t[LT_Q_B]->name, "blk.0.attn_q_b.weight"));
    CHECK(lt.t[LT_KV_A_NORM] && !strcmp(lt.t[LT_KV_A_NORM]->name, "blk.0.attn_kv_a_norm.weight"));
    REQUIRE(layer_tensors_find(&c, g, 1, &lt, &err) == MLA_OK);
    CHECK(!lt.dense && !lt.t[LT_FFN_GATE]);
    CHECK(lt.t[LT_EXP_DOWN] && !strcmp(lt.t[LT_EXP_DOWN]->name, "blk.1.ffn_down_exps.weight"));
    CHECK(lt.t[LT_SHEXP_UP] && !strcmp(lt.t[LT_SHEXP_UP]->name, "blk.1.ffn_up_shexp.weight"));
    CHECK(lt.t[LT_ROUTER] && !strcmp(lt.t[LT_ROUTER]->name, "blk.1.ffn_gate_inp.weight"));
    CHECK(lt.split_kb ? lt.t[LT_K_B] && lt.t[LT_V_B] && !lt.t[LT_KV_B] : lt.t[LT_KV_B] && !lt.t[LT_K_B]);
    gguf_close(g);
    buf = read_all(path, &n);
    REQUIRE(buf);
    off = find_ne(buf, n, "blk.2.ffn_up_exps.weight");
    REQUIRE(off > 0);
    buf[off - 5] = 'X'; /* blk.2.ffn_up_exps.weighX: the layer lacks its experts' up matrices */
    REQUIRE(gguf_open_memory(&g, buf, n, "patched.gguf", &err) == MLA_OK);
    REQUIRE(mla_config_from_gguf(&c, g, &err) == MLA_OK);
    CHECK(layer_tensors_find(&c, g, 1, &lt, &err) == MLA_OK);
    CHECK(layer_tensors_find(&c, g, 2, &lt, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "blk.2.ffn_up_exps.weight") && strstr(err.msg, "missing"), "message: %s", err.msg);
    CHECK(mla_config_check_tensors(&c, g, &err) == MLA_ERR && strstr(err.msg, "blk.2.ffn_up_exps.weight"));
    gguf_close(g);
    free(buf);

    /* glm-dsa attention.indexer.types (array of bool, true = "full"): a "shared" layer (reuse of
     * the previous layer's top-k) is refused with the layer named, not silently run per layer */
    snprintf(path, sizeof path, "%s/tiny-glm5/tiny-glm5-q8_0.gguf", fx);
    buf = read_all(path, &n);
    REQUIRE(buf);
    const char *key = "glm-dsa.attention.indexer.types";
    size_t koff = find_ne(buf, n, key); /* key + 4: past the array's type field */
    REQUIRE(koff > 0);
    uint32_t ety;
    uint64_t cnt;
    memcpy(&ety, buf + koff, 4);
    memcpy(&cnt, buf + koff + 4, 8);
    CHECK(ety == 7 && cnt == 4); /* BOOL x 4 layers */
    buf[koff + 12 + 2] = 0;       /* layer 2: shared */
    REQUIRE(gguf_open_memory(&g, buf, n, "patched.gguf", &err) == MLA_OK);
    CHECK(mla_config_from_gguf(&c, g, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "indexer.types") && strstr(err.msg, "layer 2"), "message: %s", err.msg);
    gguf_close(g);
    free(buf);
}

static void test_forward_errors(const char *fx) {
    char path[1024];
    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    snprintf(path, sizeof path, "%s/tiny-glm5/tiny-glm5-q8_0.gguf", fx);
    REQUIRE(gguf_open(&g, path, &err) == MLA_OK);
    mla_model *m = NULL;
    mla_model_opts o = {2};
    REQUIRE(mla_model_load(&m, g, NULL, &o, &err) == MLA_OK);
    mla_state *s = mla_state_new(m, 4);
    int32_t bad[1] = {5000};
    CHECK(mla_model_forward(m, s, bad, 1, 0, MLA_LOGITS_NONE, NULL, &err) == MLA_ERR && strstr(err.msg, "5000"));
    int32_t ok[5] = {2, 3, 4, 5, 6};
    CHECK(mla_model_forward(m, s, ok, 5, 0, MLA_LOGITS_NONE, NULL, &err) == MLA_ERR);
    float *lg = malloc(2048 * sizeof *lg);
    CHECK(mla_model_forward(m, s, ok, 4, 0, MLA_LOGITS_LAST, lg, &err) == MLA_OK);
    CHECK(mla_state_n_past(s) == 4 && isfinite(lg[0]));
    CHECK(mla_model_forward(m, s, ok, 1, 4, MLA_LOGITS_LAST, lg, &err) == MLA_ERR); /* full */
    free(lg);
    mla_state_free(s);
    mla_model_free(m);
    gguf_close(g);
}

/* The CUDA latent cache's element type (mla_cuda_kv_f16): fp16 with tensor-core attention, fp32
 * with fp32 attention, MLA_CUDA_KV over both, fp32 always for odd rows, a bad value named. */
static void test_kv_type(void) {
    if (!mla_switch_dev_build()) return; /* MLA_CUDA_KV is a developer switch */
    mla_err err;
    unsetenv("MLA_CUDA_KV");
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_kv_f16(576, false, &err) == 1);
    CHECK(mla_cuda_kv_f16(576, true, &err) == 0);
    setenv("MLA_CUDA_KV", "f32", 1);
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_kv_f16(576, false, &err) == 0);
    setenv("MLA_CUDA_KV", "f16", 1);
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_kv_f16(576, true, &err) == 1);
    CHECK(mla_cuda_kv_f16(577, false, &err) == 0); /* odd rows stay fp32 */
    setenv("MLA_CUDA_KV", "q8_0", 1);
    mla_switch_reset(); /* the switches are read once */
    memset(&err, 0, sizeof err);
    CHECK(mla_cuda_kv_f16(576, false, &err) == MLA_ERR && strstr(err.msg, "MLA_CUDA_KV=q8_0") != NULL);
    unsetenv("MLA_CUDA_KV");
    mla_switch_reset(); /* the switches are read once */
}

/* The CUDA attention's kind (mla_cuda_attn_fp32): fp32 in exact mode only, MLA_CUDA_ATTN over
 * both, a bad value named. */
static void test_attn_kind(void) {
    if (!mla_switch_dev_build()) return; /* MLA_CUDA_ATTN is a developer switch */
    mla_err err;
    unsetenv("MLA_CUDA_ATTN");
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_attn_fp32(false, &err) == 0);
    CHECK(mla_cuda_attn_fp32(true, &err) == 1);
    setenv("MLA_CUDA_ATTN", "tc", 1);
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_attn_fp32(true, &err) == 0);
    setenv("MLA_CUDA_ATTN", "fp32", 1);
    mla_switch_reset(); /* the switches are read once */
    CHECK(mla_cuda_attn_fp32(false, &err) == 1);
    setenv("MLA_CUDA_ATTN", "flash", 1);
    mla_switch_reset(); /* the switches are read once */
    memset(&err, 0, sizeof err);
    CHECK(mla_cuda_attn_fp32(false, &err) == MLA_ERR && strstr(err.msg, "MLA_CUDA_ATTN=flash") != NULL);
    unsetenv("MLA_CUDA_ATTN");
    mla_switch_reset(); /* the switches are read once */
}

int main(int argc, char **argv) {
    test_routing();
    test_kv_type();
    test_attn_kind();
    if (argc > 1) {
        test_config_and_shapes(argv[1]);
        test_v3_groups(argv[1]);
        test_forward_errors(argv[1]);
    }
    return mla_test_finish();
}
