#include "sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    uint32_t n_vocab;
    float *w;         /* working logits */
    uint32_t *count;  /* history counts (touched entries reset after use) */
    uint32_t *idx;    /* candidate ids */
    double *p;        /* candidate probabilities */
    float *m;         /* logits under a sample_mod */
};

sampler *sampler_new(uint32_t n_vocab) {
    MLA_ASSERT(n_vocab > 0);
    sampler *s = mla_xcalloc(1, sizeof *s);
    s->n_vocab = n_vocab;
    s->w = mla_xmalloc(n_vocab * sizeof *s->w);
    s->count = mla_xcalloc(n_vocab, sizeof *s->count);
    s->idx = mla_xmalloc(n_vocab * sizeof *s->idx);
    s->p = mla_xmalloc(n_vocab * sizeof *s->p);
    s->m = mla_xmalloc(n_vocab * sizeof *s->m);
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->w);
    free(s->count);
    free(s->idx);
    free(s->p);
    free(s->m);
    free(s);
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sampler_uniform(uint64_t seed, uint64_t stream) {
    uint64_t r = mix64(mix64(seed) ^ mix64(stream ^ 0x5851f42d4c957f2dull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* sort helpers: descending by value, ascending id on ties */
static _Thread_local const float *t_sort_w;
static int cmp_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    float vx = t_sort_w[x], vy = t_sort_w[y];
    if (vx > vy) return -1;
    if (vx < vy) return 1;
    return x < y ? -1 : x > y;
}

/* whether token x comes before token y in the sort order (cmp_desc) */
static inline int before(const float *w, uint32_t x, uint32_t y) {
    return w[x] > w[y] || (!(w[x] < w[y]) && x < y);
}

static inline void swap_u32(uint32_t *a, uint32_t *b) {
    uint32_t t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k tokens of idx[0, n) that come first in the sort order to idx[0, k), in no order (a
 * quickselect; the order is total: ids break ties). */
static void select_first(uint32_t *idx, uint32_t n, uint32_t k, const float *w) {
    uint32_t lo = 0, hi = n;
    while (k > lo && k < hi && hi - lo > 1) {
        uint32_t a = lo, b = lo + (hi - lo) / 2, c = hi - 1; /* the median of three as the pivot */
        if (before(w, idx[b], idx[a])) swap_u32(&idx[a], &idx[b]);
        if (before(w, idx[c], idx[b])) swap_u32(&idx[b], &idx[c]);
        if (before(w, idx[b], idx[a])) swap_u32(&idx[a], &idx[b]);
        swap_u32(&idx[b], &idx[c]);
        const uint32_t piv = idx[c];
        uint32_t st = lo;
        for (uint32_t i = lo; i < c; i++)
            if (before(w, idx[i], piv)) swap_u32(&idx[i], &idx[st++]);
        swap_u32(&idx[st], &idx[c]);
        if (k <= st) hi = st;
        else if (k == st + 1) return;
        else lo = st + 1;
    }
}

/* Candidates sorted first for top_p / min_p: the walk seldom goes past them; when it does, the
 * sorted prefix grows fourfold at a time (sort_more). */
#define SAMPLE_CAND 1024u

/* Grows the sorted prefix idx[0, *m) of idx[0, n) (its tokens come before the others) to the
 * first 4 x *m tokens of the sort order (at most n), and computes their p (the row's weights
 * after mx, at 1 / temperature invt). */
static void sort_more(sampler *s, const float *w, uint32_t *m, uint32_t n, double mx, double invt) {
    const uint32_t add = n - *m < 3 * *m ? n - *m : 3 * *m;
    select_first(s->idx + *m, n - *m, add, w);
    t_sort_w = w;
    qsort(s->idx + *m, add, sizeof *s->idx, cmp_desc);
    for (uint32_t j = *m; j < *m + add; j++) s->p[j] = exp(((double)w[s->idx[j]] - mx) * invt);
    *m += add;
}

static void top_logprobs(const float *logits, uint32_t V, double lse, uint32_t n, sample_out *out) {
    /* insertion into a small sorted list: O(V n), n <= 20 */
    uint32_t best[WIRE_MAX_TOP_LOGPROBS];
    uint32_t k = 0;
    for (uint32_t i = 0; i < V; i++) {
        float v = logits[i];
        if (k == n && !(v > logits[best[k - 1]])) continue;
        uint32_t j = k < n ? k++ : k - 1;
        while (j > 0 && v > logits[best[j - 1]]) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = i;
    }
    out->n_top = k;
    for (uint32_t j = 0; j < k; j++) {
        out->top[j].token = (int32_t)best[j];
        out->top[j].logprob = (float)((double)logits[best[j]] - lse);
    }
}

void sampler_sample(sampler *s, const float *logits, const wire_sampling *sp, const int32_t *history,
                    size_t n_history, uint64_t stream, sample_out *out) {
    sampler_sample_mod(s, logits, sp, NULL, history, n_history, 0, stream, out);
}

void sampler_sample_mod(sampler *s, const float *logits, const wire_sampling *sp, const sample_mod *mod,
                        const int32_t *history, size_t n_history, size_t n_prompt_hist, uint64_t stream,
                        sample_out *out) {
    const uint32_t V = s->n_vocab;
    if (mod && (mod->allow || mod->n_bias)) {
        float *m = s->m;
        memcpy(m, logits, V * sizeof *m);
        for (uint32_t k = 0; k < mod->n_bias; k++)
            if (mod->bias_ids[k] >= 0 && (uint32_t)mod->bias_ids[k] < V) m[mod->bias_ids[k]] += mod->bias_vals[k];
        if (mod->allow)
            for (uint32_t i = 0; i < V; i++)
                if (!mod->allow[i]) m[i] = -INFINITY;
        logits = m;
    }
    memset(out, 0, sizeof *out);
    float *w = s->w;
    memcpy(w, logits, V * sizeof *w);

    /* penalties */
    int pen = sp->repetition_penalty != 1.0f || sp->presence_penalty != 0 || sp->frequency_penalty != 0;
    if (pen && n_history) {
        /* count[t]: 1 for a token of the history, plus its generated occurrences */
        for (size_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t >= 0 && (uint32_t)t < V) s->count[t] += (uint32_t)(s->count[t] == 0) + (uint32_t)(i >= n_prompt_hist);
        }
        for (size_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || (uint32_t)t >= V || s->count[t] == 0) continue;
            uint32_t c = s->count[t] - 1; /* generated occurrences */
            s->count[t] = 0; /* handle each distinct token once, and reset */
            float v = w[t];
            if (sp->repetition_penalty != 1.0f)
                v = v > 0 ? v / sp->repetition_penalty : v * sp->repetition_penalty;
            if (c) v -= sp->frequency_penalty * (float)c + sp->presence_penalty;
            w[t] = v;
        }
    }

    int32_t chosen;
    if (sp->temperature == 0 || sp->top_k == 1) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < V; i++)
            if (w[i] > w[best]) best = i;
        chosen = (int32_t)best;
    } else {
        const double invt = 1.0 / (double)sp->temperature;
        uint32_t n = V, m = V; /* idx[0, m) is in the sort order (where sorted) */
        int sorted = 0;
        for (uint32_t i = 0; i < V; i++) s->idx[i] = i;
        if ((sp->top_k > 0 && (uint32_t)sp->top_k < V) || sp->top_p < 1.0f || sp->min_p > 0) {
            /* the sorted prefix the cuts walk: the top_k set, or the first SAMPLE_CAND candidates
             * when top_p / min_p cut it further (the rest only if the walk gets there) */
            sorted = 1;
            if (sp->top_k > 0 && (uint32_t)sp->top_k < V) n = (uint32_t)sp->top_k;
            if (n < V) select_first(s->idx, V, n, w);
            m = n;
            if ((sp->top_p < 1.0f || sp->min_p > 0) && m > SAMPLE_CAND) {
                m = SAMPLE_CAND;
                select_first(s->idx, n, m, w);
            }
            t_sort_w = w;
            qsort(s->idx, m, sizeof *s->idx, cmp_desc);
        }
        double mx = -INFINITY;
        if (sorted) mx = w[s->idx[0]];
        else
            for (uint32_t j = 0; j < n; j++) mx = fmax(mx, (double)w[s->idx[j]]);
        double tot = 0;
        for (uint32_t j = 0; j < n; j++) {
            double e = exp(((double)w[s->idx[j]] - mx) * invt);
            s->p[j] = e;
            tot += e;
        }
        if (sorted && sp->top_p < 1.0f) {
            double cum = 0, lim = (double)sp->top_p * tot;
            uint32_t keep = 0;
            while (keep < n) {
                if (keep == m) sort_more(s, w, &m, n, mx, invt);
                cum += s->p[keep++];
                if (cum >= lim) break;
            }
            n = keep;
        }
        if (sorted && sp->min_p > 0) {
            double cut = (double)sp->min_p * s->p[0]; /* p[0] is the largest after sorting */
            uint32_t keep = 1;
            while (keep < n) {
                if (keep == m) sort_more(s, w, &m, n, mx, invt);
                if (!(s->p[keep] >= cut)) break;
                keep++;
            }
            n = keep;
        }
        tot = 0;
        for (uint32_t j = 0; j < n; j++) tot += s->p[j];
        double u = sampler_uniform(sp->seed, stream) * tot;
        uint32_t j = 0;
        double cum = 0;
        for (; j + 1 < n; j++) {
            cum += s->p[j];
            if (u < cum) break;
        }
        chosen = (int32_t)s->idx[j];
    }

    /* logprobs of the raw distribution */
    out->token = chosen;
    if (sp->logprobs || sp->top_logprobs) sample_logprob(logits, V, chosen, sp->top_logprobs, out);
}

void sample_logprob(const float *logits, uint32_t V, int32_t token, uint32_t n_top, sample_out *out) {
    double mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = fmax(mx, (double)logits[i]);
    double se = 0;
    for (uint32_t i = 0; i < V; i++) se += exp((double)logits[i] - mx);
    const double lse = mx + log(se), lp = (double)logits[token] - lse;
    out->token = token;
    out->logprob = lp > 0 ? 0.0f : (float)lp;
    out->n_top = 0;
    if (n_top > WIRE_MAX_TOP_LOGPROBS) n_top = WIRE_MAX_TOP_LOGPROBS;
    if (n_top) top_logprobs(logits, V, lse, n_top, out);
    for (uint32_t k = 0; k < out->n_top; k++)
        if (out->top[k].logprob > 0) out->top[k].logprob = 0;
    while (out->n_top && !isfinite(out->top[out->n_top - 1].logprob)) out->n_top--; /* masked out */
}
