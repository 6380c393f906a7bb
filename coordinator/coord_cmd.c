/* `mlaserve logits --tp N` and `mlaserve generate`: the front command through the coordinator
 * and N worker processes (coordinator/coord.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "cmds.h"
#include "common/gguf.h"
#include "common/ids_file.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/model_config.h"
#include "common/opts.h"
#include "coord.h"
#include "tok.h"

typedef coord_group_opts group_opts;

static int start_group(const group_opts *o, gguf_ctx **g, coord **c, mla_err *err) {
    if (gguf_open(g, o->model, err)) return MLA_ERR;
    return coord_group_start(o, *g, c, err);
}

/* How `logits --processes` runs a prompt: first step k tokens (--decode-from), the rest in steps
 * of at most chunk tokens (--chunk; 0: one step), or, with reuse > 0 (--prefix-reuse R), through a
 * donor: a sequence of its own first runs tokens [0, R), then the prompt's sequence shares the
 * donor's first R / block_size blocks (as the prefix cache shares them) and runs from there; the
 * rows before that are the donor's. */
typedef struct seq_mode {
    int64_t k, chunk, reuse;
} seq_mode;

/* Plans of seq_id over tokens [from, to) at those positions, in steps of at most `chunk` (the
 * first of at most first), logits of every position into out + from * V; the table goes whole
 * with the first step (tab[0, ntab)), later steps send none. The last step samples when sample. */
static int run_steps(coord *c, uint64_t seq_id, uint64_t *step, const int32_t *tokens, const int32_t *pos,
                     int64_t from, int64_t to, int64_t first, int64_t chunk, const uint32_t *tab, uint32_t ntab,
                     bool sample, float *out, int32_t *next, mla_err *err) {
    const uint32_t V = coord_n_vocab(c);
    for (int64_t off = from; off < to;) {
        int64_t cnt = to - off, lim = off == from ? first : chunk;
        if (lim > 0 && cnt > lim) cnt = lim;
        wire_seq s = {.seq_id = seq_id, .n_tokens = (uint32_t)cnt, .tokens = (int32_t *)tokens + off,
                      .positions = (int32_t *)pos + off, .sample = off + cnt == to && sample,
                      .block_start = off == from ? 0 : ntab, .n_blocks = off == from ? ntab : 0,
                      .blocks = (uint32_t *)tab};
        s.sp.top_p = 1;
        s.sp.repetition_penalty = 1;
        s.sp.logits = WIRE_LOGITS_ALL;
        wire_step_plan plan = {.step_id = ++*step, .n_seqs = 1, .seqs = &s};
        wire_step_result res;
        if (coord_step(c, &plan, &res, err)) return MLA_ERR;
        memcpy(out + off * V, res.seqs[0].logits, (size_t)cnt * V * sizeof(float));
        *next = res.seqs[0].token;
        coord_result_free(&res);
        off += cnt;
    }
    return MLA_OK;
}

/* one sequence: tokens[0..n) as mode says, logits of every position into out (n x V); then up to
 * greedy tokens into gen (stops after eos). */
static int run_seq(coord *c, uint64_t seq_id, uint64_t *step, const int32_t *tokens, int64_t n, const seq_mode *md,
                   float *out, long greedy, int32_t eos, int32_t *gen, long *n_gen, mla_err *err) {
    int32_t *pos = mla_xmalloc((size_t)(n + greedy + 1) * sizeof *pos);
    for (int64_t i = 0; i < n + greedy + 1; i++) pos[i] = (int32_t)i;
    const uint32_t npos = (uint32_t)(n + greedy + 1), per = coord_table_len(c, npos);
    uint32_t *tab = mla_xmalloc(((size_t)per + 1) * sizeof *tab), *dtab = mla_xmalloc(((size_t)per + 1) * sizeof *dtab);
    uint32_t ntab = 0, ndtab = 0;
    /* a donor takes slot 0 and the sequence slot 1; alone the sequence takes slot 0 */
    const uint32_t slots = md->reuse > 0 ? 2 : 1;
    int rc = coord_slot_table(c, slots - 1, slots, npos, tab, &ntab, err);
    int64_t start = 0;
    int32_t next = -1;
    *n_gen = 0;
    if (rc == MLA_OK && md->reuse > 0) {
        const uint64_t donor = seq_id | ((uint64_t)1 << 40);
        const int64_t r = md->reuse < n ? md->reuse : n;
        rc = coord_slot_table(c, 0, slots, npos, dtab, &ndtab, err);
        if (rc == MLA_OK)
            rc = run_steps(c, donor, step, tokens, pos, 0, r, 0, 0, dtab, ndtab, false, out, &next, err);
        if (rc == MLA_OK) {
            /* the donor's whole blocks, at most up to the prompt's last token (which the sequence
             * computes itself, as the scheduler leaves it): read, never written, by the sequence */
            coord_kv_info kv;
            coord_kv_pool(c, &kv);
            const uint32_t nshare = (uint32_t)((r < n ? r : n - 1) / kv.block_size);
            memcpy(tab, dtab, nshare * sizeof *tab);
            start = (int64_t)nshare * kv.block_size;
        }
        mla_err e2;
        if (coord_free_seqs(c, &donor, 1, rc == MLA_OK ? err : &e2) && rc == MLA_OK) rc = MLA_ERR;
    }
    if (rc == MLA_OK)
        rc = run_steps(c, seq_id, step, tokens, pos, start, n, start == 0 ? md->k : 0, md->chunk, tab, ntab,
                       greedy > 0, out, &next, err);
    for (long i = 0; rc == MLA_OK && greedy > 0 && i < greedy; i++) {
        gen[(*n_gen)++] = next;
        if (next == eos || i + 1 == greedy) break;
        wire_seq s = {.seq_id = seq_id, .n_tokens = 1, .tokens = &next, .positions = pos + n + i, .sample = true,
                      .block_start = ntab};
        s.sp.top_p = 1;
        s.sp.repetition_penalty = 1;
        wire_step_plan plan = {.step_id = ++*step, .n_seqs = 1, .seqs = &s};
        wire_step_result res;
        rc = coord_step(c, &plan, &res, err);
        if (rc) break;
        next = res.seqs[0].token;
        coord_result_free(&res);
    }
    free(pos);
    free(tab);
    free(dtab);
    if (rc == MLA_OK) rc = coord_free_seqs(c, &seq_id, 1, err);
    return rc;
}

/* The longest prompt of an ids file (0 where every line is empty): the logits command sizes the
 * workers' steps by it before they start. */
static int longest_prompt(const char *path, int64_t *nmax, mla_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return mla_errf(err, "%s: %s", path, strerror(errno));
    ids_line L = {0};
    int r;
    *nmax = 0;
    for (uint64_t ln = 1; (r = ids_file_next(f, path, ln, &L, err)) == 1; ln++)
        if ((int64_t)L.n > *nmax) *nmax = (int64_t)L.n;
    fclose(f);
    ids_line_free(&L);
    return r < 0 ? MLA_ERR : MLA_OK;
}

int cmd_logits_tp(const coord_group_opts *opts, const logits_opts *lo) {
    group_opts o = *opts;
    const char *tokens = lo->tokens, *outp = lo->out;
    const long decode_from = lo->decode_from, greedy = lo->greedy, chunk = lo->chunk, reuse = lo->prefix_reuse;

    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    coord *c = NULL;
    FILE *fin = NULL;
    logits_files files = {.out = {.o = {.fd = -1, .clean = -1}}, .ids = {.o = {.fd = -1, .clean = -1}}};
    ids_line L = {0};
    int32_t *gen = NULL;
    float *logits = NULL;
    int status = 1;
    uint64_t step = 0;
    int64_t nmax = 0;
    if (longest_prompt(tokens, &nmax, &err)) goto fail;
    /* the largest step: a whole prompt, a --chunk, the --decode-from first part or a --prefix-reuse
     * donor's prefix (one step); sized before the cache pool takes the memory, since a step past it
     * would grow the workers' scratch where the pool left no room */
    int64_t big = chunk > 0 && chunk < nmax ? chunk : nmax;
    if (decode_from >= 0) big = decode_from < 1 ? 1 : decode_from < nmax ? decode_from : nmax;
    const int64_t donor = reuse < nmax ? reuse : nmax;
    if (donor > big) big = donor;
    if (big > (int64_t)WIRE_MAX_STEP_TOKENS) {
        mla_errf(&err, "%s: a step of %lld tokens passes the %u-token step limit: give --chunk N", tokens,
                 (long long)big, WIRE_MAX_STEP_TOKENS);
        goto fail;
    }
    if (big > (int64_t)o.cc.kv.max_step_tokens) o.cc.kv.max_step_tokens = (uint32_t)big;
    if (start_group(&o, &g, &c, &err)) goto fail;
    uint32_t eos = UINT32_MAX;
    if (gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos, &err) < 0) goto fail;
    const uint32_t V = coord_n_vocab(c);
    /* a step's logits (every position's) come back in one frame; 64 KiB for the rest of it */
    const int64_t rows = (int64_t)((WIRE_MAX_FRAME - 65536) / ((size_t)V * sizeof(float)));
    if (big > rows) {
        mla_errf(&err, "%s: a step of %lld tokens returns its logits (%u a token) in one frame of at most %zu MiB: "
                       "give --chunk %lld or less",
                 tokens, (long long)big, V, WIRE_MAX_FRAME >> 20, (long long)rows);
        goto fail;
    }
    if (!(fin = fopen(tokens, "r"))) {
        mla_errf(&err, "%s: %s", tokens, strerror(errno));
        goto fail;
    }
    if (logits_files_open(&files, lo, &err)) goto fail;
    gen = mla_xmalloc((size_t)(greedy > 0 ? greedy : 1) * sizeof *gen);
    for (uint64_t ln = 1;; ln++) {
        int r = ids_file_next(fin, tokens, ln, &L, &err);
        if (r < 0) goto fail;
        if (r == 0) break;
        size_t n = L.n;
        const int32_t *ids = L.ids;
        for (size_t i = 0; i < n; i++)
            if ((uint32_t)ids[i] >= V) {
                mla_errf(&err, "%s: line %llu: token id %d is not below the vocabulary size %u", tokens,
                         (unsigned long long)ln, ids[i], V);
                goto fail;
            }
        if (!n) continue;
        logits = mla_xrealloc(logits, n * V * sizeof *logits);
        /* --decode-from K: K tokens, then one a step; else steps of --chunk (0: all at once) */
        seq_mode md = {chunk, chunk, reuse};
        if (decode_from >= 0) md = (seq_mode){decode_from < 1 ? 1 : decode_from, 1, reuse};
        long n_gen = 0;
        if (run_seq(c, ln, &step, ids, (int64_t)n, &md, logits, greedy, (int32_t)eos, gen, &n_gen, &err)) goto fail;
        if (fwrite(logits, sizeof *logits, n * V, files.out.f) != n * V) {
            mla_errf(&err, "%s: write failed", outp);
            goto fail;
        }
        if (files.ids.f) {
            for (long i = 0; i < n_gen; i++) fprintf(files.ids.f, "%s%d", i ? " " : "", gen[i]);
            fputc('\n', files.ids.f);
        }
    }
    if (step == 0) { /* every line empty: an empty output would pass for a result */
        mla_errf(&err, "%s: no prompt (every line is empty)", tokens);
        goto fail;
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "mlaserve logits: %s\n", err.msg);
    status = 1;
done:
    status = logits_files_close(&files, status);
    if (fin) fclose(fin);
    coord_stop(c);
    if (g) gguf_close(g);
    ids_line_free(&L);
    free(gen);
    free(logits);
    return status;
}

static const char generate_usage[] =
    "usage: mlaserve generate -m MODEL.gguf -p PROMPT [--chat] [-n N] [--tp N] [options]\n"
    "Generates a continuation of PROMPT through a coordinator and N worker processes; prints the text.\n";

int cmd_generate(int argc, char **argv) {
    group_opts o = {.tp = 1, .threads = 1};
    const char *prompt = NULL;
    long n_predict = 64;
    wire_sampling sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    int verbose = 0, chat = 0;
    opt_spec gspecs[COORD_GROUP_N_OPTS], cspecs[COORD_N_OPTS];
    coord_group_opt_specs(&o, gspecs);
    coord_opt_specs(&o.cc, cspecs);
    const opt_spec mine[] = {
        {.name = "--prompt", .alias = "-p", .kind = OPT_STR, .arg = "TEXT", .help = "the prompt (required)", .dest = &prompt, .empty_ok = true},
        {.name = "--chat", .kind = OPT_FLAG, .help = "the prompt is one user message, through the model's chat template",
         .dest = &chat},
        {.name = "--n-predict", .alias = "-n", .kind = OPT_LONG, .arg = "N", .def = "64", .help = "tokens to generate at most",
         .dest = &n_predict, .lo = 1, .hi = 1L << 24},
        {.name = "--temp", .kind = OPT_FLOAT, .arg = "T", .def = "0", .help = "temperature (0: greedy)",
         .dest = &sp.temperature, .lo = 0, .hi = 100},
        {.name = "--top-k", .kind = OPT_INT, .arg = "K", .def = "0", .help = "top-k sampling (0: off)", .dest = &sp.top_k,
         .lo = 0, .hi = 1 << 24},
        {.name = "--top-p", .kind = OPT_FLOAT, .arg = "P", .def = "1", .help = "nucleus sampling (1: off)", .dest = &sp.top_p,
         .lo = 0, .hi = 1, .lo_open = true},
        {.name = "--min-p", .kind = OPT_FLOAT, .arg = "P", .def = "0", .help = "min-p sampling (0: off)", .dest = &sp.min_p,
         .lo = 0, .hi = 1},
        {.name = "--repeat-penalty", .kind = OPT_FLOAT, .arg = "R", .def = "1",
         .help = "repetition penalty (1: off)", .dest = &sp.repetition_penalty, .lo = 0, .hi = 100, .lo_open = true},
        {.name = "--presence-penalty", .kind = OPT_FLOAT, .arg = "P", .def = "0", .help = "presence penalty",
         .dest = &sp.presence_penalty, .lo = -100, .hi = 100},
        {.name = "--frequency-penalty", .kind = OPT_FLOAT, .arg = "F", .def = "0", .help = "frequency penalty",
         .dest = &sp.frequency_penalty, .lo = -100, .hi = 100},
        {.name = "--seed", .kind = OPT_U64, .arg = "S", .def = "0", .help = "sampling seed", .dest = &sp.seed},
        {.name = "--verbose", .alias = "-v", .kind = OPT_FLAG, .help = "log at info (default: warnings only)",
         .dest = &verbose},
        MLA_LOG_LEVEL_OPT_WARN,
    };
    const opt_table tabs[] = {{"model and workers", gspecs, COORD_GROUP_N_OPTS},
                              {"generation", mine, sizeof mine / sizeof *mine},
                              {"control plane", cspecs, COORD_N_OPTS}};
    int st = opts_command("mlaserve generate", generate_usage, tabs, 3, argc, argv, NULL, 0, NULL);
    if (st >= 0) return st;
    if (!o.model || !prompt) {
        fprintf(stderr, "mlaserve generate: -m MODEL.gguf and -p PROMPT are required (--help lists the options)\n");
        return 2;
    }
    /* the workers follow the level (handed over at registration) */
    if (verbose)
        mla_log_level_opt(NULL, "info", NULL);
    else if (!mla_log_level_given()) /* --log-level sets it otherwise */
        mla_log_level_opt(NULL, "warn", NULL);

    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    coord *c = NULL;
    tok_vocab *voc = NULL;
    chat_tmpl *tmpl = NULL;
    char *text = NULL;
    tok_ids ids = {0};
    int32_t *pos = NULL;
    uint32_t *tab = NULL, ntab = 0;
    int status = 1;
    mla_config mcfg;
    if (gguf_open(&g, o.model, &err) || tok_vocab_from_gguf(&voc, g, &err) ||
        chat_tmpl_from_gguf(&tmpl, g, voc, &err) || mla_config_from_gguf(&mcfg, g, &err))
        goto fail;
    gguf_close(g);
    g = NULL;
    /* A chat prompt goes through the model's chat template; a plain prompt gets the text every
     * prompt of the model starts with (BOS, or GLM's [gMASK]<sop>), as the HTTP API does. */
    if (chat) {
        chat_msg m = {.role = "user", .content = prompt};
        size_t len;
        if (chat_tmpl_apply(tmpl, &m, 1, true, NULL, &text, &len, NULL, &err)) goto fail;
    } else {
        char *prefix = NULL;
        if (chat_tmpl_prefix(tmpl, &prefix, &err)) goto fail;
        size_t lp = strlen(prefix), ln = strlen(prompt);
        text = mla_xmalloc(lp + ln + 1);
        memcpy(text, prefix, lp);
        memcpy(text + lp, prompt, ln + 1);
        free(prefix);
    }
    if (tok_encode(voc, text, strlen(text), false, true, &ids, &err)) goto fail;
    if (ids.n == 0) {
        mla_errf(&err, "the prompt has no tokens");
        goto fail;
    }
    if (mcfg.ctx_train > 0 && (int64_t)ids.n + n_predict > mcfg.ctx_train) {
        mla_errf(&err, "the prompt's %zu tokens and -n %ld pass the model's context length %lld", ids.n, n_predict,
                 (long long)mcfg.ctx_train);
        goto fail;
    }
    o.cc.kv.max_context = (uint32_t)(ids.n + (size_t)n_predict + 1);
    o.cc.kv.max_step_tokens = (uint32_t)ids.n;
    if (start_group(&o, &g, &c, &err)) goto fail;
    pos = mla_xmalloc((ids.n + (size_t)n_predict) * sizeof *pos);
    for (size_t i = 0; i < ids.n + (size_t)n_predict; i++) pos[i] = (int32_t)i;
    tab = mla_xmalloc(((size_t)coord_table_len(c, (uint32_t)(ids.n + (size_t)n_predict)) + 1) * sizeof *tab);
    if (coord_slot_table(c, 0, 1, (uint32_t)(ids.n + (size_t)n_predict), tab, &ntab, &err)) goto fail;
    tok_stream ts;
    tok_stream_init(&ts, voc, true);
    size_t bufcap = tok_max_piece_len(voc) * 2 + 16;
    char *buf = mla_xmalloc(bufcap);
    size_t off = 0, cnt = ids.n;
    int32_t next = -1;
    long n_gen = 0;
    sp.penalty_start = (uint32_t)ids.n; /* presence / frequency count the generated tokens */
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    t1 = t0;
    for (long i = 0; i < n_predict; i++) {
        wire_seq s = {.seq_id = 1, .n_tokens = (uint32_t)cnt, .tokens = i ? &next : ids.ids,
                      .positions = pos + off, .sample = true, .sp = sp, .block_start = i ? ntab : 0,
                      .n_blocks = i ? 0 : ntab, .blocks = tab, .last = i + 1 == n_predict};
        wire_step_plan plan = {.step_id = (uint64_t)i + 1, .n_seqs = 1, .seqs = &s};
        wire_step_result res;
        if (coord_step(c, &plan, &res, &err)) {
            free(buf);
            tok_stream_free(&ts);
            goto fail;
        }
        next = res.seqs[0].token;
        coord_result_free(&res);
        if (i == 0) clock_gettime(CLOCK_MONOTONIC, &t1);
        n_gen++;
        off += cnt;
        cnt = 1;
        if (tok_is_eog(voc, next)) break;
        int n = tok_stream_feed(&ts, next, buf, bufcap);
        if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
    }
    int n = tok_stream_finish(&ts, buf, bufcap);
    if (n > 0) fwrite(buf, 1, (size_t)n, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    double prefill_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    double decode_s = (double)(t2.tv_sec - t1.tv_sec) + 1e-9 * (double)(t2.tv_nsec - t1.tv_nsec);
    fprintf(stderr,
            "mlaserve generate: prompt %zu tokens in %.3f s (%.1f tokens/s, first token included); "
            "%ld more tokens in %.3f s (%.1f tokens/s); tp %d\n",
            ids.n, prefill_s, prefill_s > 0 ? (double)ids.n / prefill_s : 0.0, n_gen - 1, decode_s,
            decode_s > 0 ? (double)(n_gen - 1) / decode_s : 0.0, o.tp);
    free(buf);
    tok_stream_free(&ts);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "mlaserve generate: %s\n", err.msg);
done:
    coord_stop(c);
    if (g) gguf_close(g);
    chat_tmpl_free(tmpl);
    free(text);
    tok_vocab_free(voc);
    tok_ids_free(&ids);
    free(pos);
    free(tab);
    return status;
}
