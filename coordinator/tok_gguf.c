/* tok_gguf: builds a tok_vocab from the tokenizer.ggml.* metadata of a GGUF file. */
#include <stdlib.h>
#include <string.h>

#include "common/mla_log.h"
#include "tok.h"

static int get_id(const gguf_ctx *g, const char *key, int32_t *out, mla_err *err) {
    uint32_t u;
    int rc = gguf_get_u32(g, key, &u, err);
    if (rc < 0) return rc;
    if (rc == 1) *out = (int32_t)(u > 0x7FFFFFFFu ? 0x7FFFFFFF : u);
    return MLA_OK;
}

static int get_flag(const gguf_ctx *g, const char *key, int *out, mla_err *err) {
    bool b;
    int rc = gguf_get_bool(g, key, &b, err);
    if (rc < 0) return rc;
    if (rc == 1) *out = b ? 1 : 0;
    return MLA_OK;
}

int tok_vocab_from_gguf(tok_vocab **out, const gguf_ctx *g, mla_err *err) {
    *out = NULL;
    gguf_str model, pre;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc < 0) return rc;
    if (rc == 0) return mla_errf(err, "tokenizer.ggml.model is missing: the file carries no tokenizer");
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0)
        return mla_errf(err, "tokenizer.ggml.model = \"%.*s\" is not supported (only \"gpt2\", byte-level BPE)",
                        (int)(model.len > 64 ? 64 : model.len), model.ptr);
    char pre_buf[128] = "default";
    rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (rc < 0) return rc;
    if (rc == 1) {
        if (pre.len >= sizeof pre_buf)
            return mla_errf(err, "tokenizer.ggml.pre is %llu bytes long: not a known pre-tokenizer",
                            (unsigned long long)pre.len);
        memcpy(pre_buf, pre.ptr, pre.len);
        pre_buf[pre.len] = 0;
        if (strlen(pre_buf) != pre.len) return mla_errf(err, "tokenizer.ggml.pre contains a NUL byte");
    } else {
        MLA_WARN("tokenizer.ggml.pre is missing; using \"default\" as llama.cpp does");
    }

    const gguf_value *toks, *merges, *types = NULL;
    rc = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, err);
    if (rc < 0) return rc;
    if (rc == 0) return mla_errf(err, "tokenizer.ggml.tokens is missing");
    rc = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges, err);
    if (rc < 0) return rc;
    if (rc == 0) return mla_errf(err, "tokenizer.ggml.merges is missing (needed by a gpt2 tokenizer)");
    rc = gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_VT_INT32, &types, err);
    if (rc < 0) return rc;
    if (rc == 0) types = NULL;
    size_t n = toks->v.arr.n;
    if (types && types->v.arr.n != n)
        return mla_errf(err, "tokenizer.ggml.token_type has %llu entries for %zu tokens",
                        (unsigned long long)types->v.arr.n, n);

    tok_vocab_desc d;
    tok_vocab_desc_init(&d);
    d.n_tokens = n;
    const char **tp = mla_xmalloc((n ? n : 1) * sizeof *tp);
    size_t *tl = mla_xmalloc((n ? n : 1) * sizeof *tl);
    int32_t *tt = mla_xmalloc((n ? n : 1) * sizeof *tt);
    for (size_t i = 0; i < n; i++) {
        tp[i] = toks->v.arr.items[i].v.s.ptr;
        tl[i] = toks->v.arr.items[i].v.s.len;
        tt[i] = types ? (int32_t)types->v.arr.items[i].v.i : TOK_TYPE_NORMAL;
    }
    size_t nm = merges->v.arr.n;
    const char **mp = mla_xmalloc((nm ? nm : 1) * sizeof *mp);
    size_t *ml = mla_xmalloc((nm ? nm : 1) * sizeof *ml);
    for (size_t i = 0; i < nm; i++) {
        mp[i] = merges->v.arr.items[i].v.s.ptr;
        ml[i] = merges->v.arr.items[i].v.s.len;
    }
    d.tokens = tp;
    d.token_lens = tl;
    d.token_types = tt;
    d.n_merges = nm;
    d.merges = mp;
    d.merge_lens = ml;
    d.pre = pre_buf;
    rc = MLA_OK;
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.bos_token_id", &d.bos, err);
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.eos_token_id", &d.eos, err);
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.eot_token_id", &d.eot, err);
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.eom_token_id", &d.eom, err);
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.unknown_token_id", &d.unk, err);
    if (rc == MLA_OK) rc = get_id(g, "tokenizer.ggml.padding_token_id", &d.pad, err);
    if (rc == MLA_OK) rc = get_flag(g, "tokenizer.ggml.add_bos_token", &d.add_bos, err);
    if (rc == MLA_OK) rc = get_flag(g, "tokenizer.ggml.add_eos_token", &d.add_eos, err);
    if (rc == MLA_OK) {
        /* token ids beyond the vocabulary: llama.cpp warns and keeps its default; we drop them */
        int32_t *ids[] = {&d.bos, &d.eos, &d.eot, &d.eom, &d.unk, &d.pad};
        const char *names[] = {"bos", "eos", "eot", "eom", "unknown", "padding"};
        for (int i = 0; i < 6; i++)
            if (*ids[i] >= 0 && (size_t)*ids[i] >= n) {
                MLA_WARN("tokenizer.ggml.%s_token_id = %d is outside the vocabulary (%zu tokens); ignored",
                         names[i], *ids[i], n);
                *ids[i] = -1;
            }
        rc = tok_vocab_from_arrays(out, &d, err);
    }
    free(tp);
    free(tl);
    free(tt);
    free(mp);
    free(ml);
    return rc;
}
