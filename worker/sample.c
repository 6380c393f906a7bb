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
    sampler_sample_mod(s, logits, sp, NULL, history, n_history, stream, out);
}

void sampler_sample_mod(sampler *s, const float *logits, const wire_sampling *sp, const sample_mod *mod,
                        const int32_t *history, size_t n_history, uint64_t stream, sample_out *out) {
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
        for (size_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t >= 0 && (uint32_t)t < V) s->count[t]++;
        }
        for (size_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || (uint32_t)t >= V || s->count[t] == 0) continue;
            uint32_t c = s->count[t];
            s->count[t] = 0; /* handle each distinct token once, and reset */
            float v = w[t];
            if (sp->repetition_penalty != 1.0f)
                v = v > 0 ? v / sp->repetition_penalty : v * sp->repetition_penalty;
            v -= sp->frequency_penalty * (float)c + sp->presence_penalty;
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
        uint32_t n = V;
        int sorted = 0;
        for (uint32_t i = 0; i < V; i++) s->idx[i] = i;
        if ((sp->top_k > 0 && (uint32_t)sp->top_k < V) || sp->top_p < 1.0f || sp->min_p > 0) {
            t_sort_w = w;
            qsort(s->idx, V, sizeof *s->idx, cmp_desc);
            sorted = 1;
            if (sp->top_k > 0 && (uint32_t)sp->top_k < V) n = (uint32_t)sp->top_k;
        }
        double mx = -INFINITY;
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
                cum += s->p[keep++];
                if (cum >= lim) break;
            }
            n = keep;
        }
        if (sorted && sp->min_p > 0) {
            double cut = (double)sp->min_p * s->p[0]; /* p[0] is the largest after sorting */
            uint32_t keep = 1;
            while (keep < n && s->p[keep] >= cut) keep++;
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
    if (sp->logprobs || sp->top_logprobs) {
        double mx = -INFINITY;
        for (uint32_t i = 0; i < V; i++) mx = fmax(mx, (double)logits[i]);
        double se = 0;
        for (uint32_t i = 0; i < V; i++) se += exp((double)logits[i] - mx);
        double lse = mx + log(se);
        double lp = (double)logits[chosen] - lse;
        out->logprob = lp > 0 ? 0.0f : (float)lp;
        if (sp->top_logprobs) top_logprobs(logits, V, lse, sp->top_logprobs, out);
        for (uint32_t k = 0; k < out->n_top; k++)
            if (out->top[k].logprob > 0) out->top[k].logprob = 0;
        while (out->n_top && !isfinite(out->top[out->n_top - 1].logprob)) out->n_top--; /* masked out */
    }
}
