/* sampler: greedy = argmax; top_k 1 = greedy; seeds reproduce; empirical distributions over many
 * draws (fixed seeds, so deterministic) match the expected probabilities, computed here in double
 * from the definitions, within a chi-square bound; penalties; logprobs. */
#include <math.h>
#include <stdint.h>

#include "mla_test.h"
#include "sample.h"

static wire_sampling base(void) {
    wire_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.top_p = 1.0f;
    sp.repetition_penalty = 1.0f;
    sp.temperature = 1.0f;
    return sp;
}

/* chi-square statistic of counts against probabilities (cells with p = 0 must have count 0) */
static double chi2(const int *cnt, const double *p, int n, int draws, int *impossible) {
    double x = 0;
    *impossible = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (cnt[i]) (*impossible)++;
            continue;
        }
        double e = p[i] * draws;
        x += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    return x;
}

static void expect_dist(const float *logits, int V, const wire_sampling *sp, const double *p,
                        const char *what) {
    sampler *s = sampler_new((uint32_t)V);
    int cnt[16] = {0};
    const int draws = 40000;
    for (int d = 0; d < draws; d++) {
        sample_out o;
        sampler_sample(s, logits, sp, NULL, 0, (uint64_t)d, &o);
        REQUIRE(o.token >= 0 && o.token < V);
        cnt[o.token]++;
    }
    int imp;
    double x = chi2(cnt, p, V, draws, &imp);
    /* df <= 7: P(chi2 > 40) < 1e-5 */
    CHECKF(x < 40 && imp == 0, "%s: chi2 %.2f, impossible draws %d", what, x, imp);
    sampler_free(s);
}

static void softmax_d(const float *l, int n, double t, double *p) {
    double mx = -INFINITY, tot = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++) tot += (p[i] = exp((l[i] - mx) / t));
    for (int i = 0; i < n; i++) p[i] /= tot;
}

static void test_distributions(void) {
    const float l[8] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f};
    double p[8];
    wire_sampling sp = base();
    softmax_d(l, 8, 1.0, p);
    expect_dist(l, 8, &sp, p, "t=1");
    sp.temperature = 0.5f;
    softmax_d(l, 8, 0.5, p);
    expect_dist(l, 8, &sp, p, "t=0.5");
    sp.temperature = 2.0f;
    softmax_d(l, 8, 2.0, p);
    expect_dist(l, 8, &sp, p, "t=2");

    /* top_k = 3: tokens 6, 1, 4 only */
    sp = base();
    sp.top_k = 3;
    {
        float sub[3] = {l[6], l[1], l[4]};
        double q[3];
        softmax_d(sub, 3, 1.0, q);
        memset(p, 0, sizeof p);
        p[6] = q[0], p[1] = q[1], p[4] = q[2];
        expect_dist(l, 8, &sp, p, "top_k=3");
    }
    /* top_p: probabilities 0.5, 0.3, 0.15, 0.05; top_p 0.75 keeps the first two */
    const float lp[4] = {(float)log(0.5), (float)log(0.3), (float)log(0.15), (float)log(0.05)};
    sp = base();
    sp.top_p = 0.75f;
    double pp[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    expect_dist(lp, 4, &sp, pp, "top_p=0.75");
    sp.top_p = 0.9f; /* 0.5 + 0.3 = 0.8 < 0.9: three kept */
    double pp3[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    expect_dist(lp, 4, &sp, pp3, "top_p=0.9");
    /* min_p 0.2: keep p >= 0.1 -> three kept */
    sp = base();
    sp.min_p = 0.2f;
    expect_dist(lp, 4, &sp, pp3, "min_p=0.2");
    sp.min_p = 0.5f; /* keep p >= 0.25 */
    expect_dist(lp, 4, &sp, pp, "min_p=0.5");
}

static void test_greedy_and_seeds(void) {
    enum { V = 1000 };
    float *l = malloc(V * sizeof *l);
    uint64_t st = 12345;
    for (int i = 0; i < V; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 10.0 - 5.0);
    }
    int am = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[am]) am = i;
    sampler *s = sampler_new(V);
    wire_sampling sp = base();
    sp.temperature = 0;
    sample_out o, o2;
    sampler_sample(s, l, &sp, NULL, 0, 0, &o);
    CHECK(o.token == am);
    sp = base();
    sp.top_k = 1;
    sp.temperature = 3.0f;
    for (int d = 0; d < 50; d++) {
        sampler_sample(s, l, &sp, NULL, 0, (uint64_t)d, &o);
        CHECK(o.token == am);
    }
    /* same seed + stream -> same token; different seeds -> not always the same */
    sp = base();
    sp.seed = 7;
    int differ = 0;
    for (int d = 0; d < 50; d++) {
        sampler_sample(s, l, &sp, NULL, 0, (uint64_t)d, &o);
        sampler_sample(s, l, &sp, NULL, 0, (uint64_t)d, &o2);
        CHECK(o.token == o2.token);
        wire_sampling sp2 = sp;
        sp2.seed = 8;
        sampler_sample(s, l, &sp2, NULL, 0, (uint64_t)d, &o2);
        if (o2.token != o.token) differ++;
    }
    CHECK(differ > 10);
    /* logprobs: raw log-softmax; top list sorted and starting with the argmax */
    sp = base();
    sp.temperature = 0;
    sp.logprobs = true;
    sp.top_logprobs = 5;
    sampler_sample(s, l, &sp, NULL, 0, 0, &o);
    double mx = -INFINITY, se = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) se += exp(l[i] - mx);
    double lse = mx + log(se);
    CHECKF(fabs(o.logprob - (l[am] - lse)) < 1e-5, "logprob %g vs %g", o.logprob, l[am] - lse);
    CHECK(o.n_top == 5 && o.top[0].token == am);
    for (uint32_t k = 1; k < o.n_top; k++) CHECK(o.top[k].logprob <= o.top[k - 1].logprob);
    int above = 0; /* exactly 4 tokens have a larger logit than top[4] */
    for (int i = 0; i < V; i++)
        if (l[i] > l[o.top[4].token]) above++;
    CHECK(above == 4);
    CHECK(fabs(o.top[2].logprob - (l[o.top[2].token] - lse)) < 1e-5);
    sampler_free(s);
    free(l);
}

static void test_penalties(void) {
    /* logits: token 0 best (3.0), token 1 (2.5), token 2 (-1.0), token 3 (-0.9) */
    const float l[4] = {3.0f, 2.5f, -1.0f, -0.9f};
    sampler *s = sampler_new(4);
    sample_out o;
    wire_sampling sp = base();
    sp.temperature = 0;
    int32_t hist[3] = {0, 0, 3};
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 0); /* no penalty */
    sp.repetition_penalty = 1.5f; /* 3.0 / 1.5 = 2.0 < 2.5 */
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 1);
    sp.repetition_penalty = 1.1f; /* 2.727 > 2.5 */
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 0);
    sp.repetition_penalty = 1.0f;
    sp.frequency_penalty = 0.3f; /* 3.0 - 0.6 = 2.4 < 2.5 */
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 1);
    sp.frequency_penalty = 0.2f; /* 2.6 > 2.5 */
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 0);
    sp.frequency_penalty = 0;
    sp.presence_penalty = 0.6f; /* 2.4 < 2.5, once regardless of count */
    sampler_sample(s, l, &sp, hist, 3, 0, &o);
    CHECK(o.token == 1);
    /* with the history's first tokens the prompt's: the repetition penalty counts them, presence
     * and frequency only the generated ones. hist = {0, 0 | 3}: token 0 in the prompt only. */
    sp = base();
    sp.temperature = 0;
    sp.frequency_penalty = 0.3f; /* token 0 unpenalized: 3.0 */
    sampler_sample_mod(s, l, &sp, NULL, hist, 3, 2, 0, &o);
    CHECK(o.token == 0);
    sp.frequency_penalty = 0;
    sp.presence_penalty = 0.6f;
    sampler_sample_mod(s, l, &sp, NULL, hist, 3, 2, 0, &o);
    CHECK(o.token == 0);
    sampler_sample_mod(s, l, &sp, NULL, hist, 3, 1, 0, &o); /* {0 | 0, 3}: 3.0 - 0.6 */
    CHECK(o.token == 1);
    sp.presence_penalty = 0;
    sp.frequency_penalty = 0.3f; /* one generated 0: 3.0 - 0.3 = 2.7 > 2.5 */
    sampler_sample_mod(s, l, &sp, NULL, hist, 3, 1, 0, &o);
    CHECK(o.token == 0);
    sp.frequency_penalty = 0;
    sp.repetition_penalty = 1.5f; /* the prompt's 0 counts: 3.0 / 1.5 = 2.0 < 2.5 */
    sampler_sample_mod(s, l, &sp, NULL, hist, 3, 3, 0, &o);
    CHECK(o.token == 1);
    /* the generated 3 (logit -0.9) above 2 (-1.0), pushed below it by presence from 1 on */
    const float l2[4] = {-5.0f, -5.0f, -1.0f, -0.9f};
    sp = base();
    sp.temperature = 0;
    sp.presence_penalty = 0.5f;
    sampler_sample_mod(s, l2, &sp, NULL, hist, 3, 3, 0, &o); /* all prompt: 3 unpenalized */
    CHECK(o.token == 3);
    sampler_sample_mod(s, l2, &sp, NULL, hist, 3, 2, 0, &o);
    CHECK(o.token == 2);
    /* repetition penalty multiplies negative logits: token 3 (-0.9 * 2 = -1.8) drops below 2 */
    sp.presence_penalty = 0;
    sp.repetition_penalty = 2.0f;
    sampler_sample(s, l2, &sp, hist, 3, 0, &o);
    CHECK(o.token == 2);
    /* penalties do not stick between calls (counts reset) */
    sp.repetition_penalty = 1.0f;
    sampler_sample(s, l2, &sp, NULL, 0, 0, &o);
    CHECK(o.token == 3);
    /* logprob reports the raw distribution, not the penalised one */
    sp.repetition_penalty = 2.0f;
    sp.logprobs = true;
    sampler_sample(s, l2, &sp, hist, 3, 0, &o);
    double p[4];
    softmax_d(l2, 4, 1.0, p);
    CHECK(fabs(o.logprob - log(p[2])) < 1e-5);
    sampler_free(s);
}

static void test_uniform(void) {
    /* the draw is uniform-ish: mean and bucket counts */
    int b[10] = {0};
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = sampler_uniform(99, (uint64_t)i);
        REQUIRE(u >= 0 && u < 1);
        sum += u;
        b[(int)(u * 10)]++;
    }
    CHECK(fabs(sum / 100000 - 0.5) < 0.01);
    double p[10];
    for (int i = 0; i < 10; i++) p[i] = 0.1;
    int imp;
    CHECK(chi2(b, p, 10, 100000, &imp) < 45);
}

/* sample_mod: a mask and logit biases (OpenAI semantics), the logprobs of the modified distribution */
static void test_mod(void) {
    const uint32_t V = 6;
    const float logits[6] = {3.0f, 1.0f, 0.5f, 2.0f, -1.0f, 0.0f};
    sampler *s = sampler_new(V);
    wire_sampling sp = base();
    sp.temperature = 0;
    sp.logprobs = true;
    sp.top_logprobs = 5;
    sample_out o;
    /* +100 on token 4 wins greedy; its logprob is that of the biased softmax */
    int32_t bid[2] = {4, 0};
    float bval[2] = {100.0f, -100.0f};
    sample_mod mod = {NULL, bid, bval, 2};
    sampler_sample_mod(s, logits, &sp, &mod, NULL, 0, 0, 1, &o);
    CHECK(o.token == 4);
    double z = 0;
    double biased[6];
    for (uint32_t i = 0; i < V; i++) {
        biased[i] = logits[i] + (i == 4 ? 100.0 : i == 0 ? -100.0 : 0.0);
        z += exp(biased[i] - 99.0);
    }
    CHECKF(fabs(o.logprob - (biased[4] - 99.0 - log(z))) < 1e-5, "logprob %g", o.logprob);
    /* -100 on the argmax bans it: the next best */
    mod.n_bias = 1;
    bid[0] = 0;
    bval[0] = -100.0f;
    sampler_sample_mod(s, logits, &sp, &mod, NULL, 0, 0, 1, &o);
    CHECK(o.token == 3);
    /* a mask: only tokens 1 and 2; the top logprobs list only them, normalised over them */
    uint8_t allow[6] = {0, 1, 1, 0, 0, 0};
    sample_mod m2 = {allow, NULL, NULL, 0};
    sampler_sample_mod(s, logits, &sp, &m2, NULL, 0, 0, 1, &o);
    CHECK(o.token == 1 && o.n_top == 2 && o.top[0].token == 1 && o.top[1].token == 2);
    double lz = log(exp(1.0) + exp(0.5));
    CHECK(fabs(o.top[0].logprob - (1.0 - lz)) < 1e-5 && fabs(o.top[1].logprob - (0.5 - lz)) < 1e-5);
    /* sampled draws never leave the mask */
    sp.temperature = 1.5f;
    sp.top_k = 0;
    int bad = 0;
    for (uint64_t st = 0; st < 2000; st++) {
        sampler_sample_mod(s, logits, &sp, &m2, NULL, 0, 0, st, &o);
        bad += !allow[o.token];
    }
    CHECK(bad == 0);
    sampler_free(s);
}

/* ---- the cuts over a large vocabulary: the sorted prefix the sampler builds a piece at a time
 * (select, then sort; grown fourfold where top_p or min_p walks past it) against a full sort */
static const float *g_w;
static int cmp_ref(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (g_w[x] != g_w[y]) return g_w[x] > g_w[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* The reference token (sample.h's definition: a full sort where a cut is asked for, else the
 * tokens in id order) and how near its cuts fall to a
 * boundary (the smallest distance, relative to the mass, of the top_p limit and of the draw from
 * a cumulative sum), for a row without penalties. */
static int32_t ref_token(const float *w, uint32_t V, const wire_sampling *sp, uint64_t stream, double *margin) {
    uint32_t *idx = malloc(V * sizeof *idx);
    double *p = malloc(V * sizeof *p);
    for (uint32_t i = 0; i < V; i++) idx[i] = i;
    g_w = w;
    uint32_t n = sp->top_k > 0 && (uint32_t)sp->top_k < V ? (uint32_t)sp->top_k : V;
    double mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = fmax(mx, (double)w[i]);
    const double invt = 1.0 / sp->temperature;
    if (n < V || sp->top_p < 1.0f || sp->min_p > 0) qsort(idx, V, sizeof *idx, cmp_ref); /* else: in id order */
    double tot = 0;
    for (uint32_t j = 0; j < n; j++) tot += p[j] = exp(((double)w[idx[j]] - mx) * invt);
    *margin = INFINITY;
    if (sp->top_p < 1.0f) {
        double cum = 0, lim = (double)sp->top_p * tot;
        uint32_t keep = 0;
        while (keep < n) {
            cum += p[keep++];
            *margin = fmin(*margin, fabs(cum - lim) / tot);
            if (cum >= lim) break;
        }
        n = keep;
    }
    if (sp->min_p > 0) {
        uint32_t keep = 1;
        while (keep < n && p[keep] >= (double)sp->min_p * p[0]) keep++;
        n = keep;
    }
    double t2 = 0;
    for (uint32_t j = 0; j < n; j++) t2 += p[j];
    const double u = sampler_uniform(sp->seed, stream) * t2;
    double cum = 0;
    uint32_t j = 0;
    for (; j + 1 < n; j++) {
        cum += p[j];
        *margin = fmin(*margin, fabs(cum - u) / t2);
        if (u < cum) break;
    }
    const int32_t t = (int32_t)idx[j];
    free(idx);
    free(p);
    return t;
}

static void test_large_cuts(void) {
    enum { V = 20000 };
    float *w = malloc(V * sizeof *w);
    sampler *s = sampler_new(V);
    uint64_t x = 99;
    int rows = 0, differ = 0, unexplained = 0;
    const float temps[] = {0.5f, 1.0f, 2.0f};
    const float tops[] = {0.5f, 0.9f, 0.99f, 1.0f};
    const float minps[] = {0, 0.001f, 0.05f};
    const int32_t topks[] = {0, 50, 3000, 19999};
    for (int shape = 0; shape < 3; shape++) {
        for (uint32_t i = 0; i < V; i++) { /* peaked, flat, and in steps of 1/4 (many ties) */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(x >> 11) / 9007199254740992.0;
            w[i] = shape == 0 ? (float)(8 * u * u * u * u) : shape == 1 ? (float)(2 * u) : (float)floor(u * 12) / 4;
        }
        for (size_t a = 0; a < 3; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t c = 0; c < 3; c++)
                    for (size_t d = 0; d < 4; d++) {
                        wire_sampling sp = base();
                        sp.temperature = temps[a];
                        sp.top_p = tops[b];
                        sp.min_p = minps[c];
                        sp.top_k = topks[d];
                        sp.seed = 1000 + (uint64_t)(a * 100 + b * 10 + c + d * 1000);
                        for (uint64_t st = 0; st < 4; st++) {
                            sample_out o;
                            sampler_sample(s, w, &sp, NULL, 0, st, &o);
                            double margin;
                            const int32_t want = ref_token(w, V, &sp, st, &margin);
                            rows++;
                            if (o.token != want) {
                                differ++;
                                if (!(margin < 1e-9)) unexplained++;
                            }
                        }
                    }
    }
    CHECKF(rows == 3 * 3 * 4 * 3 * 4 * 4, "large cuts: %d rows", rows);
    CHECKF(unexplained == 0 && differ * 200 <= rows,
           "large cuts: %d of %d tokens differ from a full sort (%d not at a rounding boundary)", differ, rows,
           unexplained);
    sampler_free(s);
    free(w);
}

int main(void) {
    test_large_cuts();
    test_mod();
    test_distributions();
    test_greedy_and_seeds();
    test_penalties();
    test_uniform();
    return mla_test_finish();
}
