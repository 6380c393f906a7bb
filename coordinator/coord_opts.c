/* coord_opts: the command-line options of the coordinator and of the commands that start a worker
 * group (coordinator/coord.h). */
#include "coord_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- options -------------------------------------------------------------------------------- */

static int opt_step_timeout(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > 24L * 3600 * 1000)
        return mla_errf(err, "'%s' is not a number of milliseconds in [0, 86400000]", v);
    cfg->step_timeout_ms = n == 0 ? -1 : (int)n;
    return MLA_OK;
}

static int opt_backend(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    if (strcmp(v, "cpu") && strcmp(v, "cuda")) return mla_errf(err, "'%s' is not cpu or cuda", v);
    cfg->backend = v;
    return MLA_OK;
}

/* BYTES with an optional K/M/G/T (powers of 1024) suffix; 0 on a bad value. */
static uint64_t parse_bytes(const char *v) {
    /* digits, a fraction only before a suffix (no sign, blank, hex or exponent: strtod's extras) */
    size_t i = 0;
    while (v[i] >= '0' && v[i] <= '9') i++;
    if (!i) return 0;
    if (v[i] == '.') {
        const size_t f = ++i;
        while (v[i] >= '0' && v[i] <= '9') i++;
        if (i == f || !strchr("KkMmGgTt", v[i]) || !v[i]) return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end != v + i || !(x > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0; end++; break;
    case 'M': case 'm': mul = 1048576.0; end++; break;
    case 'G': case 'g': mul = 1073741824.0; end++; break;
    case 'T': case 't': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end || x * mul >= 1.8e19) return 0;
    return (uint64_t)(x * mul);
}

static int opt_kv_memory(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    if (!(cfg->kv.kv_memory_bytes = parse_bytes(v)))
        return mla_errf(err, "'%s' is not a size in bytes (suffixes K, M, G, T)", v);
    return MLA_OK;
}

static const char *const failure_names[] = {"stop", "restart", "exit", NULL}; /* COORD_ON_FAILURE_* order */
static const char *const ahead_names[] = {"queue", "off", "sync", NULL};         /* WIRE_AHEAD_* order */
static const char *const nccl_names[] = {"auto", "off", "on", NULL};             /* WIRE_NCCL_* order */
static const char *const precision_names[] = {"split", "bf16", "exact", NULL};   /* WIRE_PREC_* order */
static const char *const allreduce_names[] = {"nccl", "oneshot", NULL};          /* WIRE_AR_* order */

void coord_opt_specs(coord_config *cfg, opt_spec *s) {
    const double day_ms = 24.0 * 3600 * 1000;
    const opt_spec t[COORD_N_OPTS] = {
        {.name = "--backend", .kind = OPT_FN, .arg = "cpu|cuda", .def = "cuda where a GPU is visible, else cpu",
         .help = "what the workers compute on (cpu refuses --nccl on and --cuda-precision bf16)",
         .fn = opt_backend, .ctx = cfg},
        {.name = "--coord", .kind = OPT_STR, .arg = "ENDPOINT", .def = "a fresh ipc:// path",
         .help = "control-plane bind address (tcp://HOST:PORT for workers on other hosts)", .dest = &cfg->endpoint},
        {.name = "--workers-external", .kind = OPT_FLAG, .help = "start no workers: wait for them to register",
         .dest = &cfg->external},
        {.name = "--curve-dir", .kind = OPT_STR, .arg = "DIR", .def = "none",
         .help = "CURVE keys from `mlaserve keygen DIR` (required for a non-loopback tcp:// bind)",
         .dest = &cfg->curve_dir},
        {.name = "--insecure-control-plane", .kind = OPT_FLAG,
         .help = "allow a non-loopback tcp:// control plane without CURVE", .dest = &cfg->insecure},
        {.name = "--start-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "120000",
         .help = "fail the start when no worker registers or makes load progress for this long",
         .dest = &cfg->start_timeout_ms, .lo = 1, .hi = day_ms},
        {.name = "--heartbeat-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "5000",
         .help = "a worker silent this long has failed", .dest = &cfg->heartbeat_timeout_ms, .lo = 1, .hi = day_ms},
        {.name = "--step-timeout-ms", .kind = OPT_FN, .arg = "N", .def = "600000",
         .help = "a step in flight this long fails the group (0: no limit)", .fn = opt_step_timeout, .ctx = cfg},
        {.name = "--on-worker-failure", .kind = OPT_CHOICE, .arg = "stop|restart|exit", .def = "stop",
         .help = "after a worker fails: stay failed, restart the group, or exit 1", .dest = &cfg->on_failure,
         .choices = failure_names},
        {.name = "--max-restarts", .kind = OPT_INT, .arg = "N", .def = "5",
         .help = "restarts in a row without a successful step before giving up", .dest = &cfg->max_restarts,
         .lo = 1, .hi = 1000000},
        {.name = "--gpu-memory-utilization", .kind = OPT_FLOAT, .arg = "F", .def = "0.90",
         .help = "CUDA: the fraction of each GPU's memory a worker uses in all, weights and cache pool included",
         .dest = &cfg->kv.gpu_memory_utilization, .lo = 0.01, .hi = 1},
        {.name = "--kv-memory", .kind = OPT_FN, .arg = "BYTES", .def = "CPU 1G; CUDA: from the fraction",
         .help = "the cache pool's size (suffixes K, M, G, T); on CUDA instead of the fraction", .fn = opt_kv_memory,
         .ctx = cfg},
        {.name = "--coll-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "30000",
         .help = "a host all-reduce waiting this long for the other ranks fails", .dest = &cfg->coll_timeout_ms,
         .lo = 1, .hi = 3600000},
        {.name = "--nccl-id-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "120000",
         .help = "how long the ranks wait for rank 0's NCCL id", .dest = &cfg->nccl_id_timeout_ms, .lo = 1,
         .hi = 3600000},
        {.name = "--spin-us", .kind = OPT_INT, .arg = "N", .def = "2000 with cuda, else 0",
         .help = "microseconds the step loop's threads poll before they sleep (0: no spinning)",
         .dest = &cfg->spin_us, .lo = 0, .hi = 1000000, .seen = &cfg->spin_us_given},
        {.name = "--step-ahead", .kind = OPT_CHOICE, .arg = "queue|off|sync", .def = "queue",
         .help = "greedy decode: queue the next step on the device before the result returns, run it after, or not",
         .dest = &cfg->step_ahead, .choices = ahead_names},
        {.name = "--nccl", .kind = OPT_CHOICE, .arg = "auto|off|on", .def = "auto",
         .help = "CUDA all-reduce over NCCL: where it can serve, never (host collective), or required",
         .dest = &cfg->nccl, .choices = nccl_names},
        {.name = "--cuda-precision", .kind = OPT_CHOICE, .arg = "split|bf16|exact", .def = "split",
         .help = "CUDA float weights: split bf16 pairs, plain bf16 tensor cores, or exact fp32 (reference)",
         .dest = &cfg->cuda_precision, .choices = precision_names},
        {.name = "--allreduce", .kind = OPT_CHOICE, .arg = "nccl|oneshot", .def = "nccl",
         .help = "CUDA all-reduces under 512 KB with NCCL, or one-shot through peer memory, fused with the norm "
                 "after it (every rank on one host, 2 to 8 ranks; not yet measured: docs/cuda.md)",
         .dest = &cfg->allreduce, .choices = allreduce_names},
    };
    memcpy(s, t, sizeof t);
}

/* ---- commands that start a worker group ---------------------------------------------------- */

void coord_group_opt_specs(coord_group_opts *o, opt_spec *s) {
    if (o->tp == 0) o->tp = 1;
    if (o->threads == 0) o->threads = 1;
    const opt_spec t[COORD_GROUP_N_OPTS] = {
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH",
         .help = "the GGUF file (of a split model: its first part, *-00001-of-*.gguf)", .dest = &o->model},
        {.name = "--tp", .kind = OPT_INT, .arg = "N", .def = "1",
         .help = "tensor-parallel degree: worker processes, one per GPU", .dest = &o->tp, .lo = 1, .hi = WIRE_MAX_WORLD},
        {.name = "--threads", .kind = OPT_INT, .arg = "N", .def = "1", .help = "CPU threads per worker",
         .dest = &o->threads, .lo = 1, .hi = 1024},
        {.name = "--worker-exe", .kind = OPT_STR, .arg = "PATH", .def = "mlaserve-worker beside mlaserve",
         .help = "the worker program", .dest = &o->worker_exe},
    };
    memcpy(s, t, sizeof t);
}

/* The CUDA settings that ask for something the CPU backend does not do (NCCL, bf16 products):
 * refused with --backend cpu rather than ignored (--allreduce oneshot: by the workers, which
 * know their devices). */
static int cpu_conflicts(const coord_config *cc, mla_err *err) {
    if (!cc->backend || strcmp(cc->backend, "cpu")) return MLA_OK;
    const char *what = cc->nccl == WIRE_NCCL_REQUIRED       ? "--nccl on"
                       : cc->cuda_precision == WIRE_PREC_BF16 ? "--cuda-precision bf16"
                                                             : NULL;
    if (what) return mla_errf(err, "%s is a CUDA setting: the CPU backend (--backend cpu) does not do it", what);
    return MLA_OK;
}

int coord_group_start(const coord_group_opts *o, const gguf_ctx *g, coord **c, mla_err *err) {
    *c = NULL;
    if (cpu_conflicts(&o->cc, err)) return MLA_ERR;
    if (coord_check_model(g, o->tp, NULL, err)) return mla_err_prefix(err, "%s", o->model);
    coord_config cfg = o->cc;
    cfg.world = o->tp;
    cfg.model_path = o->model;
    cfg.model_hash = gguf_index_hash(g);
    cfg.worker_exe = o->worker_exe;
    cfg.n_threads = o->threads;
    if (coord_start(c, &cfg, err)) {
        char what[64];
        return mla_err_prefix(err, "%s", coord_start_what(what, sizeof what, o->tp, cfg.external));
    }
    return MLA_OK;
}
