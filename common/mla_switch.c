/* mla_switch: the table of MLA_* switches and its typed getters (common/mla_switch.h). */
#include "mla_switch.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "mla_err.h"

extern char **environ;

#ifdef MLA_DEV_SWITCHES
#define DEV_BUILD true
#else
#define DEV_BUILD false
#endif

/* The table. A new switch needs a reason that a flag (common/opts.c) cannot serve: user settings
 * are flags. At most 12 rows in a build without developer switches (docs/switches.md). */
static const mla_sw_def g_table[MLA_SW_COUNT] = {
    {MLA_SW_STEP_TRACE, "MLA_STEP_TRACE", MLA_SWT_STR, "", 0, 0, NULL,
     "directory: each process writes per-step timestamps there at exit (bench/steptrace.py)", true},
    {MLA_SW_LOAD_LAYER_DELAY_MS, "MLA_LOAD_LAYER_DELAY_MS", MLA_SWT_INT, "0", 0, 600000, NULL,
     "fault injection: sleep this long after each loaded layer (a slow load)", true},
    {MLA_SW_WORKER_STEP_DELAY_MS, "MLA_WORKER_STEP_DELAY_MS", MLA_SWT_INT, "0", 0, 600000, NULL,
     "fault injection: a worker sleeps this long before each step", true},
    {MLA_SW_WORKER_HOST_SAMPLE, "MLA_WORKER_HOST_SAMPLE", MLA_SWT_BOOL, "0", 0, 0, NULL,
     "1: rows that are not greedy are sampled on rank 0's host even where the engine samples on the device "
     "(A/B of device sampling against the host sampler)", true},
    {MLA_SW_LOCAL_LINK, "MLA_LOCAL_LINK", MLA_SWT_BOOL, "1", 0, 0, NULL,
     "0: local workers get no socket-pair link, every frame goes over ZeroMQ (tests that path)", true},
    {MLA_SW_ROPE_FREQ_BF16, "MLA_ROPE_FREQ_BF16", MLA_SWT_BOOL, "0", 0, 0, NULL,
     "1: round the RoPE inverse frequencies to bf16, as the HF reference fixtures do", true},
    {MLA_SW_CUDA_ATTN, "MLA_CUDA_ATTN", MLA_SWT_ENUM, "", 0, 0, "tc|fp32",
     "CUDA attention on fp16 tensor cores (tc) or in fp32; unset: tc, fp32 in exact mode", true},
    {MLA_SW_CUDA_KV, "MLA_CUDA_KV", MLA_SWT_ENUM, "", 0, 0, "f16|f32",
     "CUDA latent cache element type; unset: f16, f32 with fp32 attention", true},
    {MLA_SW_TEST_ENGINE_DELAY_MS, "MLA_TEST_ENGINE_DELAY_MS", MLA_SWT_INT, "0", 0, 600000, NULL,
     "test engine: sleep this long inside every step, before the all-reduce", true},
    {MLA_SW_TEST_ENGINE_FAIL_LOAD, "MLA_TEST_ENGINE_FAIL_LOAD", MLA_SWT_INT, "-1", -1, 1 << 20, NULL,
     "test engine: the rank whose load fails (-1: none)", true},
    {MLA_SW_TEST_ENGINE_ID_SEED, "MLA_TEST_ENGINE_ID_SEED", MLA_SWT_STR, "", 0, 0, NULL,
     "test engine: relay an NCCL-like id made from this seed (C integer syntax) between the ranks", true},
    {MLA_SW_TEST_ENGINE_ID_CORRUPT, "MLA_TEST_ENGINE_ID_CORRUPT", MLA_SWT_INT, "0", 0, 127, NULL,
     "test engine: rank 0 flips this byte of the id before publishing it (0: none)", true},
    {MLA_SW_TEST_ENGINE_ID_NOPUB, "MLA_TEST_ENGINE_ID_NOPUB", MLA_SWT_BOOL, "0", 0, 0, NULL,
     "test engine: 1: rank 0 publishes no id (the other ranks time out)", true},
    {MLA_SW_TEST_ENGINE_STATS, "MLA_TEST_ENGINE_STATS", MLA_SWT_STR, "", 0, 0, NULL,
     "test engine: at exit each rank writes its queue counts to PATH.<rank>", true},
    /* the CUDA kernels' switches (worker/model_cuda.cu, kernels/) */
    {MLA_SW_CUDA_GRAPHS, "MLA_CUDA_GRAPHS", MLA_SWT_ENUM, "1", 0, 0, "0|1|require",
     "CUDA decode steps replayed as graphs (one rank, or NCCL); 0: launched one by one; require: "
     "fail where a step cannot be captured", false},
    {MLA_SW_CUDA_BATCHED, "MLA_CUDA_BATCHED", MLA_SWT_BOOL, "1", 0, 0, NULL,
     "0: single-token CUDA steps take the prompt path, not the batched one (and no graphs)", false},
    {MLA_SW_CUDA_Q8, "MLA_CUDA_Q8", MLA_SWT_ENUM, "", 0, 0, "0|1",
     "CUDA q8 activations for quantized weights (integer GEMV, int8 tensor cores); unset: on, off "
     "in exact mode", false},
    {MLA_SW_CUDA_SMEM_CAP, "MLA_CUDA_SMEM_CAP", MLA_SWT_ENUM, "", 0, 0, "sm120|sm100",
     "CUDA kernels choose as on a smaller part: shared memory a block capped at sm120's 99 KB or "
     "sm100's 227 KB, no sm_90a-only kernels (wgmma); checks the Blackwell paths on an H100/H200", false},
    {MLA_SW_CUDA_GEMV_TMAX, "MLA_CUDA_GEMV_TMAX", MLA_SWT_INT, "8", 1, 4096, NULL,
     "CUDA steps of more tokens than this take the fp16 tensor cores, fewer the GEMVs (the int8 tensor-core GEMV "
     "keeps its products up to 16) (tuning)", true},
    {MLA_SW_MOE_MMH_MIN, "MLA_MOE_MMH_MIN", MLA_SWT_INT, "8", 0, 1000000, NULL,
     "CUDA routed experts on the fp16 tensor cores from this many pairs a expert (0: never; tuning)",
     true},
    {MLA_SW_CUDA_GS, "MLA_CUDA_GS", MLA_SWT_STR, "", 0, 0, NULL,
     "streamed GEMV STAGES:BYTES[/STAGES:BYTES], one-token kernel / other (2-8 buffers, 4096-131072 bytes a "
     "stage; default 2:81920/3:32768; tuning)",
     true},
    {MLA_SW_CUDA_GM, "MLA_CUDA_GM", MLA_SWT_INT, "112", 32, 220, NULL,
     "streamed tensor-core GEMV: KB of shared memory a block aims at (tuning)", true},
    {MLA_SW_CUDA_GEMVM_TMIN, "MLA_CUDA_GEMVM_TMIN", MLA_SWT_INT, "2", 2, 16, NULL,
     "CUDA dense steps of this many tokens up to 16 on the int8 tensor-core GEMV, fewer on the per-warp GEMV "
     "(tuning)",
     true},
    {MLA_SW_CUDA_GEMVM_GRP, "MLA_CUDA_GEMVM_GRP", MLA_SWT_INT, "64", 0, 1 << 20, NULL,
     "CUDA routed experts of steps of 2 up to this many tokens: the tiles of experts with 2 or more pairs on the int8 "
     "tensor-core GEMV, one launch a product (0: never: the per-warp GEMV; tuning)",
     true},
    {MLA_SW_CUDA_STEPTRACE, "MLA_CUDA_STEPTRACE", MLA_SWT_STR, "", 0, 0, NULL,
     "prefix: a build with -DMLA_CUDA_STEPTRACE=ON writes every kernel's wait there (bench/steptrace.py)",
     true},
    {MLA_SW_CUDA_STEPTRACE_RECORDS, "MLA_CUDA_STEPTRACE_RECORDS", MLA_SWT_INT, "2097152", 1024, 1 << 28, NULL,
     "block records the step trace's device buffer holds (40 bytes each); launches past them are not stamped",
     true},
    {MLA_SW_CUDA_PREFILL_MIN, "MLA_CUDA_PREFILL_MIN", MLA_SWT_INT, "256", 1, 1 << 20, NULL,
     "CUDA prompt steps of one sequence from this many tokens take the non-absorbed attention (the GPU "
     "checks lower it to run the fixtures through it)",
     true},
    {MLA_SW_SCHED_HOLD, "MLA_SCHED_HOLD", MLA_SWT_INT, "0", 0, 1 << 20, NULL,
     "tests: mlaserve serve runs no step until this many requests have arrived, so that a burst "
     "meets the scheduler as one (0: none)",
     true},
};

/* MLA_* names read by the build and the test scripts, not by the programs: they may be set */
static const char *const g_external[] = {"MLA_FIXTURES"};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_read; /* 1: g_val holds the environment's values */
static const char *g_val[MLA_SW_COUNT]; /* the environment's value (NULL: unset or empty) */

/* reads the environment once */
static void read_env(void) {
    if (atomic_load_explicit(&g_read, memory_order_acquire)) return;
    pthread_mutex_lock(&g_mu);
    if (!atomic_load_explicit(&g_read, memory_order_relaxed)) {
        for (int i = 0; i < MLA_SW_COUNT; i++) {
            const char *v = getenv(g_table[i].name);
            g_val[i] = v && *v && (!g_table[i].dev_only || DEV_BUILD) ? v : NULL;
        }
        atomic_store_explicit(&g_read, 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_mu);
}

void mla_switch_reset(void) { atomic_store(&g_read, 0); }

static const mla_sw_def *row(mla_sw_id id, mla_sw_type t1, mla_sw_type t2) {
    MLA_ASSERT((int)id >= 0 && id < MLA_SW_COUNT && g_table[id].id == id);
    const mla_sw_def *d = &g_table[id];
    if (d->type != t1 && d->type != t2) MLA_PANIC("switch %s read through a getter of another type", d->name);
    read_env();
    return d;
}

/* whether s is one of the '|'-separated choices */
static bool in_choices(const char *s, const char *choices) {
    size_t n = strlen(s);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, s, n)) return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* a whole decimal integer within [lo, hi] */
static bool parse_int(const char *s, long lo, long hi, long *v) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return false;
    *v = x;
    return true;
}

/* NULL when s is a good value of d; else what d accepts (written into buf) */
static const char *expected(const mla_sw_def *d, const char *s, char *buf, size_t n) {
    long v;
    switch (d->type) {
    case MLA_SWT_BOOL:
        if (!strcmp(s, "0") || !strcmp(s, "1")) return NULL;
        snprintf(buf, n, "0 or 1");
        return buf;
    case MLA_SWT_INT:
        if (parse_int(s, d->lo, d->hi, &v)) return NULL;
        snprintf(buf, n, "an integer from %ld to %ld", d->lo, d->hi);
        return buf;
    case MLA_SWT_ENUM:
        if (in_choices(s, d->choices)) return NULL;
        snprintf(buf, n, "one of %s", d->choices);
        return buf;
    case MLA_SWT_STR:
        return NULL;
    }
    return NULL;
}

/* the value of d in force: the environment's when it is good, else the default */
static const char *value(const mla_sw_def *d) {
    const char *s = g_val[d->id];
    char buf[128];
    if (s && !expected(d, s, buf, sizeof buf)) return s;
    return d->def;
}

bool mla_sw_bool(mla_sw_id id) { return !strcmp(value(row(id, MLA_SWT_BOOL, MLA_SWT_BOOL)), "1"); }

long mla_sw_int(mla_sw_id id) {
    const mla_sw_def *d = row(id, MLA_SWT_INT, MLA_SWT_INT);
    long v = 0;
    if (!parse_int(value(d), d->lo, d->hi, &v)) MLA_PANIC("switch %s: bad default '%s'", d->name, d->def);
    return v;
}

const char *mla_sw_str(mla_sw_id id) {
    const char *v = value(row(id, MLA_SWT_STR, MLA_SWT_ENUM));
    return *v ? v : NULL;
}

bool mla_sw_is_set(mla_sw_id id) {
    MLA_ASSERT((int)id >= 0 && id < MLA_SW_COUNT);
    read_env();
    return g_val[id] != NULL;
}

const mla_sw_def *mla_sw_def_of(mla_sw_id id) {
    MLA_ASSERT((int)id >= 0 && id < MLA_SW_COUNT);
    return &g_table[id];
}

bool mla_sw_available(mla_sw_id id) { return !mla_sw_def_of(id)->dev_only || DEV_BUILD; }

bool mla_switch_dev_build(void) { return DEV_BUILD; }

/* appends "; "-separated problems to err[0..n) */
static void add_problem(char *err, size_t n, int *count, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add_problem(char *err, size_t n, int *count, const char *fmt, ...) {
    if (!n) return;
    size_t len = *count ? strlen(err) : 0;
    if (!*count) err[0] = '\0';
    if (*count && len + 2 < n) {
        memcpy(err + len, "; ", 3);
        len += 2;
    }
    if (len + 1 < n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + len, n - len, fmt, ap);
        va_end(ap);
    }
    (*count)++;
}

int mla_switch_check(char *err, size_t n) {
    int count = 0;
    char buf[128];
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "MLA_", 4)) continue;
        const char *eq = strchr(*e, '=');
        size_t nlen = eq ? (size_t)(eq - *e) : strlen(*e);
        const char *val = eq ? eq + 1 : "";
        const mla_sw_def *d = NULL;
        for (int i = 0; i < MLA_SW_COUNT && !d; i++)
            if (strlen(g_table[i].name) == nlen && !strncmp(g_table[i].name, *e, nlen)) d = &g_table[i];
        bool external = false;
        for (size_t i = 0; i < sizeof g_external / sizeof *g_external; i++)
            external |= strlen(g_external[i]) == nlen && !strncmp(g_external[i], *e, nlen);
        if (external) continue;
        if (!d || !mla_sw_available(d->id)) {
            add_problem(err, n, &count, "%.*s: unknown variable (%s; `mlaserve env` lists the switches)", (int)nlen, *e,
                        d ? "a developer switch, this build has MLA_DEV_SWITCHES=OFF" : "not a switch of this build");
            continue;
        }
        if (!*val) continue; /* empty: the default */
        const char *want = expected(d, val, buf, sizeof buf);
        if (want) add_problem(err, n, &count, "%s=%s: expected %s", d->name, val, want);
    }
    return count ? MLA_ERR : MLA_OK;
}

static const char *type_name(const mla_sw_def *d, char *buf, size_t n) {
    switch (d->type) {
    case MLA_SWT_BOOL:
        return "bool";
    case MLA_SWT_INT:
        snprintf(buf, n, "int %ld..%ld", d->lo, d->hi);
        return buf;
    case MLA_SWT_STR:
        return "string";
    case MLA_SWT_ENUM:
        snprintf(buf, n, "enum %s", d->choices);
        return buf;
    }
    return "?";
}

void mla_switch_print(FILE *f) {
    fprintf(f, "%-28s %-26s %-8s %-10s %s\n", "NAME", "TYPE", "DEFAULT", "VALUE", "MEANING");
    read_env();
    for (int i = 0; i < MLA_SW_COUNT; i++) {
        const mla_sw_def *d = &g_table[i];
        if (!mla_sw_available(d->id)) continue;
        char tb[96];
        const char *cur = getenv(d->name);
        fprintf(f, "%-28s %-26s %-8s %-10s %s%s\n", d->name, type_name(d, tb, sizeof tb), *d->def ? d->def : "-",
                cur && *cur ? cur : "-", d->dev_only ? "[dev] " : "", d->meaning);
    }
}
