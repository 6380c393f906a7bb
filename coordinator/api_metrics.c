/* api_metrics: see api_metrics.h. */
#include "coordinator/api_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buildinfo.h"
#include "common/mla_err.h"
#include "coordinator/api_params.h"

static const double sec_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                    0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, 120.0};
static const double len_bounds[] = {1,    2,    5,     10,    20,    50,    100,    200,   500,
                                    1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};

static void hist_init(api_hist *h, const double *b, int n) {
    MLA_ASSERT(n <= API_HIST_MAX_BUCKETS);
    h->bounds = b;
    h->n_bounds = n;
}

void api_metrics_init(api_metrics *m) {
    memset(m, 0, sizeof(*m));
    const int ns = (int)(sizeof sec_bounds / sizeof *sec_bounds), nl = (int)(sizeof len_bounds / sizeof *len_bounds);
    api_hist *secs[] = {&m->ttft, &m->itl, &m->e2e, &m->queue, &m->prefill, &m->decode};
    for (size_t i = 0; i < sizeof secs / sizeof *secs; i++) hist_init(secs[i], sec_bounds, ns);
    hist_init(&m->prompt_len, len_bounds, nl);
    hist_init(&m->generation_len, len_bounds, nl);
}
void api_metrics_free(api_metrics *m) { (void)m; }

void api_hist_observe(api_hist *h, double s) {
    if (s < 0) s = 0; /* clocks of one process: never negative, but a histogram must not be */
    int i = 0;
    while (i < h->n_bounds && s > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->n++;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        MLA_ASSERT(k >= 0);
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->p = mla_xrealloc(b->p, b->cap);
    }
}

static void hist(sbuf *b, const char *name, const char *help, const api_hist *h, const char *lbl) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    sb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    sb_printf(b, "%s_sum{%s} %.15g\n%s_count{%s} %llu\n", name, lbl, h->sum, name, lbl,
              (unsigned long long)h->n);
}

/* One sample with its HELP and TYPE lines; lbl NULL: no labels. */
static void metric_int(sbuf *b, const char *name, const char *type, const char *help, const char *lbl, long long v) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s", name, help, name, type, name);
    if (lbl) sb_printf(b, "{%s}", lbl);
    sb_printf(b, " %lld\n", v);
}

/* A label value as the text exposition format takes it: valid UTF-8 (a byte that is not, as U+FFFD),
 * backslash, double quote and newline escaped; whole, however long. The caller frees it. */
static char *label_esc(const char *s) {
    size_t n = 0;
    char *u = api_utf8_sanitize(s ? s : "", s ? strlen(s) : 0, &n);
    char *o = mla_xmalloc(2 * n + 1), *q = o;
    for (size_t i = 0; i < n; i++) {
        if (u[i] == '\\' || u[i] == '"') *q++ = '\\';
        if (u[i] == '\n') {
            *q++ = '\\';
            *q++ = 'n';
        } else {
            *q++ = u[i];
        }
    }
    *q = 0;
    free(u);
    return o;
}

/* A per-worker series: HELP/TYPE then one sample per worker (rank label) that has the value. */
enum wfield {
    W_STEPS, W_STEP_S, W_DSTEPS, W_DSTEP_S, W_AR, W_AR_S, W_HB_AGE, W_MEM_FREE, W_MEM_TOTAL, W_LOAD_DONE, W_LOAD_TOTAL
};

static void worker_series(sbuf *b, const api_gauges *g, const char *name, const char *type, const char *help,
                          enum wfield f) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int r = 0; r < g->n_workers; r++) {
        const coord_worker_info *w = &g->workers[r];
        const wire_worker_stats *s = &w->stats;
        double v;
        switch (f) {
        case W_STEPS: if (!w->has_stats) continue; v = (double)s->steps; break;
        case W_STEP_S: if (!w->has_stats) continue; v = s->step_seconds; break;
        case W_DSTEPS: if (!w->has_stats) continue; v = (double)s->decode_steps; break;
        case W_DSTEP_S: if (!w->has_stats) continue; v = s->decode_seconds; break;
        case W_AR: if (!w->has_stats) continue; v = (double)s->allreduces; break;
        case W_AR_S: if (!w->has_stats) continue; v = s->allreduce_seconds; break;
        case W_HB_AGE: if (w->heartbeat_age < 0) continue; v = w->heartbeat_age; break;
        case W_MEM_FREE: if (!w->has_stats || !s->device_mem_total) continue; v = (double)s->device_mem_free; break;
        case W_MEM_TOTAL: if (!w->has_stats || !s->device_mem_total) continue; v = (double)s->device_mem_total; break;
        case W_LOAD_DONE: if (!w->load_total) continue; v = (double)w->load_done; break;
        case W_LOAD_TOTAL: if (!w->load_total) continue; v = (double)w->load_total; break;
        default: continue;
        }
        sb_printf(b, "%s{rank=\"%d\"} %.15g\n", name, r, v);
    }
}

/* The kernel configuration each GPU worker chose at load (its self-check's report): an info
 * series with the architecture, the one the kernels chose for (MLA_CUDA_SMEM_CAP), the attention
 * kernel and wgmma as labels, and the shared memory a block as gauges. Workers without one (the
 * CPU backend, not loaded yet) have no sample. */
static void worker_backend(sbuf *b, const api_gauges *g) {
    int any = 0;
    for (int r = 0; r < g->n_workers; r++) any |= g->workers[r].has_backend;
    if (!any) return;
    sb_printf(b, "# HELP mlaserve_worker_backend_info The kernel configuration a GPU worker chose at load.\n"
                 "# TYPE mlaserve_worker_backend_info gauge\n");
    for (int r = 0; r < g->n_workers; r++) {
        const wire_backend_cfg *c = &g->workers[r].backend;
        if (!g->workers[r].has_backend) continue;
        sb_printf(b,
                  "mlaserve_worker_backend_info{rank=\"%d\",arch=\"sm_%u\",arch_as=\"sm_%u\",attention=\"%s\","
                  "wgmma=\"%s\"} 1\n",
                  r, c->arch, c->arch_as, c->attention, c->wgmma ? "on" : "off");
    }
    static const char *const names[3] = {"mlaserve_worker_attention_smem_bytes", "mlaserve_worker_smem_cap_bytes",
                                         "mlaserve_worker_smem_device_bytes"};
    static const char *const helps[3] = {
        "Shared memory a block of the worker's MLA attention kernel takes (0: the fp32 kernel).",
        "Shared memory a block the worker's kernels may use (MLA_CUDA_SMEM_CAP lowers it).",
        "The device's opt-in shared memory a block."};
    for (int i = 0; i < 3; i++) {
        sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", names[i], helps[i], names[i]);
        for (int r = 0; r < g->n_workers; r++) {
            const wire_backend_cfg *c = &g->workers[r].backend;
            if (!g->workers[r].has_backend) continue;
            const uint32_t v = i == 0 ? c->attn_smem : i == 1 ? c->smem_cap : c->smem_dev;
            sb_printf(b, "%s{rank=\"%d\"} %u\n", names[i], r, v);
        }
    }
}

char *api_metrics_render(const api_metrics *m, const api_gauges *g, const char *model, size_t *len) {
    sbuf b = {mla_xmalloc(4096), 0, 4096};
    b.p[0] = 0;
    char *safe = label_esc(model), *lbl = mla_xmalloc(strlen(safe) + 10);
    sprintf(lbl, "model=\"%s\"", safe);
    free(safe);
    char *ver = label_esc(buildinfo_version()), *commit = label_esc(buildinfo_commit()),
         *type = label_esc(buildinfo_type()), *archs = label_esc(buildinfo_cuda_archs());
    sb_printf(&b, "# HELP mlaserve_build_info This build: version, commit, build type, CUDA architectures.\n"
                  "# TYPE mlaserve_build_info gauge\n"
                  "mlaserve_build_info{version=\"%s\",commit=\"%s\",build_type=\"%s\",cuda_archs=\"%s\"} 1\n",
              ver, commit, type, archs);
    free(ver);
    free(commit);
    free(type);
    free(archs);
    if (g->max_context > 0) /* known once the workers have loaded */
        sb_printf(&b, "# HELP mlaserve_model_info The model served: name, tensor-parallel degree, context limit.\n"
                      "# TYPE mlaserve_model_info gauge\n"
                      "mlaserve_model_info{%s,tp=\"%d\",max_context=\"%d\"} 1\n",
                  lbl, g->tp, (int)g->max_context);
    sb_printf(&b, "# HELP mlaserve_http_responses_total HTTP responses by status class.\n"
                  "# TYPE mlaserve_http_responses_total counter\n");
    for (int k = 2; k <= 5; k++) /* final responses: a 100 Continue is not one */
        sb_printf(&b, "mlaserve_http_responses_total{code=\"%dxx\"} %llu\n", k,
                  (unsigned long long)g->http_by_class[k]);
    sb_printf(&b, "# HELP mlaserve_requests_total Generation requests by outcome.\n"
                  "# TYPE mlaserve_requests_total counter\n");
    sb_printf(&b, "mlaserve_requests_total{%s,finish_reason=\"stop\"} %llu\n", lbl, (unsigned long long)m->finish_stop);
    sb_printf(&b, "mlaserve_requests_total{%s,finish_reason=\"length\"} %llu\n", lbl, (unsigned long long)m->finish_length);
    sb_printf(&b, "mlaserve_requests_total{%s,finish_reason=\"error\"} %llu\n", lbl, (unsigned long long)m->requests_error);
    sb_printf(&b, "mlaserve_requests_total{%s,finish_reason=\"cancelled\"} %llu\n", lbl, (unsigned long long)m->requests_cancelled);
    metric_int(&b, "mlaserve_prompt_tokens_total", "counter", "Prompt tokens received.", lbl,
               (long long)m->prompt_tokens);
    metric_int(&b, "mlaserve_generation_tokens_total", "counter", "Tokens generated.", lbl,
               (long long)m->generation_tokens);
    hist(&b, "mlaserve_time_to_first_token_seconds", "Time from request to its first token.", &m->ttft, lbl);
    hist(&b, "mlaserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &m->itl, lbl);
    hist(&b, "mlaserve_e2e_request_latency_seconds", "Time from request to its last token.", &m->e2e, lbl);
    hist(&b, "mlaserve_request_queue_time_seconds", "Time from request to its first scheduled step.", &m->queue, lbl);
    hist(&b, "mlaserve_request_prefill_time_seconds", "Time from the first scheduled step to the first token.",
         &m->prefill, lbl);
    hist(&b, "mlaserve_request_decode_time_seconds", "Time from the first token to the last.", &m->decode, lbl);
    hist(&b, "mlaserve_request_prompt_tokens", "Prompt tokens of each finished request.", &m->prompt_len, lbl);
    hist(&b, "mlaserve_request_generation_tokens", "Tokens generated by each finished request.", &m->generation_len,
         lbl);
    metric_int(&b, "mlaserve_num_requests_waiting", "gauge", "Requests waiting for admission.", lbl, g->waiting);
    metric_int(&b, "mlaserve_num_requests_running", "gauge", "Requests in the running batch.", lbl, g->running);
    metric_int(&b, "mlaserve_kv_cache_blocks_used", "gauge", "KV cache blocks held by running requests.", lbl,
               g->blocks_used);
    metric_int(&b, "mlaserve_kv_cache_blocks", "gauge",
               "KV cache blocks the scheduler hands out (the smallest rank's pool).", lbl, g->blocks_total);
    metric_int(&b, "mlaserve_kv_cache_blocks_cached", "gauge",
               "Full blocks kept for the prefix cache, free to evict.", lbl, g->blocks_cached);
    metric_int(&b, "mlaserve_kv_cache_block_size", "gauge", "Token positions per KV cache block.", lbl, g->block_size);
    metric_int(&b, "mlaserve_kv_cache_block_bytes", "gauge", "Bytes of one KV cache block on a rank.", lbl,
               g->block_bytes);
    if (g->n_ranks > 0) {
        sb_printf(&b, "# HELP mlaserve_kv_cache_rank_blocks KV cache blocks in each rank's pool.\n"
                      "# TYPE mlaserve_kv_cache_rank_blocks gauge\n");
        for (int r = 0; r < g->n_ranks; r++)
            sb_printf(&b, "mlaserve_kv_cache_rank_blocks{%s,rank=\"%d\"} %u\n", lbl, r, g->rank_blocks[r]);
        sb_printf(&b, "# HELP mlaserve_kv_cache_rank_bytes Bytes of each rank's KV cache pool.\n"
                      "# TYPE mlaserve_kv_cache_rank_bytes gauge\n");
        for (int r = 0; r < g->n_ranks; r++)
            sb_printf(&b, "mlaserve_kv_cache_rank_bytes{%s,rank=\"%d\"} %.0f\n", lbl, r,
                      (double)g->rank_blocks[r] * (double)g->block_bytes);
    }
    metric_int(&b, "mlaserve_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               lbl, g->prefix_queries);
    metric_int(&b, "mlaserve_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", lbl,
               g->prefix_hits);
    sb_printf(&b, "# HELP mlaserve_kv_cache_usage_ratio Fraction of KV cache blocks in use.\n"
                  "# TYPE mlaserve_kv_cache_usage_ratio gauge\nmlaserve_kv_cache_usage_ratio{%s} %.6f\n",
              lbl, g->blocks_total > 0 ? (double)g->blocks_used / (double)g->blocks_total : 0.0);
    metric_int(&b, "mlaserve_preemptions_total", "counter", "Sequences preempted for lack of KV cache.", lbl,
               g->preemptions);
    metric_int(&b, "mlaserve_steps_total", "counter", "Batched model steps run.", lbl, g->steps);
    metric_int(&b, "mlaserve_http_connections", "gauge", "Open HTTP connections.", NULL, g->connections);
    metric_int(&b, "mlaserve_healthy", "gauge", "1 when every worker is up and the server is not draining.", NULL, g->healthy);
    if (g->restarts >= 0)
        metric_int(&b, "mlaserve_worker_group_restarts_total", "counter",
                   "Times the worker group was started again after a failure (--on-worker-failure restart).", NULL,
                   g->restarts);
    if (g->n_workers > 0) {
        worker_series(&b, g, "mlaserve_worker_steps_total", "counter", "Steps a worker ran.", W_STEPS);
        worker_series(&b, g, "mlaserve_worker_step_seconds_total", "counter",
                      "Time a worker spent in its engine's steps.", W_STEP_S);
        worker_series(&b, g, "mlaserve_worker_decode_steps_total", "counter",
                      "Decode steps a worker's engine timed itself (CUDA: graph replays, on the device).", W_DSTEPS);
        worker_series(&b, g, "mlaserve_worker_decode_seconds_total", "counter",
                      "Their time (CUDA: on the device, between events before and after each step).", W_DSTEP_S);
        worker_series(&b, g, "mlaserve_worker_allreduces_total", "counter",
                      "All-reduces a worker timed on the host collective (none on NCCL).", W_AR);
        worker_series(&b, g, "mlaserve_worker_allreduce_seconds_total", "counter",
                      "Time in host-collective all-reduces, waiting for the other ranks included.", W_AR_S);
        worker_series(&b, g, "mlaserve_worker_heartbeat_age_seconds", "gauge",
                      "Seconds since the coordinator last heard from a worker.", W_HB_AGE);
        worker_series(&b, g, "mlaserve_worker_device_memory_free_bytes", "gauge",
                      "Free device memory a GPU worker reported.", W_MEM_FREE);
        worker_series(&b, g, "mlaserve_worker_device_memory_total_bytes", "gauge",
                      "Device memory in all a GPU worker reported.", W_MEM_TOTAL);
        worker_series(&b, g, "mlaserve_worker_load_bytes", "gauge",
                      "Bytes of the model file a worker has loaded.", W_LOAD_DONE);
        worker_series(&b, g, "mlaserve_worker_load_total_bytes", "gauge",
                      "Bytes of the model file a worker loads in all.", W_LOAD_TOTAL);
        worker_backend(&b, g);
    }
    free(lbl);
    if (len) *len = b.n;
    return b.p;
}
