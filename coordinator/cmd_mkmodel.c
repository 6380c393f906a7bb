/* mlaserve mkmodel: synthetic GGUF models at real DeepSeek-V3 / GLM-5 / DeepSeek-V2-Lite / GLM-4.7-Flash shapes
 * (see cmd_mkmodel.h). */
#include "cmd_mkmodel.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/mla_log.h"
#include "common/opts.h"
#include "common/ggml_types.h"
#include "common/gguf.h"
#include "common/gguf_write.h"
#include "common/mla_err.h"
#include "coordinator/chat_toolcall.h"
#include "kernels/quant.h"

/* ---- model families (published configs) ---- */

typedef struct fam {
    const char *key, *arch, *name;
    int64_t n_layer, n_embd, n_head, q_lora, kv_lora, nope, rope, v_dim, n_ff, n_ff_exp;
    int64_t n_expert, n_used, n_group, n_group_used, n_shared, n_dense, n_vocab, ctx;
    uint32_t gating; /* 1 softmax, 2 sigmoid */
    float w_scale;
    bool w_norm;
    float rope_base, rms_eps;
    bool yarn;
    float yarn_factor;
    int64_t yarn_orig;
    float yarn_mscale_all_dim;
    int64_t idx_heads, idx_dim, idx_topk; /* DSA indexer (glm-dsa) */
    bool glm_tok;
} fam;

static const fam FAMILIES[] = {
    /* DeepSeek-V3 / R1 (HF deepseek-ai/DeepSeek-V3 config.json) */
    {"v3", "deepseek2", "DeepSeek-V3 (synthetic)", 61, 7168, 128, 1536, 512, 128, 64, 128, 18432, 2048,
     256, 8, 8, 4, 1, 3, 129280, 163840, 2, 2.5f, true, 10000.0f, 1e-6f, true, 40.0f, 4096, 1.0f, 0, 0, 0,
     false},
    /* GLM-5 (zai-org/GLM-5: 78 layers, 3 dense, dense FFN 12288, vocab 154880) */
    {"glm5", "glm-dsa", "GLM-5 (synthetic)", 78, 6144, 64, 2048, 512, 192, 64, 256, 12288, 2048, 256, 8, 1,
     1, 1, 3, 154880, 202752, 2, 2.5f, true, 1000000.0f, 1e-5f, false, 1.0f, 0, 0.0f, 32, 128, 2048, true},
    /* DeepSeek-V2-Lite (16B): no q_lora (plain attn_q), softmax routing, no weight norm */
    {"v2lite", "deepseek2", "DeepSeek-V2-Lite (synthetic)", 27, 2048, 16, 0, 512, 128, 64, 128, 10944, 1408,
     64, 6, 1, 1, 2, 1, 102400, 163840, 1, 1.0f, false, 10000.0f, 1e-6f, true, 40.0f, 4096, 0.707f, 0, 0,
     0, false},
    /* GLM-4.7-Flash (zai-org/GLM-4.7-Flash, glm4_moe_lite, written as deepseek2 like its public GGUF):
     * 47 layers (1 dense), 20 heads, q_lora 768, qk_nope 192 + qk_rope 64, v 256, 64 experts top-4
     * + 1 shared, sigmoid routing with a bias (noaux_tc), one group, routed_scaling_factor 1.8,
     * normalized top-k weights, no YaRN, GLM tokenizer */
    {"glm47flash", "deepseek2", "GLM-4.7-Flash (synthetic)", 47, 2048, 20, 768, 512, 192, 64, 256, 10240, 1536,
     64, 4, 1, 1, 1, 1, 154880, 202752, 2, 1.8f, true, 1000000.0f, 1e-5f, false, 1.0f, 0, 0.0f, 0, 0, 0, true},
};

/* ---- random numbers ---- */

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static inline float rng_unit(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); } /* [0,1) */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (z ^ (z >> 31)) | 1;
}

/* ---- tensor plan ---- */

enum init { INIT_QUANT, INIT_ONES, INIT_ZERO, INIT_UNIFORM };

typedef struct tplan {
    char name[96];
    uint32_t nd;
    int64_t ne[4];
    uint32_t type;
    enum init init;
    float std; /* target weight std (quantized and INIT_UNIFORM) */
    uint64_t bytes;
    int part;
} tplan;

typedef struct plan {
    tplan *t;
    size_t n, cap;
} plan;

static tplan *add(plan *p, uint32_t type, enum init init, float std, uint32_t nd, int64_t n0, int64_t n1, int64_t n2,
                  const char *fmt, ...) __attribute__((format(printf, 9, 10)));
static tplan *add(plan *p, uint32_t type, enum init init, float std, uint32_t nd, int64_t n0, int64_t n1, int64_t n2,
                  const char *fmt, ...) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = mla_xrealloc(p->t, p->cap * sizeof *p->t);
    }
    tplan *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->nd = nd;
    t->ne[0] = n0;
    t->ne[1] = n1;
    t->ne[2] = n2;
    t->ne[3] = 1;
    for (uint32_t i = nd; i < 4; i++) t->ne[i] = 1;
    t->type = type;
    t->init = init;
    t->std = std;
    int64_t n = n0 * (nd > 1 ? n1 : 1) * (nd > 2 ? n2 : 1);
    t->bytes = ggml_row_bytes(type, n);
    return t;
}

/* The mix's type for a weight of row length ne0: K-quants and IQ types need 256-element rows;
 * like llama-quantize, fall back to a 32-block type otherwise. */
static uint32_t fit(uint32_t want, int64_t ne0) {
    const ggml_type_info *ti = ggml_type_get(want);
    if (ne0 % ti->block_elems == 0) return want;
    switch (want) {
    case GGML_TYPE_Q4_K: return GGML_TYPE_Q5_0;
    case GGML_TYPE_Q6_K: return GGML_TYPE_Q8_0;
    default: return GGML_TYPE_Q4_0; /* IQ2_XXS, IQ3_XXS */
    }
}

typedef struct shape {
    fam f;
    uint32_t t_exp, t_dense, t_attn, t_embd;
    int64_t ff_shexp; /* the shared experts' width (n_ff_exp * n_shared, or a rank's share of it) */
} shape;

static void build_plan(const shape *s, plan *p) {
    const fam *f = &s->f;
    const int64_t E = f->n_embd, H = f->n_head, HK = f->nope + f->rope;
    const float se = 1.0f / sqrtf((float)E);
#define QW(type, n0, ...) add(p, fit(type, n0), INIT_QUANT, 1.0f / sqrtf((float)(n0)), __VA_ARGS__)
    add(p, fit(s->t_embd, E), INIT_QUANT, 1.0f, 2, E, f->n_vocab, 1, "token_embd.weight");
    for (int64_t il = 0; il < f->n_layer; il++) {
        add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, E, 1, 1, "blk.%" PRId64 ".attn_norm.weight", il);
        if (f->q_lora > 0) {
            QW(s->t_attn, E, 2, E, f->q_lora, 1, "blk.%" PRId64 ".attn_q_a.weight", il);
            add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, f->q_lora, 1, 1, "blk.%" PRId64 ".attn_q_a_norm.weight", il);
            QW(s->t_attn, f->q_lora, 2, f->q_lora, H * HK, 1, "blk.%" PRId64 ".attn_q_b.weight", il);
        } else {
            QW(s->t_attn, E, 2, E, H * HK, 1, "blk.%" PRId64 ".attn_q.weight", il);
        }
        QW(s->t_attn, E, 2, E, f->kv_lora + f->rope, 1, "blk.%" PRId64 ".attn_kv_a_mqa.weight", il);
        add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, f->kv_lora, 1, 1, "blk.%" PRId64 ".attn_kv_a_norm.weight", il);
        QW(GGML_TYPE_Q8_0, f->nope, 3, f->nope, f->kv_lora, H, "blk.%" PRId64 ".attn_k_b.weight", il);
        QW(s->t_attn, f->kv_lora, 3, f->kv_lora, f->v_dim, H, "blk.%" PRId64 ".attn_v_b.weight", il);
        QW(s->t_attn, H * f->v_dim, 2, H * f->v_dim, E, 1, "blk.%" PRId64 ".attn_output.weight", il);
        if (f->idx_heads > 0) {
            QW(s->t_attn, f->q_lora, 2, f->q_lora, f->idx_heads * f->idx_dim, 1,
               "blk.%" PRId64 ".indexer.attn_q_b.weight", il);
            QW(s->t_attn, E, 2, E, f->idx_dim, 1, "blk.%" PRId64 ".indexer.attn_k.weight", il);
            add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, f->idx_dim, 1, 1, "blk.%" PRId64 ".indexer.k_norm.weight", il);
            add(p, GGML_TYPE_F32, INIT_ZERO, 0, 1, f->idx_dim, 1, 1, "blk.%" PRId64 ".indexer.k_norm.bias", il);
            add(p, GGML_TYPE_F32, INIT_UNIFORM, se, 2, E, f->idx_heads, 1, "blk.%" PRId64 ".indexer.proj.weight", il);
        }
        add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, E, 1, 1, "blk.%" PRId64 ".ffn_norm.weight", il);
        if (il < f->n_dense) {
            QW(s->t_dense, E, 2, E, f->n_ff, 1, "blk.%" PRId64 ".ffn_gate.weight", il);
            QW(s->t_dense, E, 2, E, f->n_ff, 1, "blk.%" PRId64 ".ffn_up.weight", il);
            QW(s->t_dense, f->n_ff, 2, f->n_ff, E, 1, "blk.%" PRId64 ".ffn_down.weight", il);
        } else {
            const int64_t X = f->n_expert, F = f->n_ff_exp, S = s->ff_shexp;
            add(p, GGML_TYPE_F32, INIT_UNIFORM, se, 2, E, X, 1, "blk.%" PRId64 ".ffn_gate_inp.weight", il);
            if (f->gating == 2)
                add(p, GGML_TYPE_F32, INIT_UNIFORM, 0.01f, 1, X, 1, 1, "blk.%" PRId64 ".exp_probs_b.bias", il);
            QW(s->t_exp, E, 3, E, F, X, "blk.%" PRId64 ".ffn_gate_exps.weight", il);
            QW(s->t_exp, E, 3, E, F, X, "blk.%" PRId64 ".ffn_up_exps.weight", il);
            QW(s->t_exp, F, 3, F, E, X, "blk.%" PRId64 ".ffn_down_exps.weight", il);
            if (S > 0) {
                QW(s->t_dense, E, 2, E, S, 1, "blk.%" PRId64 ".ffn_gate_shexp.weight", il);
                QW(s->t_dense, E, 2, E, S, 1, "blk.%" PRId64 ".ffn_up_shexp.weight", il);
                QW(s->t_dense, S, 2, S, E, 1, "blk.%" PRId64 ".ffn_down_shexp.weight", il);
            }
        }
    }
    add(p, GGML_TYPE_F32, INIT_ONES, 0, 1, E, 1, 1, "output_norm.weight");
    add(p, fit(s->t_embd, E), INIT_QUANT, se, 2, E, f->n_vocab, 1, "output.weight");
#undef QW
}

/* ---- random blocks ---- */

static inline void put_h(uint8_t *b, float v) {
    uint16_t h = quant_f32_to_fp16(v);
    memcpy(b, &h, 2);
}

/* Sets the scale fields of a block filled with random bytes so that its values have roughly
 * the standard deviation std (random quant bits, fp16 scales within +-25 % of that). */
static void fix_block(uint32_t type, uint8_t *b, float std, rng *r) {
    float jit = 0.75f + 0.5f * rng_unit(r);
    switch (type) {
    case GGML_TYPE_Q8_0: put_h(b, std * jit / 73.9f); break;
    case GGML_TYPE_Q4_0: put_h(b, std * jit / 4.6f); break;
    case GGML_TYPE_Q5_0: put_h(b, std * jit / 9.2f); break;
    case GGML_TYPE_Q4_K: {
        /* 8 sub-block scales v in [32, 63] used as both scale and min, dmin = 7.5 d: values
         * d v (q - 7.5), centred. */
        uint8_t v[8];
        for (int j = 0; j < 8; j++) v[j] = (uint8_t)(32 + (rng_next(r) >> 59));
        uint8_t *sc = b + 4;
        for (int j = 0; j < 4; j++) {
            sc[j] = (uint8_t)(v[j] | ((v[j + 4] >> 4) << 6));
            sc[j + 4] = sc[j];
            sc[j + 8] = (uint8_t)((v[j + 4] & 15) | ((v[j + 4] & 15) << 4));
        }
        float d = std * jit / (4.6f * 47.5f);
        put_h(b, d);
        put_h(b + 2, 7.5f * d);
        break;
    }
    case GGML_TYPE_Q6_K: {
        int8_t *sc = (int8_t *)(b + 192);
        for (int j = 0; j < 16; j++) {
            int v = 16 + (int)(rng_next(r) >> 58); /* 16..79, clamp */
            if (v > 63) v = 63;
            sc[j] = (int8_t)((rng_next(r) & 1) ? v : -v);
        }
        put_h(b + 208, std * jit / (18.5f * 40.0f));
        break;
    }
    case GGML_TYPE_IQ2_XXS: put_h(b, std * jit / 56.0f); break;
    case GGML_TYPE_IQ3_XXS: put_h(b, std * jit / 120.0f); break;
    default: MLA_PANIC("mkmodel: no random block writer for type %s", ggml_type_name(type));
    }
}

/* Tensor data is generated in sub-chunks of about 1 MiB (whole blocks), each with its own
 * random stream seeded by (seed, tensor, sub-chunk): the bytes do not depend on the number of
 * threads. A round fills up to ROUND_SUBS sub-chunks in parallel, then writes them in order. */
#define SUB_BYTES (1u << 20)
#define ROUND_SUBS 64

typedef struct gen_job {
    const tplan *t;
    uint64_t seed;
    size_t idx;
    uint8_t *buf;       /* ROUND_SUBS sub-chunks, sub k at buf + k * sub_bytes */
    size_t sub_bytes;   /* bytes of a full sub-chunk */
    size_t unit;        /* block (or element) bytes */
    uint64_t first_sub; /* global index of the round's first sub-chunk */
    size_t n_sub;
    size_t last_bytes;  /* bytes of the round's last sub-chunk */
    int n_thr, thr;
} gen_job;

static void gen_sub(const gen_job *j, size_t k) {
    const tplan *t = j->t;
    uint8_t *b = j->buf + k * j->sub_bytes;
    size_t nbytes = k + 1 == j->n_sub ? j->last_bytes : j->sub_bytes;
    rng r = {mix64(j->seed ^ mix64((uint64_t)j->idx + 1) ^ mix64((j->first_sub + k) * 0x9E3779B97F4A7C15ULL + 7))};
    if (t->type == GGML_TYPE_F32) {
        float *f = (float *)(void *)b;
        const float a = t->std * 1.7320508f; /* uniform [-a, a] has std a / sqrt(3) */
        for (size_t i = 0; i < nbytes / sizeof(float); i++) {
            switch (t->init) {
            case INIT_ONES: f[i] = 1.0f + 0.05f * (2.0f * rng_unit(&r) - 1.0f); break;
            case INIT_ZERO: f[i] = 0.0f; break;
            default: f[i] = a * (2.0f * rng_unit(&r) - 1.0f); break;
            }
        }
        return;
    }
    size_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        uint64_t x = rng_next(&r);
        memcpy(b + i, &x, 8);
    }
    if (i < nbytes) {
        uint64_t x = rng_next(&r);
        memcpy(b + i, &x, nbytes - i);
    }
    for (size_t o = 0; o < nbytes; o += j->unit) fix_block(t->type, b + o, t->std, &r);
}

static void *gen_thread(void *arg) {
    const gen_job *j = arg;
    for (size_t k = (size_t)j->thr; k < j->n_sub; k += (size_t)j->n_thr) gen_sub(j, k);
    return NULL;
}

static int write_tensor(gguf_writer *w, const tplan *t, uint64_t seed, size_t idx, uint8_t *buf, int n_thr,
                        mla_err *err) {
    size_t unit = t->type == GGML_TYPE_F32 ? sizeof(float) : ggml_type_get(t->type)->block_bytes;
    size_t sub = SUB_BYTES / unit * unit;
    uint64_t left = t->bytes, first = 0;
    while (left) {
        gen_job base = {.t = t, .seed = seed, .idx = idx, .buf = buf, .sub_bytes = sub, .unit = unit,
                        .first_sub = first};
        uint64_t round = (uint64_t)sub * ROUND_SUBS;
        if (round > left) round = left;
        base.n_sub = (size_t)((round + sub - 1) / sub);
        base.last_bytes = (size_t)(round - (uint64_t)(base.n_sub - 1) * sub);
        int nt = n_thr < (int)base.n_sub ? n_thr : (int)base.n_sub;
        gen_job jobs[64];
        pthread_t th[64];
        int started = 0;
        for (int i = 0; i < nt; i++) {
            jobs[i] = base;
            jobs[i].n_thr = nt;
            jobs[i].thr = i;
        }
        for (int i = 1; i < nt; i++)
            if (pthread_create(&th[i], NULL, gen_thread, &jobs[i]) == 0) started = i;
            else break;
        if (started + 1 < nt) { /* could not start them all: the caller's thread does the rest */
            for (int i = started + 1; i < nt; i++) gen_thread(&jobs[i]);
        }
        gen_thread(&jobs[0]);
        for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
        if (gguf_write_data(w, buf, (size_t)round, err) < 0) return MLA_ERR;
        left -= round;
        first += base.n_sub;
    }
    return MLA_OK;
}

/* ---- tokenizer: 256 byte tokens (GPT-2 byte-to-unicode), space-prefixed letter words built by merges,
 * special tokens ---- */

typedef struct vocab {
    char **tok;
    int32_t *type;
    char **merges;
    size_t n, n_merges;
    int64_t bos, eos, eot, eom, unk;
} vocab;

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 63));
    o[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to 256+. */
static uint32_t byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return (uint32_t)(256 + n);
}

static void vocab_push(vocab *v, const char *s, int32_t type) {
    v->tok[v->n] = mla_xstrdup(s);
    v->type[v->n] = type;
    v->n++;
}

static void build_vocab(vocab *v, int64_t n_vocab, bool glm) {
    static const char *const ds_head[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"};
    /* the chat and tool-call markers of the real vocabularies, control tokens as there */
    static const char *const ds_tail[] = {"<｜User｜>",           "<｜Assistant｜>",   "<think>",
                                          "</think>",            TOOLCALL_DS_CALLS_BEGIN, TOOLCALL_DS_CALLS_END,
                                          TOOLCALL_DS_CALL_BEGIN, TOOLCALL_DS_CALL_END,   TOOLCALL_DS_SEP};
    static const char *const glm_tail[] = {"<|endoftext|>",       "[MASK]",
                                           "[gMASK]",             "[sMASK]",
                                           "<sop>",               "<eop>",
                                           "<|system|>",          "<|user|>",
                                           "<|assistant|>",       "<|observation|>",
                                           "<think>",             "</think>",
                                           TOOLCALL_GLM_CALL_BEGIN, TOOLCALL_GLM_CALL_END,
                                           TOOLCALL_GLM_KEY_BEGIN,  TOOLCALL_GLM_KEY_END,
                                           TOOLCALL_GLM_VAL_BEGIN,  TOOLCALL_GLM_VAL_END};
    const char *const *head = glm ? NULL : ds_head;
    const char *const *tail = glm ? glm_tail : ds_tail;
    size_t n_head = glm ? 0 : 3, n_tail = glm ? sizeof glm_tail / sizeof *glm_tail : sizeof ds_tail / sizeof *ds_tail;
    MLA_ASSERT(n_vocab >= (int64_t)(n_head + n_tail + 256 + 26));
    memset(v, 0, sizeof *v);
    v->tok = mla_xcalloc((size_t)n_vocab, sizeof *v->tok);
    v->type = mla_xcalloc((size_t)n_vocab, sizeof *v->type);
    size_t n_merge = (size_t)n_vocab - n_head - n_tail - 256;
    v->merges = mla_xcalloc(n_merge, sizeof *v->merges);
    for (size_t i = 0; i < n_head; i++) vocab_push(v, head[i], 3);
    char s[64], m[128];
    for (int b = 0; b < 256; b++) {
        size_t k = utf8_put(s, byte_cp(b));
        s[k] = 0;
        vocab_push(v, s, 1);
    }
    /* words with a leading space, as most of a real vocabulary: level 2 "Ġx", level k+1 every
     * level-k word followed by a letter. Each merge joins the previous level's word with one
     * letter, so ranks grow with length and " word" tokenizes to one token when it is in the
     * vocabulary (no shorter merge inside the word competes with the left-to-right chain). */
    size_t lvl_begin = v->n, made = 0;
    for (int y = 0; y < 26 && made < n_merge; y++) {
        snprintf(s, sizeof s, "\xC4\xA0%c", 'a' + y);
        snprintf(m, sizeof m, "\xC4\xA0 %c", 'a' + y);
        vocab_push(v, s, 1);
        v->merges[made++] = mla_xstrdup(m);
    }
    while (made < n_merge) {
        size_t lvl_end = v->n;
        for (size_t i = lvl_begin; i < lvl_end && made < n_merge; i++)
            for (int y = 0; y < 26 && made < n_merge; y++) {
                snprintf(s, sizeof s, "%s%c", v->tok[i], 'a' + y);
                snprintf(m, sizeof m, "%s %c", v->tok[i], 'a' + y);
                vocab_push(v, s, 1);
                v->merges[made++] = mla_xstrdup(m);
            }
        lvl_begin = lvl_end;
    }
    v->n_merges = made;
    size_t tail0 = v->n;
    for (size_t i = 0; i < n_tail; i++) vocab_push(v, tail[i], 3);
    MLA_ASSERT(v->n == (size_t)n_vocab);
    if (glm) {
        v->eos = (int64_t)tail0;      /* <|endoftext|> */
        v->bos = (int64_t)tail0 + 2;  /* [gMASK] */
        v->eot = (int64_t)tail0 + 7;  /* <|user|> */
        v->eom = (int64_t)tail0 + 9;  /* <|observation|> */
        v->unk = v->eos;
    } else {
        v->bos = 0;
        v->eos = 1;
        v->eot = v->eom = v->unk = -1;
    }
}

static void free_vocab(vocab *v) {
    for (size_t i = 0; i < v->n; i++) free(v->tok[i]);
    for (size_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
}

/* ---- metadata ---- */

static uint32_t file_type(const char *mix) {
    if (!strcmp(mix, "iq2")) return 19; /* LLAMA_FTYPE_MOSTLY_IQ2_XXS */
    if (!strcmp(mix, "iq3")) return 23; /* LLAMA_FTYPE_MOSTLY_IQ3_XXS */
    return 15;                          /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
}

static void write_meta(gguf_writer *w, const shape *s, const vocab *v, const char *mix) {
    const fam *f = &s->f;
    char k[128];
#define K(suffix) (snprintf(k, sizeof k, "%s.%s", f->arch, suffix), k)
    gguf_write_kv_str(w, "general.architecture", f->arch);
    gguf_write_kv_str(w, "general.type", "model");
    gguf_write_kv_str(w, "general.name", f->name);
    gguf_write_kv_u32(w, "general.quantization_version", 2);
    gguf_write_kv_u32(w, "general.file_type", file_type(mix));
    gguf_write_kv_u32(w, K("block_count"), (uint32_t)f->n_layer);
    gguf_write_kv_u32(w, K("context_length"), (uint32_t)f->ctx);
    gguf_write_kv_u32(w, K("embedding_length"), (uint32_t)f->n_embd);
    gguf_write_kv_u32(w, K("feed_forward_length"), (uint32_t)f->n_ff);
    gguf_write_kv_u32(w, K("attention.head_count"), (uint32_t)f->n_head);
    gguf_write_kv_u32(w, K("attention.head_count_kv"), 1);
    gguf_write_kv_f32(w, K("rope.freq_base"), f->rope_base);
    gguf_write_kv_f32(w, K("attention.layer_norm_rms_epsilon"), f->rms_eps);
    gguf_write_kv_u32(w, K("expert_count"), (uint32_t)f->n_expert);
    gguf_write_kv_u32(w, K("expert_used_count"), (uint32_t)f->n_used);
    gguf_write_kv_u32(w, K("expert_group_count"), (uint32_t)f->n_group);
    gguf_write_kv_u32(w, K("expert_group_used_count"), (uint32_t)f->n_group_used);
    gguf_write_kv_u32(w, K("attention.key_length"), (uint32_t)(f->kv_lora + f->rope));
    gguf_write_kv_u32(w, K("attention.value_length"), (uint32_t)f->kv_lora);
    gguf_write_kv_u32(w, K("leading_dense_block_count"), (uint32_t)f->n_dense);
    gguf_write_kv_u32(w, K("vocab_size"), (uint32_t)f->n_vocab);
    /* written even when 0 (V2-Lite): llama.cpp infers "lite" (plain attn_q) from 26/27 layers
     * only and otherwise requires the key */
    gguf_write_kv_u32(w, K("attention.q_lora_rank"), (uint32_t)f->q_lora);
    gguf_write_kv_u32(w, K("attention.kv_lora_rank"), (uint32_t)f->kv_lora);
    gguf_write_kv_u32(w, K("attention.key_length_mla"), (uint32_t)(f->nope + f->rope));
    gguf_write_kv_u32(w, K("attention.value_length_mla"), (uint32_t)f->v_dim);
    gguf_write_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)f->n_ff_exp);
    gguf_write_kv_u32(w, K("expert_shared_count"), (uint32_t)f->n_shared);
    /* a rank's share of the shared experts (--rank-of) is not n_ff_exp * n_shared: say it */
    if (s->ff_shexp != f->n_ff_exp * f->n_shared)
        gguf_write_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)s->ff_shexp);
    gguf_write_kv_f32(w, K("expert_weights_scale"), f->w_scale);
    gguf_write_kv_bool(w, K("expert_weights_norm"), f->w_norm);
    gguf_write_kv_u32(w, K("expert_gating_func"), f->gating);
    gguf_write_kv_u32(w, K("rope.dimension_count"), (uint32_t)f->rope);
    if (f->yarn) {
        gguf_write_kv_str(w, K("rope.scaling.type"), "yarn");
        gguf_write_kv_f32(w, K("rope.scaling.factor"), f->yarn_factor);
        gguf_write_kv_u32(w, K("rope.scaling.original_context_length"), (uint32_t)f->yarn_orig);
        gguf_write_kv_f32(w, K("rope.scaling.yarn_beta_fast"), 32.0f);
        gguf_write_kv_f32(w, K("rope.scaling.yarn_beta_slow"), 1.0f);
        gguf_write_kv_f32(w, K("rope.scaling.yarn_log_multiplier"), 0.1f * f->yarn_mscale_all_dim);
    }
    if (f->idx_heads > 0) {
        gguf_write_kv_u32(w, K("attention.indexer.head_count"), (uint32_t)f->idx_heads);
        gguf_write_kv_u32(w, K("attention.indexer.key_length"), (uint32_t)f->idx_dim);
        gguf_write_kv_u32(w, K("attention.indexer.top_k"), (uint32_t)f->idx_topk);
        bool *full = mla_xmalloc((size_t)f->n_layer * sizeof *full);
        for (int64_t i = 0; i < f->n_layer; i++) full[i] = true;
        gguf_write_kv_arr_bool(w, K("attention.indexer.types"), full, (size_t)f->n_layer);
        free(full);
    }
#undef K
    gguf_write_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_write_kv_str(w, "tokenizer.ggml.pre", f->glm_tok ? "glm4" : "deepseek-v3");
    gguf_write_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->n);
    gguf_write_kv_arr_i32(w, "tokenizer.ggml.token_type", v->type, v->n);
    gguf_write_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->n_merges);
    gguf_write_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    gguf_write_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->eot >= 0) gguf_write_kv_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->eot);
    if (v->unk >= 0) gguf_write_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
    if (v->eom >= 0) gguf_write_kv_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)v->eom);
    gguf_write_kv_str(w, "tokenizer.chat_template",
                      f->glm_tok ? "[gMASK]<sop>{% for m in messages %}{% if m['role'] == 'user' %}<|user|>\n"
                                   "{{ m['content'] }}{% elif m['role'] == 'assistant' %}<|assistant|>\n"
                                   "{{ m['content'] }}{% else %}<|system|>\n{{ m['content'] }}{% endif %}"
                                   "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
                                 : "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                                   "<｜User｜>{{ m['content'] }}{% elif m['role'] == 'assistant' %}"
                                   "<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% else %}"
                                   "{{ m['content'] }}{% endif %}{% endfor %}"
                                   "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}");
}

/* ---- one rank of a tensor-parallel deployment (--rank-of N) ---- */

/* Whether our tensor parallelism splits an FFN of width F over N ranks (common/shard_plan.c:
 * F % N == 0 and the share does not cut the down projection's quant blocks); else rank 0 holds
 * and computes it whole. */
static bool ffn_splits(uint32_t t_dense, int64_t F, int64_t N) {
    const ggml_type_info *ti = ggml_type_get(fit(t_dense, F));
    return F % N == 0 && (F / N) % (int64_t)ti->block_elems == 0;
}

/* Turns the shape into what rank 0 of a TP-N deployment holds (common/shard_plan.h has the
 * rules), as a model that runs at TP 1. used_o > 0 sets the top-k. Returns 0, or -1 with a
 * message on stderr. Prints what was divided and what was kept to stderr. */
static int rank_share(shape *s, int64_t N, int64_t used_o) {
    static char name[128];
    fam *f = &s->f;
    if (f->n_head % N) {
        fprintf(stderr, "mkmodel: --rank-of %lld does not divide the %lld heads (our TP needs whole heads)\n",
                (long long)N, (long long)f->n_head);
        return -1;
    }
    const int64_t H = f->n_head, X = f->n_expert, K = f->n_used, V = f->n_vocab, FF = f->n_ff, S = s->ff_shexp;
    f->n_head = H / N;
    f->n_expert = (X + N - 1) / N; /* rank 0 owns experts e with e % N == 0 */
    f->n_used = used_o > 0 ? used_o : (K + N - 1) / N;
    if (f->n_used > f->n_expert) f->n_used = f->n_expert;
    const bool ff_split = ffn_splits(s->t_dense, FF, N), sh_split = S > 0 && ffn_splits(s->t_dense, S, N);
    if (ff_split) f->n_ff = FF / N;
    if (sh_split) s->ff_shexp = S / N;
    const bool v_split = V % N == 0;
    if (v_split) f->n_vocab = V / N;
    if (f->n_expert % f->n_group || f->n_group_used * (f->n_expert / f->n_group) < f->n_used) {
        f->n_group = 1;
        f->n_group_used = 1;
    }
    snprintf(name, sizeof name, "%s, rank of %lld", f->name, (long long)N);
    f->name = name;
    fprintf(stderr,
            "mkmodel: rank 0 of TP %lld: heads %lld -> %lld; routed experts %lld -> %lld, top-%lld -> top-%lld%s; "
            "dense FFN %lld -> %lld%s; shared expert %lld -> %lld%s; output head vocab %lld -> %lld%s; "
            "routing groups %lld (top %lld); q_a, kv_a, norms and the DSA indexer whole (replicated)\n",
            (long long)N, (long long)H, (long long)f->n_head, (long long)X, (long long)f->n_expert, (long long)K,
            (long long)f->n_used, used_o > 0 ? " (--experts-used)" : " (a rank's mean share of a token's experts)",
            (long long)FF, (long long)f->n_ff, ff_split ? "" : " (whole: a share would cut quant blocks, rank 0 computes it)",
            (long long)S, (long long)s->ff_shexp, sh_split || S == 0 ? "" : " (whole: a share would cut quant blocks)",
            (long long)V, (long long)f->n_vocab, v_split ? " (the embedding shrinks with it: decode reads rows)" : " (whole: replicated)",
            (long long)f->n_group, (long long)f->n_group_used);
    return 0;
}

/* ---- command ---- */

static const char mkmodel_usage[] =
    "usage: mlaserve mkmodel --family v3|glm5|v2lite|glm47flash -o OUT.gguf [options]\n"
    "A synthetic model at real shapes with random weights: experts Q4_K / IQ2_XXS / IQ3_XXS (--mix),\n"
    "attention Q8_0, embeddings and output Q6_K, dense FFN and shared experts Q4_K, norms and router F32.\n"
    "--rank-of N writes what rank 0 of a TP-N deployment holds (common/shard_plan.h), as a model that\n"
    "runs at TP 1: divided by N are the attention heads (q_b, k_b, v_b, attn_output's inputs), the\n"
    "routed experts (rank 0's ceil(X/N)), the dense FFN and shared-expert widths (kept whole where a\n"
    "share would cut quant blocks: our TP then computes them on rank 0 alone) and the output head's\n"
    "vocabulary rows (when N divides it; the embedding and tokenizer shrink with it, decode reads only\n"
    "rows of the embedding). Whole, as every rank holds them: q_a, kv_a, the norms, the DSA indexer.\n"
    "Top-k becomes ceil(k/N), the experts a rank computes for a token on average (--experts-used\n"
    "sets it); the router has the rank's experts' rows only (a real rank holds all X rows, F32 in the\n"
    "file: (X - X/N)*hidden*4 bytes a MoE layer more). The all-reduces and the logits' all-gather are not in the file's step.\n";

static int parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    else if (*end == 'T' || *end == 't') mul = 1099511627776.0, end++;
    if (*end) return -1;
    *out = (uint64_t)(v * mul);
    return 0;
}

static int opt_size(void *ctx, const char *v, mla_err *err) {
    if (parse_size(v, ctx) < 0) return mla_errf(err, "'%s' is not a size (e.g. 48G)", v);
    return MLA_OK;
}

int cmd_mkmodel(int argc, char **argv) {
    const char *family = NULL, *outp = NULL, *mix = "q4k";
    long rank_of = 1, used_o = -1;
    long n_thr64 = 0, layers = -1, vocab_o = -1, hidden_o = -1, heads_o = -1, experts_o = -1, ff_o = -1, ffe_o = -1;
    uint64_t split = 48ull << 30, seed = 1;
    int small_f = 0, dry_f = 0;
    const double big = 1e12;
    const opt_spec specs[] = {
        {.name = "--family", .kind = OPT_STR, .arg = "v3|glm5|v2lite|glm47flash", .help = "the model family (required)", .dest = &family},
        {.name = "--out", .alias = "-o", .kind = OPT_STR, .arg = "OUT.gguf", .help = "where to write (required unless --dry-run; each file, or each part of a split model, written "
                 "whole or not at all: a run that fails leaves that file as it was)",
         .dest = &outp},
        {.name = "--layers", .kind = OPT_LONG, .arg = "N", .def = "the real count",
         .help = "blocks; the leading dense layers are kept", .dest = &layers, .lo = 1, .hi = big},
        {.name = "--mix", .kind = OPT_STR, .arg = "q4k|iq2|iq3", .def = "q4k", .help = "the experts' type", .dest = &mix},
        {.name = "--split-size", .kind = OPT_FN, .arg = "SIZE", .def = "48G",
         .help = "split into NAME-0000i-of-0000N.gguf parts of at most SIZE bytes (K/M/G/T; 0: one file)", .fn = opt_size,
         .ctx = &split},
        {.name = "--seed", .kind = OPT_U64, .arg = "S", .def = "1", .help = "random seed (the bytes do not depend on --threads)",
         .dest = &seed, .lo = 0, .hi = 9.2e18},
        {.name = "--threads", .kind = OPT_LONG, .arg = "N", .def = "every CPU", .help = "generator threads",
         .dest = &n_thr64, .lo = 1, .hi = 4096},
        {.name = "--small", .kind = OPT_FLAG,
         .help = "test-sized widths (hidden 1024, 16 heads, vocab 4096, 16 experts, FFN 1024, expert FFN 256/352)",
         .dest = &small_f},
        {.name = "--vocab", .kind = OPT_LONG, .arg = "N", .help = "vocabulary override", .dest = &vocab_o, .lo = 1, .hi = big},
        {.name = "--hidden", .kind = OPT_LONG, .arg = "N", .help = "hidden size override", .dest = &hidden_o, .lo = 1, .hi = big},
        {.name = "--heads", .kind = OPT_LONG, .arg = "N", .help = "attention heads override", .dest = &heads_o, .lo = 1, .hi = big},
        {.name = "--experts", .kind = OPT_LONG, .arg = "N", .help = "routed experts override", .dest = &experts_o, .lo = 1,
         .hi = big},
        {.name = "--ff", .kind = OPT_LONG, .arg = "N", .help = "dense FFN width override", .dest = &ff_o, .lo = 1, .hi = big},
        {.name = "--ff-exp", .kind = OPT_LONG, .arg = "N", .help = "expert FFN width override", .dest = &ffe_o, .lo = 1,
         .hi = big},
        {.name = "--rank-of", .kind = OPT_LONG, .arg = "N", .def = "1",
         .help = "what one rank of TP N holds, as a TP-1 model (heads, experts, FFN widths, output vocab / N; above)",
         .dest = &rank_of, .lo = 1, .hi = 64},
        {.name = "--experts-used", .kind = OPT_LONG, .arg = "K", .def = "the family's top-k (ceil(k/N) with --rank-of)",
         .help = "experts a token uses", .dest = &used_o, .lo = 1, .hi = 1024},
        {.name = "--dry-run", .kind = OPT_FLAG, .help = "print the plan and sizes, write nothing", .dest = &dry_f},
        MLA_LOG_LEVEL_OPT_SOLO,
    };
    const opt_table tab = {"options", specs, sizeof specs / sizeof *specs};
    int st = opts_command("mlaserve mkmodel", mkmodel_usage, &tab, 1, argc, argv, NULL, 0, NULL);
    if (st >= 0) return st;
    const bool small = small_f, dry = dry_f;
    if (!family || (!outp && !dry)) {
        fprintf(stderr, "mlaserve mkmodel: --family and -o are required (--help lists the options)\n");
        return 2;
    }
    shape s;
    memset(&s, 0, sizeof s);
    const fam *fp = NULL;
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (!strcmp(FAMILIES[i].key, family)) fp = &FAMILIES[i];
    if (!fp) {
        fprintf(stderr, "mkmodel: unknown family '%s' (v3, glm5, v2lite, glm47flash)\n", family);
        return 2;
    }
    s.f = *fp;
    fam *f = &s.f;
    if (!strcmp(mix, "q4k")) s.t_exp = GGML_TYPE_Q4_K;
    else if (!strcmp(mix, "iq2")) s.t_exp = GGML_TYPE_IQ2_XXS;
    else if (!strcmp(mix, "iq3")) s.t_exp = GGML_TYPE_IQ3_XXS;
    else {
        fprintf(stderr, "mkmodel: unknown mix '%s' (q4k, iq2, iq3)\n", mix);
        return 2;
    }
    s.t_dense = GGML_TYPE_Q4_K;
    s.t_attn = GGML_TYPE_Q8_0;
    s.t_embd = GGML_TYPE_Q6_K;
    if (small) {
        f->n_embd = 1024;
        f->n_head = 16;
        f->n_vocab = 4096;
        f->n_expert = 16;
        f->n_ff = 1024;
        f->n_ff_exp = !strcmp(f->key, "v2lite") ? 352 : 256;
    }
    if (vocab_o > 0) f->n_vocab = vocab_o;
    if (hidden_o > 0) f->n_embd = hidden_o;
    if (heads_o > 0) f->n_head = heads_o;
    if (experts_o > 0) f->n_expert = experts_o;
    if (ff_o > 0) f->n_ff = ff_o;
    if (ffe_o > 0) f->n_ff_exp = ffe_o;
    if (layers > 0) f->n_layer = layers;
    if (f->n_dense > f->n_layer) f->n_dense = f->n_layer;
    s.ff_shexp = f->n_ff_exp * f->n_shared;
    if (rank_of > 1) {
        if (rank_share(&s, rank_of, used_o) < 0) return 2;
    } else if (used_o > 0) {
        f->n_used = used_o;
    }
    if (f->n_embd % 256) {
        fprintf(stderr, "mkmodel: hidden size %lld must be a multiple of 256 (K-quant rows)\n", (long long)f->n_embd);
        return 2;
    }
    if (f->n_ff % 32 || f->n_ff_exp % 32 || s.ff_shexp % 32) {
        fprintf(stderr, "mkmodel: FFN sizes must be multiples of 32\n");
        return 2;
    }
    if (f->n_vocab < 512) {
        fprintf(stderr, "mkmodel: vocab %lld is too small for the generated tokenizer (>= 512)\n",
                (long long)f->n_vocab);
        return 2;
    }
    if (f->n_used > f->n_expert || f->n_expert % f->n_group ||
        (f->n_group > 1 && f->n_group_used * (f->n_expert / f->n_group) < f->n_used)) {
        fprintf(stderr, "mkmodel: %lld experts cannot serve top-%lld routing in %lld groups (%lld used)\n",
                (long long)f->n_expert, (long long)f->n_used, (long long)f->n_group, (long long)f->n_group_used);
        return 2;
    }

    int n_thr = (int)n_thr64;
    if (n_thr <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_thr = nc < 1 ? 1 : (int)nc;
    }
    if (n_thr > 64) n_thr = 64;
    plan p = {0};
    build_plan(&s, &p);
    /* parts: greedy in file order */
    int n_parts = 1;
    uint64_t cur = 0, total = 0;
    for (size_t i = 0; i < p.n; i++) {
        uint64_t b = (p.t[i].bytes + 31) / 32 * 32;
        if (split && cur > 0 && cur + b > split) {
            n_parts++;
            cur = 0;
        }
        p.t[i].part = n_parts - 1;
        cur += b;
        total += b;
    }
    fprintf(stderr,
            "mkmodel: %s (%s), %lld layers (%lld dense), hidden %lld, %lld heads, vocab %lld, %lld experts "
            "top-%lld, mix %s: %zu tensors, %.2f GiB in %d part(s)\n",
            f->name, f->arch, (long long)f->n_layer, (long long)f->n_dense, (long long)f->n_embd,
            (long long)f->n_head, (long long)f->n_vocab, (long long)f->n_expert, (long long)f->n_used, mix, p.n,
            (double)total / 1073741824.0, n_parts);
    if (dry) {
        for (size_t i = 0; i < p.n; i++)
            if (strncmp(p.t[i].name, "blk.", 4) != 0 || atoll(p.t[i].name + 4) == 0 ||
                atoll(p.t[i].name + 4) == f->n_dense)
                printf("%-40s %-8s [%lld, %lld, %lld] %.1f MiB part %d\n", p.t[i].name, ggml_type_name(p.t[i].type),
                       (long long)p.t[i].ne[0], (long long)p.t[i].ne[1], (long long)p.t[i].ne[2],
                       (double)p.t[i].bytes / 1048576.0, p.t[i].part + 1);
        free(p.t);
        return 0;
    }

    vocab v;
    build_vocab(&v, f->n_vocab, f->glm_tok);
    size_t plen = strlen(outp);
    size_t stem = plen > 5 && !strcmp(outp + plen - 5, ".gguf") ? plen - 5 : plen;
    char *path = mla_xmalloc(plen + 32);
    uint8_t *buf = mla_xmalloc((size_t)SUB_BYTES * ROUND_SUBS);
    mla_err err = {0};
    int rc = MLA_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t ti = 0;
    for (int part = 0; part < n_parts && rc == MLA_OK; part++) {
        if (n_parts > 1) snprintf(path, plen + 32, "%.*s-%05d-of-%05d.gguf", (int)stem, outp, part + 1, n_parts);
        else snprintf(path, plen + 32, "%s", outp);
        gguf_writer *w;
        if ((rc = gguf_write_open(&w, path, &err)) < 0) break;
        if (part == 0) write_meta(w, &s, &v, mix);
        if (n_parts > 1) {
            gguf_write_kv_u16(w, "split.no", (uint16_t)part);
            gguf_write_kv_u16(w, "split.count", (uint16_t)n_parts);
            gguf_write_kv_i32(w, "split.tensors.count", (int32_t)p.n);
        }
        size_t first = ti;
        for (size_t i = ti; i < p.n && p.t[i].part == part && rc == MLA_OK; i++)
            rc = gguf_write_add_tensor(w, p.t[i].name, p.t[i].nd, p.t[i].ne, p.t[i].type, &err);
        if (rc == MLA_OK) rc = gguf_write_begin_data(w, &err);
        for (ti = first; ti < p.n && p.t[ti].part == part && rc == MLA_OK; ti++)
            rc = write_tensor(w, &p.t[ti], seed, ti, buf, n_thr, &err);
        if (rc == MLA_OK) {
            rc = gguf_write_close(w, &err);
        } else {
            gguf_write_abort(w);
        }
        if (rc == MLA_OK) fprintf(stderr, "mkmodel: wrote %s\n", path);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == MLA_OK) {
        double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "mkmodel: %.2f GiB in %.1f s (%.2f GiB/s)\n", (double)total / 1073741824.0, sec,
                sec > 0 ? (double)total / 1073741824.0 / sec : 0.0);
        /* read it back: header, metadata and tensor index of every part */
        if (n_parts > 1) snprintf(path, plen + 32, "%.*s-%05d-of-%05d.gguf", (int)stem, outp, 1, n_parts);
        gguf_ctx *g;
        rc = gguf_open(&g, path, &err);
        if (rc == MLA_OK) {
            if (gguf_n_tensors(g) != p.n) rc = mla_errf(&err, "%s: reads back %zu tensors, wrote %zu", path,
                                                        gguf_n_tensors(g), p.n);
            gguf_close(g);
        }
    }
    if (rc != MLA_OK) fprintf(stderr, "mkmodel: %s\n", err.msg);
    free(buf);
    free(path);
    free_vocab(&v);
    free(p.t);
    return rc == MLA_OK ? 0 : 1;
}
