#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmds.h"
#include "common/coll_host.h"
#include "common/gguf.h"
#include "common/ids_file.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/model_config.h"
#include "common/opts.h"
#include "common/sig_clean.h"
#include "worker/model.h"

static const char logits_usage[] =
    "usage: mlaserve logits -m MODEL.gguf --tokens IDS.txt --out OUT.f32 [--tp N] [options]\n"
    "Exact CPU logits of every position of each prompt (one a line of IDS.txt: token ids), written\n"
    "as float32 [tokens, vocab]. --tp N > 1 runs one worker process a rank through a coordinator\n"
    "(as serving does), and so does any control-plane option; --in-process runs the ranks as\n"
    "threads of this process (no control-plane option then).\n";

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

typedef ids_prompts prompts;

typedef struct rank_job {
    const gguf_ctx *g;
    coll *c;              /* NULL: single rank */
    int threads;
    long decode_from, greedy;
    const prompts *P;
    FILE *fout, *fids;    /* rank 0 only */
    const char *outp;
    int rc;
    mla_err err;
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    mla_err *err = &j->err;
    mla_model *m = NULL;
    float *logits = NULL;
    j->rc = MLA_ERR;
    mla_model_opts opts = {j->threads};
    if (mla_model_load(&m, j->g, j->c, &opts, err) < 0) return NULL;
    const mla_config *c = mla_model_config(m);
    uint32_t eos = UINT32_MAX;
    if (gguf_get_u32(j->g, "tokenizer.ggml.eos_token_id", &eos, err) < 0) goto out;
    for (int64_t p = 0; p < j->P->count; p++) {
        const int32_t *ids = j->P->ids[p];
        const int64_t n = j->P->n[p];
        mla_state *st = mla_state_new(m, n + j->greedy + 1);
        logits = mla_xrealloc(logits, (size_t)(n * c->n_vocab) * sizeof *logits);
        long df = j->decode_from;
        int64_t k = df < 0 || df >= n ? n : (df < 1 ? 1 : df);
        int rc = mla_model_forward(m, st, ids, k, 0, MLA_LOGITS_ALL, logits, err);
        for (int64_t t = k; t < n && rc == MLA_OK; t++)
            rc = mla_model_forward(m, st, ids + t, 1, t, MLA_LOGITS_ALL, logits + t * c->n_vocab, err);
        if (rc == MLA_OK && j->fout &&
            fwrite(logits, sizeof *logits, (size_t)(n * c->n_vocab), j->fout) != (size_t)(n * c->n_vocab)) {
            mla_errf(err, "%s: write failed", j->outp);
            rc = MLA_ERR;
        }
        if (rc == MLA_OK && j->greedy > 0) {
            float *last = mla_xmalloc((size_t)c->n_vocab * sizeof *last);
            memcpy(last, logits + (n - 1) * c->n_vocab, (size_t)c->n_vocab * sizeof *last);
            for (long i = 0; i < j->greedy && rc == MLA_OK; i++) {
                int32_t tok = argmax(last, c->n_vocab);
                if (j->fids) fprintf(j->fids, "%s%d", i ? " " : "", tok);
                if ((uint32_t)tok == eos || i + 1 == j->greedy) break;
                rc = mla_model_forward(m, st, &tok, 1, n + i, MLA_LOGITS_LAST, last, err);
            }
            if (j->fids) fputc('\n', j->fids);
            free(last);
        }
        mla_state_free(st);
        if (rc < 0) goto out;
    }
    j->rc = MLA_OK;
out:
    free(logits);
    mla_model_free(m);
    return NULL;
}

/* path opened for writing as cmds.h says (common/outfile.h), as a stream of mode */
static int open_one(logits_one *o, const char *path, const char *mode, mla_err *err) {
    *o = (logits_one){.o = {.fd = -1, .clean = -1}};
    if (!path) return MLA_OK;
    if (outfile_open(&o->o, path, err)) return MLA_ERR;
    if (!(o->f = fdopen(o->o.fd, mode))) {
        mla_errf(err, "%s: %s", path, strerror(errno));
        outfile_close(&o->o, 0, NULL);
        return MLA_ERR;
    }
    o->o.fd = -1; /* the stream's now: fclose closes it */
    return MLA_OK;
}

/* path with a link in its last part followed (a link to a file not made yet is written where it
 * points), its folder resolved (links, "..") and its own name: how two names of one file not made
 * yet compare; NULL where the folder does not exist */
static char *canonical(const char *path) {
    char *cur = mla_xstrdup(path), buf[PATH_MAX];
    struct stat lst;
    for (int hop = 0; hop < 16 && lstat(cur, &lst) == 0 && S_ISLNK(lst.st_mode); hop++) {
        const ssize_t n = readlink(cur, buf, sizeof buf - 1);
        if (n < 0) break;
        buf[n] = 0;
        const char *slash = strrchr(cur, '/');
        const size_t dl = buf[0] == '/' || !slash ? 0 : (size_t)(slash - cur + 1); /* relative: beside the link */
        char *next = mla_xmalloc(dl + (size_t)n + 1);
        memcpy(next, cur, dl);
        memcpy(next + dl, buf, (size_t)n + 1);
        free(cur);
        cur = next;
    }
    char *dup = cur, *slash = strrchr(dup, '/');
    const char *dir = slash ? (slash == dup ? "/" : dup) : ".", *base = slash ? slash + 1 : dup;
    if (slash) *slash = 0;
    char *rd = realpath(dir, NULL), *out = NULL;
    if (rd) {
        out = mla_xmalloc(strlen(rd) + strlen(base) + 2);
        sprintf(out, "%s/%s", rd, base);
        free(rd);
    }
    free(dup);
    return out;
}

/* whether paths a and b name one file: the same inode where both exist, else the same name */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    const bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && S_ISREG(sa.st_mode);
    if (ea || eb) return false;
    char *ca = canonical(a), *cb = canonical(b);
    const bool same = ca && cb && !strcmp(ca, cb);
    free(ca);
    free(cb);
    return same;
}

int logits_files_open(logits_files *f, const logits_opts *lo, mla_err *err) {
    memset(f, 0, sizeof *f);
    f->out.o.fd = f->ids.o.fd = f->out.o.clean = f->ids.o.clean = -1;
    /* one file for two of them would lose one (the logits overwritten by the ids, the prompts by
     * the logits) */
    if (lo->out && lo->ids_out && same_file(lo->out, lo->ids_out))
        return mla_errf(err, "--out and --ids-out name the same file (%s)", lo->out);
    if (lo->tokens && lo->out && same_file(lo->tokens, lo->out))
        return mla_errf(err, "--out names the --tokens file (%s)", lo->out);
    if (lo->tokens && lo->ids_out && same_file(lo->tokens, lo->ids_out))
        return mla_errf(err, "--ids-out names the --tokens file (%s)", lo->ids_out);
    if (open_one(&f->out, lo->out, "wb", err) == MLA_OK && open_one(&f->ids, lo->ids_out, "w", err) == MLA_OK)
        return MLA_OK;
    logits_files_close(f, 1);
    return MLA_ERR;
}

/* closes o: into place when status is 0, else removed; the status after it */
static int close_one(logits_one *o, int status) {
    if (o->f && fclose(o->f) != 0 && status == 0) {
        fprintf(stderr, "mlaserve logits: %s: close failed: %s\n", o->o.path, strerror(errno));
        status = 1;
    }
    mla_err err;
    if (outfile_close(&o->o, status == 0, &err) && status == 0) {
        fprintf(stderr, "mlaserve logits: %s\n", err.msg);
        status = 1;
    }
    *o = (logits_one){.o = {.fd = -1, .clean = -1}};
    return status;
}

int logits_files_close(logits_files *f, int status) {
    status = close_one(&f->out, status);
    /* the ids file goes into place only after the logits did */
    return close_one(&f->ids, status);
}

int cmd_logits(int argc, char **argv) {
    coord_group_opts go = {0};
    logits_opts lo = {.decode_from = -1};
    int in_process = 0, processes = 0;
    opt_spec gspecs[COORD_GROUP_N_OPTS], cspecs[COORD_N_OPTS];
    coord_group_opt_specs(&go, gspecs);
    coord_opt_specs(&go.cc, cspecs);
    const opt_spec mine[] = {
        {.name = "--tokens", .kind = OPT_STR, .arg = "IDS.txt", .help = "prompts: one a line, token ids (required)",
         .dest = &lo.tokens},
        {.name = "--out", .kind = OPT_STR, .arg = "OUT.f32", .help = "where the logits go (required; written whole when the run succeeds, else not at all)", .dest = &lo.out},
        {.name = "--decode-from", .kind = OPT_LONG, .arg = "K", .def = "the whole prompt in one pass",
         .help = "the first K tokens in one pass, the rest one at a time", .dest = &lo.decode_from, .lo = 0,
         .hi = 1L << 30},
        {.name = "--greedy", .kind = OPT_LONG, .arg = "N", .def = "0",
         .help = "also continue each prompt greedily for up to N tokens (needs --ids-out)", .dest = &lo.greedy, .lo = 0,
         .hi = 1L << 24},
        {.name = "--ids-out", .kind = OPT_STR, .arg = "FILE", .help = "the greedy continuations, one line a prompt",
         .dest = &lo.ids_out},
        {.name = "--chunk", .kind = OPT_LONG, .arg = "N", .def = "0: the whole prompt in one step",
         .help = "worker processes: prompts in steps of at most N tokens", .dest = &lo.chunk, .lo = 0, .hi = 1L << 30},
        {.name = "--prefix-reuse", .kind = OPT_LONG, .arg = "R", .def = "0: none",
         .help = "worker processes: another sequence computes the first R tokens; the prompt shares its whole "
                 "cache blocks and computes the rest",
         .dest = &lo.prefix_reuse, .lo = 0, .hi = 1L << 30},
        {.name = "--in-process", .kind = OPT_FLAG, .help = "the --tp ranks as threads of this process",
         .dest = &in_process},
        {.name = "--processes", .kind = OPT_FLAG,
         .help = "a coordinator and worker processes even for --tp 1", .dest = &processes},
        MLA_LOG_LEVEL_OPT,
    };
    /* any control-plane option given: worker processes (none of them means anything in one) */
    int cp_given = 0;
    for (int i = 0; i < COORD_N_OPTS; i++)
        if (!cspecs[i].seen) cspecs[i].seen = &cp_given; /* (--spin-us keeps its own: spin_us_given) */
    const opt_table tabs[] = {{"model and workers", gspecs, COORD_GROUP_N_OPTS},
                              {"logits", mine, sizeof mine / sizeof *mine},
                              {"control plane (worker processes)", cspecs, COORD_N_OPTS}};
    int st = opts_command("mlaserve logits", logits_usage, tabs, 3, argc, argv, NULL, 0, NULL);
    if (st >= 0) return st;
    if (!go.model || !lo.tokens || !lo.out || (lo.greedy > 0 && !lo.ids_out)) {
        fprintf(stderr, "mlaserve logits: -m MODEL, --tokens IDS.txt and --out OUT.f32 are required (--greedy N: "
                        "--ids-out too; --help lists the options)\n");
        return 2;
    }
    if (lo.ids_out && lo.greedy == 0) {
        fprintf(stderr, "mlaserve logits: --ids-out holds the --greedy continuations: it needs --greedy N\n");
        return 2;
    }
    const bool group_opts_given = cp_given || go.cc.spin_us_given || go.worker_exe || lo.chunk || lo.prefix_reuse;
    if (in_process && (processes || group_opts_given)) {
        fprintf(stderr, "mlaserve logits: --in-process runs no worker processes: --processes, --worker-exe and the "
                        "control-plane options do not apply\n");
        return 2;
    }
    /* --tp N > 1 runs one process per rank through the coordinator (coord_cmd.c), as serving
     * does; --in-process keeps the ranks as threads of this process (quick checks, debugging). */
    if (!in_process && (processes || group_opts_given || go.tp > 1)) return cmd_logits_tp(&go, &lo);
    const char *model = go.model, *tokens = lo.tokens, *outp = lo.out;
    const int threads = go.threads, tp = go.tp;
    const long decode_from = lo.decode_from, greedy = lo.greedy;
    if (tp > COLL_HOST_MAX_WORLD) {
        fprintf(stderr, "mlaserve logits: --in-process runs at most %d ranks\n", COLL_HOST_MAX_WORLD);
        return 2;
    }

    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    logits_files files = {.out = {.o = {.fd = -1, .clean = -1}}, .ids = {.o = {.fd = -1, .clean = -1}}};
    prompts P = {0};
    int status = 1;
    coll_host_seg *seg = NULL;
    rank_job *jobs = NULL;
    pthread_t *th = NULL;
    if (gguf_open(&g, model, &err) < 0) goto fail;
    if (ids_file_read_all(tokens, &P, &err) < 0) goto fail;
    if (P.count == 0) { /* an empty output would pass for a result */
        mla_errf(&err, "%s: no prompt (every line is empty)", tokens);
        goto fail;
    }
    /* each sequence's state is sized for its prompt and --greedy tokens: within the model's
     * context, as the served path's cache checks it */
    mla_config mcfg;
    if (mla_config_from_gguf(&mcfg, g, &err)) goto fail;
    for (int64_t i = 0; i < P.count && mcfg.ctx_train > 0; i++)
        if (P.n[i] + greedy > mcfg.ctx_train) {
            mla_errf(&err, "%s: prompt %lld's %lld tokens and --greedy %ld pass the model's context length %lld",
                     tokens, (long long)i + 1, (long long)P.n[i], greedy, (long long)mcfg.ctx_train);
            goto fail;
        }
    if (logits_files_open(&files, &lo, &err)) goto fail;
    /* tp > 1: every rank is a thread of this process with its own model shard, joined by the
     * shared-memory host collective (the same code path as one process per rank). */
    jobs = mla_xcalloc((size_t)tp, sizeof *jobs);
    th = mla_xcalloc((size_t)tp, sizeof *th);
    char name[COLL_HOST_NAME_MAX];
    if (tp > 1) {
        coll_host_make_name(name, sizeof name);
        if (coll_host_seg_create(&seg, name, tp, 0, &err) < 0) goto fail;
    }
    for (int r = 0; r < tp; r++) {
        rank_job *j = &jobs[r];
        j->g = g, j->threads = threads, j->decode_from = decode_from, j->greedy = greedy, j->P = &P;
        j->outp = outp;
        j->fout = r == 0 ? files.out.f : NULL;
        j->fids = r == 0 ? files.ids.f : NULL;
        if (tp > 1 && coll_host_attach(&j->c, name, r, tp, 0, &err) < 0) goto fail;
    }
    for (int r = 1; r < tp; r++)
        if (pthread_create(&th[r], NULL, run_rank, &jobs[r])) MLA_PANIC("pthread_create failed");
    run_rank(&jobs[0]);
    if (jobs[0].rc < 0 && seg) coll_host_seg_abort(seg, "rank 0 failed");
    for (int r = 1; r < tp; r++) pthread_join(th[r], NULL);
    status = 0;
    for (int r = 0; r < tp; r++)
        if (jobs[r].rc < 0) {
            fprintf(stderr, "mlaserve logits: rank %d: %s\n", r, jobs[r].err.msg);
            status = 1;
        }
    goto done;
fail:
    fprintf(stderr, "mlaserve logits: %s\n", err.msg);
    status = 1;
done:
    status = logits_files_close(&files, status);
    for (int r = 0; jobs && r < tp; r++)
        if (jobs[r].c) coll_free(jobs[r].c);
    coll_host_seg_free(seg);
    free(jobs);
    free(th);
    ids_prompts_free(&P);
    if (g) gguf_close(g);
    return status;
}
