/* api_metrics: the server's counters and histograms in Prometheus text format (names and their
 * vLLM counterparts: docs/metrics.md). Loop thread only (no locking). Ownership: plain struct
 * owned by the caller (init/free); api_metrics_render returns a malloc'd string. */
#ifndef API_METRICS_H
#define API_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"

#define API_HIST_MAX_BUCKETS 20

typedef struct api_hist {
    const double *bounds; /* upper bounds, increasing (api_metrics_init sets them) */
    int n_bounds;
    uint64_t counts[API_HIST_MAX_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} api_hist;

typedef struct api_metrics {
    uint64_t requests_ok, requests_error, requests_cancelled;
    uint64_t finish_stop, finish_length;
    uint64_t prompt_tokens, generation_tokens;
    api_hist ttft, itl, e2e;                 /* seconds */
    api_hist queue, prefill, decode;         /* seconds: arrival -> first scheduled -> first token -> last token */
    api_hist prompt_len, generation_len;     /* tokens a finished request had / generated */
} api_metrics;

void api_metrics_init(api_metrics *m);
void api_metrics_free(api_metrics *m);
void api_hist_observe(api_hist *h, double v);

/* Scheduler-side gauges and the worker group, read at scrape time. */
typedef struct api_gauges {
    int64_t waiting, running, blocks_used, blocks_total, block_size;
    int64_t blocks_cached;           /* full blocks kept for the prefix cache, evictable */
    int64_t prefix_queries, prefix_hits; /* prompt tokens looked up in the prefix cache, found */
    int64_t block_bytes;             /* one block's bytes on a rank */
    const uint32_t *rank_blocks;     /* the blocks each rank's pool holds (n_ranks of them) */
    int n_ranks;
    int64_t preemptions, steps;
    int64_t connections;
    uint64_t http_by_class[6];       /* HTTP responses begun, 1xx..5xx at status/100 (http_server_responses) */
    int healthy;
    int64_t restarts;                     /* the worker group's restarts so far; -1: not known */
    int tp;                               /* tensor-parallel degree (0: unknown) */
    int32_t max_context;                  /* 0: not known yet (no mlaserve_model_info) */
    const coord_worker_info *workers;     /* [n_workers], may be NULL */
    int n_workers;
} api_gauges;

/* Appends the exposition text to a malloc'd string (caller frees). */
char *api_metrics_render(const api_metrics *m, const api_gauges *g, const char *model, size_t *len);

#endif
