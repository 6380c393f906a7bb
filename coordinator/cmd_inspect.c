/* mlaserve inspect MODEL.gguf [--tp N] [--json]: what a model is and how it would be split.
 * Prints the architecture, every hyperparameter the forward pass uses (and the defaults that
 * were assumed for missing keys), the tokenizer and chat template, the tensor table grouped by
 * role with its quant types, and the tensor-parallel plan for N ranks: validity with reasons,
 * fallbacks, total and per-rank memory. The plan is common/shard_plan, the same code the
 * workers load their shards with. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cmds.h"
#include "common/gguf.h"
#include "common/mla_log.h"
#include "common/opts.h"
#include "common/model_config.h"
#include "wire.h"
#include "common/shard_plan.h"
#include "kernels/cuda_types.h"
#include "tok.h"

typedef struct role_sum {
    int count;
    uint64_t bytes;
    int type_count[GGML_TYPE_COUNT];
} role_sum;

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }
static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", gib(b));
    else
        snprintf(buf, n, "%.2f MiB", mib(b));
}

static void add_hparams(cJSON *o, const mla_config *c) {
    cJSON_AddStringToObject(o, "architecture", c->arch_name);
#define NUM(k, v) cJSON_AddNumberToObject(o, k, (double)(v))
    NUM("n_layer", c->n_layer);
    NUM("n_layer_file", c->n_layer_file);
    NUM("n_nextn_layers", c->n_nextn);
    NUM("n_embd", c->n_embd);
    NUM("n_vocab", c->n_vocab);
    NUM("n_head", c->n_head);
    NUM("n_ff", c->n_ff);
    NUM("n_ff_exp", c->n_ff_exp);
    NUM("rms_eps", c->rms_eps);
    NUM("q_lora_rank", c->q_lora_rank);
    NUM("kv_lora_rank", c->kv_lora_rank);
    NUM("head_k", c->head_k);
    NUM("head_nope", c->head_nope);
    NUM("head_rope", c->n_rope);
    NUM("head_v", c->head_v);
    NUM("rope_base", c->rope_base);
    cJSON_AddBoolToObject(o, "yarn", c->yarn);
    if (c->yarn) {
        NUM("yarn_factor", c->yarn_factor);
        NUM("yarn_orig_ctx", c->yarn_orig_ctx);
        NUM("yarn_beta_fast", c->yarn_beta_fast);
        NUM("yarn_beta_slow", c->yarn_beta_slow);
        NUM("yarn_log_multiplier", c->yarn_log_mul);
    }
    NUM("rope_attn_factor", c->rope_attn_factor);
    NUM("kq_scale", c->kq_scale);
    NUM("n_expert", c->n_expert);
    NUM("n_expert_used", c->n_expert_used);
    NUM("n_expert_shared", c->n_expert_shared);
    NUM("n_expert_groups", c->n_group);
    NUM("n_expert_groups_used", c->n_group_used);
    cJSON_AddStringToObject(o, "gating", c->gating == MLA_GATING_SIGMOID ? "sigmoid" : "softmax");
    cJSON_AddBoolToObject(o, "expert_weights_norm", c->weights_norm);
    NUM("expert_weights_scale", c->weights_scale);
    NUM("n_leading_dense", c->n_dense_lead);
    if (c->idx_n_head) {
        NUM("indexer_n_head", c->idx_n_head);
        NUM("indexer_head_dim", c->idx_head_dim);
        NUM("indexer_top_k", c->idx_top_k);
    }
    NUM("context_length", c->ctx_train);
#undef NUM
}

static void print_hparams(const cJSON *h) {
    printf("hyperparameters:\n");
    const cJSON *it;
    cJSON_ArrayForEach(it, h) {
        if (cJSON_IsString(it))
            printf("  %-22s %s\n", it->string, it->valuestring);
        else if (cJSON_IsBool(it))
            printf("  %-22s %s\n", it->string, cJSON_IsTrue(it) ? "true" : "false");
        else
            printf("  %-22s %.9g\n", it->string, it->valuedouble);
    }
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL, *pos[1] = {NULL};
    int tp = 1, json_flag = 0, n_pos = 0;
    const opt_spec specs[] = {
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH",
         .help = "the GGUF file (also as the first argument; a split model: its first part)", .dest = &path},
        {.name = "--tp", .kind = OPT_INT, .arg = "N", .def = "1",
         .help = "tensor-parallel degree whose plan to check and show (the GPUs you mean to use)", .dest = &tp, .lo = 1,
         .hi = WIRE_MAX_WORLD},
        {.name = "--json", .kind = OPT_FLAG, .help = "one JSON object on stdout instead of text", .dest = &json_flag},
        MLA_LOG_LEVEL_OPT_SOLO,
    };
    const opt_table tab = {"options", specs, sizeof specs / sizeof *specs};
    int st = opts_command("mlaserve inspect",
                          "usage: mlaserve inspect MODEL.gguf [--tp N] [--json]\n"
                          "Architecture, hyperparameters, tokenizer, chat template, tensors by role and the\n"
                          "tensor-parallel plan for N ranks. Exit status 0 when the plan is valid, 3 when not.\n",
                          &tab, 1, argc, argv, pos, 1, &n_pos);
    if (st >= 0) return st;
    if (n_pos && path) {
        fprintf(stderr, "mlaserve inspect: the model given twice ('%s' and -m %s)\n", pos[0], path);
        return 2;
    }
    if (n_pos) path = pos[0];
    if (!path) {
        fprintf(stderr, "mlaserve inspect: no model given (mlaserve inspect MODEL.gguf; --help lists the options)\n");
        return 2;
    }
    const bool json = json_flag != 0;

    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    if (gguf_open(&g, path, &err) != MLA_OK) {
        fprintf(stderr, "mlaserve inspect: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    mla_config cfg;
    tok_vocab *vocab = NULL;
    chat_tmpl *tmpl = NULL;
    shard_plan *plans = NULL;
    cJSON *root = cJSON_CreateObject();

    cJSON_AddStringToObject(root, "file", path);
    cJSON_AddNumberToObject(root, "gguf_version", gguf_version(g));
    cJSON_AddNumberToObject(root, "parts", gguf_n_parts(g));
    uint64_t file_bytes = 0;
    for (int p = 0; p < gguf_n_parts(g); p++) file_bytes += gguf_part_size(g, p);
    cJSON_AddNumberToObject(root, "file_bytes", (double)file_bytes);
    gguf_str name;
    if (gguf_get_str(g, "general.name", &name, NULL) == 1) {
        char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)(name.len < 255 ? name.len : 255), name.ptr);
        cJSON_AddStringToObject(root, "name", buf);
    }

    if (mla_config_from_gguf(&cfg, g, &err) != MLA_OK) {
        fprintf(stderr, "mlaserve inspect: %s: %s\n", path, err.msg);
        goto out;
    }
    cJSON *hp = cJSON_AddObjectToObject(root, "hyperparameters");
    add_hparams(hp, &cfg);
    cJSON *assumed = cJSON_AddArrayToObject(root, "assumed_defaults");
    for (int i = 0; i < cfg.n_assumed; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "key", cfg.assumed[i].key);
        cJSON_AddStringToObject(a, "value", cfg.assumed[i].value);
        cJSON_AddStringToObject(a, "why", cfg.assumed[i].why);
        cJSON_AddItemToArray(assumed, a);
    }
    mla_err terr = {{0}};
    bool tensors_ok = mla_config_check_tensors(&cfg, g, &terr) == MLA_OK;
    cJSON_AddBoolToObject(root, "tensors_ok", tensors_ok);
    if (!tensors_ok) cJSON_AddStringToObject(root, "tensors_error", terr.msg);
    /* whether the CUDA backend has kernels for every weight's type (a worker refuses the model
     * before loading it otherwise); the CPU backend computes with every type it reads */
    mla_err cuerr = {{0}};
    const bool cuda_ok = tensors_ok && mla_config_check_types(&cfg, g, mla_cuda_weight_type, "CUDA", &cuerr) == MLA_OK;
    if (tensors_ok) {
        cJSON_AddBoolToObject(root, "cuda_types_ok", cuda_ok);
        if (!cuda_ok) cJSON_AddStringToObject(root, "cuda_types_error", cuerr.msg);
    }

    /* tokenizer + chat template */
    cJSON *tk = cJSON_AddObjectToObject(root, "tokenizer");
    gguf_str tmodel;
    if (gguf_get_str(g, "tokenizer.ggml.model", &tmodel, NULL) == 1) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)(tmodel.len < 63 ? tmodel.len : 63), tmodel.ptr);
        cJSON_AddStringToObject(tk, "model", buf);
    }
    mla_err tkerr = {{0}};
    if (tok_vocab_from_gguf(&vocab, g, &tkerr) == MLA_OK) {
        cJSON_AddStringToObject(tk, "pre", tok_pre_name(vocab));
        cJSON_AddNumberToObject(tk, "n_tokens", (double)tok_n_tokens(vocab));
        /* token ids the model has no rows for (a prompt holding one is refused) */
        if ((int64_t)tok_n_tokens(vocab) > cfg.n_vocab)
            cJSON_AddNumberToObject(tk, "past_model_vocab", (double)((int64_t)tok_n_tokens(vocab) - cfg.n_vocab));
        cJSON_AddNumberToObject(tk, "bos", tok_bos(vocab));
        cJSON_AddNumberToObject(tk, "eos", tok_eos(vocab));
        cJSON_AddNumberToObject(tk, "eot", tok_eot(vocab));
        cJSON_AddBoolToObject(tk, "add_bos", tok_add_bos(vocab));
        mla_err cerr = {{0}};
        if (chat_tmpl_from_gguf(&tmpl, g, vocab, &cerr) == MLA_OK)
            cJSON_AddStringToObject(tk, "chat_template", chat_tmpl_used(tmpl));
        else
            cJSON_AddStringToObject(tk, "chat_template_error", cerr.msg);
    } else {
        cJSON_AddStringToObject(tk, "error", tkerr.msg);
    }

    /* tensors grouped by role */
    role_sum sums[ROLE_COUNT];
    memset(sums, 0, sizeof sums);
    for (size_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        int layer;
        enum shard_role r = shard_role_of(t->name, &layer);
        sums[r].count++;
        sums[r].bytes += t->nbytes;
        if (t->type < GGML_TYPE_COUNT) sums[r].type_count[t->type]++;
    }
    cJSON *roles = cJSON_AddArrayToObject(root, "tensors_by_role");
    for (int r = 0; r < ROLE_COUNT; r++) {
        if (!sums[r].count) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", shard_role_name((enum shard_role)r));
        cJSON_AddNumberToObject(o, "count", sums[r].count);
        cJSON_AddNumberToObject(o, "bytes", (double)sums[r].bytes);
        cJSON *types = cJSON_AddObjectToObject(o, "types");
        for (int t = 0; t < GGML_TYPE_COUNT; t++)
            if (sums[r].type_count[t]) cJSON_AddNumberToObject(types, ggml_type_name(t), sums[r].type_count[t]);
        cJSON_AddItemToArray(roles, o);
    }

    /* tensor-parallel plan for every rank */
    shard_dims dims = shard_dims_from_config(&cfg);
    plans = mla_xcalloc((size_t)tp, sizeof *plans);
    cJSON *tpo = cJSON_AddObjectToObject(root, "tensor_parallel");
    cJSON_AddNumberToObject(tpo, "tp", tp);
    for (int r = 0; r < tp; r++) {
        if (shard_plan_build(&plans[r], g, &dims, r, tp, &err) != MLA_OK) {
            fprintf(stderr, "mlaserve inspect: %s\n", err.msg);
            goto out;
        }
    }
    cJSON_AddBoolToObject(tpo, "valid", plans[0].valid);
    if (!plans[0].valid) cJSON_AddStringToObject(tpo, "reason", plans[0].reason);
    cJSON *notes = cJSON_AddArrayToObject(tpo, "notes");
    for (char *s = plans[0].notes; *s;) {
        char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(n < 511 ? n : 511), s);
        cJSON_AddItemToArray(notes, cJSON_CreateString(line));
        s += n + (nl ? 1 : 0);
    }
    cJSON_AddNumberToObject(tpo, "bytes_total", (double)plans[0].bytes_total);
    cJSON *per = cJSON_AddArrayToObject(tpo, "bytes_per_rank");
    for (int r = 0; r < tp; r++) cJSON_AddItemToArray(per, cJSON_CreateNumber((double)plans[r].bytes_rank));
    /* the latent KV cache is replicated: per token, every layer holds kv_lora + rope elements,
     * floats on the CPU, halves on CUDA with tensor-core attention (mla_cuda_kv_f16) */
    cJSON_AddNumberToObject(tpo, "kv_cache_bytes_per_token_f32",
                            (double)(cfg.n_layer * (cfg.kv_lora_rank + cfg.n_rope) * 4));
    cJSON_AddNumberToObject(tpo, "kv_cache_bytes_per_token_f16",
                            (double)(cfg.n_layer * (cfg.kv_lora_rank + cfg.n_rope) * 2));
    cJSON *split = cJSON_AddArrayToObject(tpo, "split_by_role");
    for (int r = 0; r < ROLE_COUNT; r++) {
        if (!sums[r].count) continue;
        for (size_t i = 0; i < plans[0].n_entries; i++) {
            const shard_entry *e = &plans[0].entries[i];
            if ((int)e->role != r) continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "role", shard_role_name(e->role));
            cJSON_AddStringToObject(o, "split", shard_kind_name(e->kind));
            cJSON_AddBoolToObject(o, "rank0_only", e->rank0_only);
            cJSON_AddBoolToObject(o, "gather_input", e->gather_input);
            cJSON_AddStringToObject(o, "example", e->name);
            cJSON_AddItemToArray(split, o);
            break;
        }
    }

    if (json) {
        char *s = cJSON_Print(root);
        puts(s);
        free(s);
    } else {
        char b1[32], b2[32];
        fmt_bytes(b1, sizeof b1, file_bytes);
        const cJSON *nm = cJSON_GetObjectItem(root, "name");
        printf("file:          %s (GGUF v%u, %d part%s, %s)\n", path, gguf_version(g), gguf_n_parts(g),
               gguf_n_parts(g) == 1 ? "" : "s", b1);
        printf("model:         %s, architecture %s\n", nm ? nm->valuestring : "?", cfg.arch_name);
        print_hparams(hp);
        printf("assumed defaults (keys missing from the file):%s\n", cfg.n_assumed ? "" : " none");
        for (int i = 0; i < cfg.n_assumed; i++)
            printf("  %s = %s  (%s)\n", cfg.assumed[i].key, cfg.assumed[i].value, cfg.assumed[i].why);
        printf("tensor shapes: %s\n", tensors_ok ? "all as the config expects" : terr.msg);
        if (tensors_ok) printf("CUDA kernels:  %s\n", cuda_ok ? "for every weight type" : cuerr.msg);
        printf("tokenizer:\n");
        const cJSON *it;
        cJSON_ArrayForEach(it, tk) {
            if (cJSON_IsString(it)) printf("  %-14s %s\n", it->string, it->valuestring);
            else if (cJSON_IsBool(it)) printf("  %-14s %s\n", it->string, cJSON_IsTrue(it) ? "true" : "false");
            else printf("  %-14s %.0f\n", it->string, it->valuedouble);
        }
        printf("tensors by role:\n  %-20s %6s %12s  types\n", "role", "count", "size");
        for (int r = 0; r < ROLE_COUNT; r++) {
            if (!sums[r].count) continue;
            fmt_bytes(b1, sizeof b1, sums[r].bytes);
            printf("  %-20s %6d %12s  ", shard_role_name((enum shard_role)r), sums[r].count, b1);
            for (int t = 0; t < GGML_TYPE_COUNT; t++)
                if (sums[r].type_count[t]) printf("%s x%d ", ggml_type_name(t), sums[r].type_count[t]);
            printf("\n");
        }
        printf("tensor parallelism %d: %s\n", tp, plans[0].valid ? "valid" : "NOT valid");
        if (!plans[0].valid) printf("  reason: %s\n", plans[0].reason);
        const cJSON *n;
        cJSON_ArrayForEach(n, notes) printf("  note: %s\n", n->valuestring);
        const cJSON *s;
        cJSON_ArrayForEach(s, split) {
            printf("  %-20s %-10s%s%s\n", cJSON_GetObjectItem(s, "role")->valuestring,
                   cJSON_GetObjectItem(s, "split")->valuestring,
                   cJSON_IsTrue(cJSON_GetObjectItem(s, "rank0_only")) ? " (replicated, rank 0 computes)" : "",
                   cJSON_IsTrue(cJSON_GetObjectItem(s, "gather_input")) ? " (by output rows, input gathered)" : "");
        }
        fmt_bytes(b1, sizeof b1, plans[0].bytes_total);
        printf("  weights total %s; per rank:", b1);
        for (int r = 0; r < tp; r++) {
            fmt_bytes(b2, sizeof b2, plans[r].bytes_rank);
            printf(" [%d] %s", r, b2);
        }
        printf("\n  latent KV cache per token (all layers, replicated on every rank): %lld bytes in f32 (CPU), "
               "%lld in f16 (CUDA, MLA_CUDA_KV)\n",
               (long long)(cfg.n_layer * (cfg.kv_lora_rank + cfg.n_rope) * 4),
               (long long)(cfg.n_layer * (cfg.kv_lora_rank + cfg.n_rope) * 2));
    }
    rc = plans[0].valid && tensors_ok ? 0 : 3;
out:
    if (plans)
        for (int r = 0; r < tp; r++) shard_plan_free(&plans[r]);
    free(plans);
    cJSON_Delete(root);
    chat_tmpl_free(tmpl);
    tok_vocab_free(vocab);
    gguf_close(g);
    return rc;
}
