/* coordinator/api_metrics.c: the per-worker kernel configuration series of /metrics (a CUDA
 * worker's backend info, sent with its loaded frame; none for a worker without one, as the CPU
 * backend's) and the heartbeat's stats series (a sample for each worker that sent stats). */
#include <stdlib.h>
#include <string.h>

#include "api_metrics.h"
#include "mla_test.h"

/* /metrics over the two workers w (n: its length) */
static char *render2(api_metrics *m, coord_worker_info *w, size_t *n) {
    api_gauges g = {0};
    g.workers = w;
    g.n_workers = 2;
    return api_metrics_render(m, &g, "m", n);
}

static void test_backend_info(void) {
    api_metrics m;
    api_metrics_init(&m);
    coord_worker_info w[2];
    memset(w, 0, sizeof w);
    w[0].registered = w[0].loaded = 1;
    w[0].has_backend = 1;
    w[0].backend = (wire_backend_cfg){.arch = 90, .arch_as = 120, .attention = "tc16", .attn_smem = 77056,
                                      .smem_cap = 101376, .smem_dev = 232448, .wgmma = false};
    w[1].registered = w[1].loaded = 1; /* no configuration: no samples */
    size_t n = 0;
    char *t = render2(&m, w, &n);
    REQUIRE(t != NULL && n == strlen(t));
    CHECK(strstr(t, "# TYPE mlaserve_worker_backend_info gauge\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_backend_info{rank=\"0\",arch=\"sm_90\",arch_as=\"sm_120\",attention=\"tc16\","
                    "wgmma=\"off\"} 1\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_attention_smem_bytes{rank=\"0\"} 77056\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_smem_cap_bytes{rank=\"0\"} 101376\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_smem_device_bytes{rank=\"0\"} 232448\n") != NULL);
    CHECK(strstr(t, "{rank=\"1\",arch=") == NULL && strstr(t, "mlaserve_worker_smem_cap_bytes{rank=\"1\"}") == NULL);
    free(t);
    /* no worker with a configuration (the CPU backend): no series at all */
    w[0].has_backend = 0;
    t = render2(&m, w, &n);
    REQUIRE(t != NULL);
    CHECK(strstr(t, "mlaserve_worker_backend_info") == NULL && strstr(t, "mlaserve_worker_smem_cap_bytes") == NULL);
    free(t);
    api_metrics_free(&m);
}

static void test_worker_stats(void) {
    api_metrics m;
    api_metrics_init(&m);
    coord_worker_info w[2];
    memset(w, 0, sizeof w);
    w[0].registered = w[0].loaded = 1;
    w[0].has_stats = 1;
    w[0].stats = (wire_worker_stats){.steps = 50, .step_seconds = 2.5, .decode_steps = 40, .decode_seconds = 0.0825,
                                     .allreduces = 1234567891234};
    w[0].load_done = w[0].load_total = 9358582784ull; /* a 9 GB file: every digit, not 9.35858278e+09 */
    w[1].registered = 1; /* no heartbeat stats yet: no samples */
    size_t n = 0;
    char *t = render2(&m, w, &n);
    REQUIRE(t != NULL);
    CHECK(strstr(t, "# TYPE mlaserve_worker_decode_steps_total counter\n") != NULL);
    CHECK(strstr(t, "# TYPE mlaserve_worker_decode_seconds_total counter\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_steps_total{rank=\"0\"} 50\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_decode_steps_total{rank=\"0\"} 40\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_decode_seconds_total{rank=\"0\"} 0.0825\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_allreduces_total{rank=\"0\"} 1234567891234\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_load_total_bytes{rank=\"0\"} 9358582784\n") != NULL);
    CHECK(strstr(t, "mlaserve_worker_decode_steps_total{rank=\"1\"}") == NULL &&
          strstr(t, "mlaserve_worker_decode_seconds_total{rank=\"1\"}") == NULL);
    free(t);
    api_metrics_free(&m);
}

/* The model's name as a label value, whole: a backslash, a double quote and a newline escaped as
 * the text format says, a multi-byte character kept past 200 bytes, a byte that is not UTF-8 as
 * U+FFFD (a name once cut to 199 bytes inside a character made the whole scrape unparseable). */
static void test_model_label(void) {
    api_metrics m;
    api_metrics_init(&m);
    api_gauges g = {0};
    g.max_context = 512;
    g.tp = 1;
    char name[300];
    memset(name, 'a', 198);
    strcpy(name + 198, "\xe2\x82\xac\xe2\x82\xac\"q\\b\nc\xff");
    size_t n = 0;
    char *t = api_metrics_render(&m, &g, name, &n);
    char want[400];
    memset(want, 'a', 198);
    strcpy(want + 198, "\xe2\x82\xac\xe2\x82\xac\\\"q\\\\b\\nc\xef\xbf\xbd\",tp=\"1\"");
    CHECKF(t && strstr(t, want), "the model label, escaped and whole: %.300s", t ? strstr(t, "mlaserve_model_info{") : "");
    free(t);
    api_metrics_free(&m);
}

int main(void) {
    test_model_label();
    test_backend_info();
    test_worker_stats();
    return mla_test_finish();
}
