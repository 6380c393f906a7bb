/* api_metrics: see api_metrics.h. */
#include "coordinator/api_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"

static const double bounds[API_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

void api_metrics_init(api_metrics *m) { memset(m, 0, sizeof(*m)); }
void api_metrics_free(api_metrics *m) { (void)m; }

void api_hist_observe(api_hist *h, double s) {
    int i = 0;
    while (i < API_HIST_BUCKETS && s > bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->n++;
}

void api_metrics_http(api_metrics *m, int status) {
    int k = status / 100;
    if (k >= 1 && k <= 5) m->http_by_status[k]++;
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
    for (int i = 0; i < API_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[API_HIST_BUCKETS];
    sb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)cum);
    sb_printf(b, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, lbl, h->sum, name, lbl,
              (unsigned long long)h->n);
}

/* One sample with its HELP and TYPE lines; lbl NULL: no labels. */
static void metric_int(sbuf *b, const char *name, const char *type, const char *help, const char *lbl, long long v) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s", name, help, name, type, name);
    if (lbl) sb_printf(b, "{%s}", lbl);
    sb_printf(b, " %lld\n", v);
}

char *api_metrics_render(const api_metrics *m, const api_gauges *g, const char *model, size_t *len) {
    sbuf b = {mla_xmalloc(4096), 0, 4096};
    b.p[0] = 0;
    char lbl[300];
    /* model names are ours (a file stem); keep label-safe characters only */
    char safe[200];
    size_t j = 0;
    for (const char *c = model ? model : ""; *c && j + 1 < sizeof(safe); c++)
        safe[j++] = (*c == '"' || *c == '\\' || *c == '\n') ? '_' : *c;
    safe[j] = 0;
    snprintf(lbl, sizeof(lbl), "model=\"%s\"", safe);
    sb_printf(&b, "# HELP mlaserve_http_responses_total HTTP responses by status class.\n"
                  "# TYPE mlaserve_http_responses_total counter\n");
    for (int k = 1; k <= 5; k++)
        sb_printf(&b, "mlaserve_http_responses_total{code=\"%dxx\"} %llu\n", k,
                  (unsigned long long)m->http_by_status[k]);
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
    metric_int(&b, "mlaserve_num_requests_waiting", "gauge", "Requests waiting for admission.", lbl, g->waiting);
    metric_int(&b, "mlaserve_num_requests_running", "gauge", "Requests in the running batch.", lbl, g->running);
    metric_int(&b, "mlaserve_kv_cache_blocks_used", "gauge", "KV cache blocks held by running requests.", lbl,
               g->blocks_used);
    metric_int(&b, "mlaserve_kv_cache_blocks_total", "gauge",
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
    metric_int(&b, "mlaserve_healthy", "gauge", "1 when every worker is up.", NULL, g->healthy);
    if (len) *len = b.n;
    return b.p;
}
