/* gram_mask: the time of one token mask (common/gram.h gram_match_mask) over a synthetic
 * vocabulary, at points of a JSON-schema output where few, some and nearly all tokens are allowed.
 *
 *   gram_mask [N_VOCAB (151936)] [REPEATS (20)] [SEED (1)]
 *
 * The vocabulary: the 256 single bytes, then tokens of 2..16 bytes drawn (seeded) from English-like
 * pieces: lowercase words with and without a leading space, capitalised words, digit runs, JSON
 * punctuation runs and a few UTF-8 letters, distinct, as byte-level BPE vocabularies hold. Prints
 * one line per point: the allowed count, the CPU milliseconds of the first mask in that state (a fresh
 * matcher each time: the trie walk) and of a mask of a state met again (the matcher's cache). No
 * timing is asserted (the ctest run only checks it runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gram.h"
#include "coordinator/api_constrain.h"

static uint64_t rs;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: the machine may be shared */
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char *const schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\"],\"additionalProperties\":false}";

int main(int argc, char **argv) {
    uint32_t V = argc > 1 ? (uint32_t)atol(argv[1]) : 151936;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    rs = argc > 3 ? (uint64_t)atoll(argv[3]) * 2654435761u + 1 : 88172645463325252ull;
    if (V < 512 || reps < 1) {
        fprintf(stderr, "usage: gram_mask [N_VOCAB >= 512] [REPEATS >= 1] [SEED]\n");
        return 2;
    }
    /* the vocabulary */
    gram_vocab *v = gram_vocab_new(V);
    char **seen = calloc(V, sizeof *seen);
    uint32_t n = 0;
    for (; n < 256; n++) {
        uint8_t b = (uint8_t)n;
        gram_vocab_set(v, n, &b, 1);
    }
    static const char *const punct[] = {"{", "}", "[", "]", "\"", ":", ",", "\":", "\",", "{\"", "\"}", "\"]", "[\"",
                                        " \"", "\n", "  ", "\\n", "\\\""};
    static const char *const utf[] = {"\xc3\xa9", "\xc3\xbc", "\xe2\x82\xac", "\xe4\xb8\xad", "\xd0\xb4"};
    /* a simple open-addressing set of the strings made so far */
    uint32_t hcap = 1;
    while (hcap < V * 2) hcap <<= 1;
    uint32_t *ht = malloc(hcap * sizeof *ht);
    memset(ht, 0xFF, hcap * sizeof *ht);
    char buf[64];
    while (n < V - 1) {
        size_t k = 0;
        int kind = (int)rnd(10);
        if (kind < 5) { /* a word, maybe with a space or a capital */
            if (rnd(2)) buf[k++] = ' ';
            size_t len = 1 + rnd(9);
            for (size_t i = 0; i < len; i++) buf[k++] = (char)('a' + rnd(26));
            if (rnd(6) == 0) buf[k - len] = (char)(buf[k - len] - 32);
        } else if (kind < 7) {
            size_t len = 1 + rnd(3);
            if (rnd(3) == 0) buf[k++] = ' ';
            for (size_t i = 0; i < len; i++) buf[k++] = (char)('0' + rnd(10));
        } else if (kind < 9) {
            size_t len = 1 + rnd(3);
            for (size_t i = 0; i < len; i++) {
                const char *p = punct[rnd(sizeof punct / sizeof *punct)];
                memcpy(buf + k, p, strlen(p));
                k += strlen(p);
            }
        } else {
            size_t len = 1 + rnd(3);
            for (size_t i = 0; i < len; i++) {
                const char *p = utf[rnd(sizeof utf / sizeof *utf)];
                memcpy(buf + k, p, strlen(p));
                k += strlen(p);
            }
        }
        if (k < 2) continue;
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < k; i++) h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
        uint32_t s = (uint32_t)h & (hcap - 1);
        bool dup = false;
        for (; ht[s] != UINT32_MAX; s = (s + 1) & (hcap - 1)) {
            size_t l;
            const uint8_t *b = gram_vocab_bytes(v, ht[s], &l);
            if (l == k && !memcmp(b, buf, k)) {
                dup = true;
                break;
            }
        }
        if (dup) continue;
        ht[s] = n;
        gram_vocab_set(v, n++, (const uint8_t *)buf, k);
    }
    gram_vocab_set_eos(v, V - 1);
    free(ht);
    free(seen);

    cJSON *sj = cJSON_Parse(schema);
    char *gt = NULL, msg[512];
    if (api_schema_to_gbnf(sj, &gt, msg, sizeof msg)) {
        fprintf(stderr, "gram_mask: %s\n", msg);
        return 1;
    }
    cJSON_Delete(sj);
    gram *g;
    mla_err e;
    if (gram_parse(&g, gt, strlen(gt), &e)) {
        fprintf(stderr, "gram_mask: %s\n", e.msg);
        return 1;
    }
    uint8_t *allow = malloc(V);
    /* the points: the output so far */
    static const char *const at[][2] = {
        {"start of the object", ""},
        {"after a key", "{\"name\""},
        {"inside a string", "{\"name\": \"Jo"},
        {"inside an integer", "{\"name\": \"Jo\", \"age\": 4"},
        {"inside an array of strings", "{\"name\": \"Jo\", \"age\": 42, \"tags\": [\"a\", \"b"},
        {"complete", "{\"name\": \"Jo\", \"age\": 42, \"tags\": [], \"ok\": true}"},
    };
    printf("vocabulary %u tokens (synthetic), %d masks per point\n", V, reps);
    printf("%-28s %9s %9s %9s %9s\n", "point", "allowed", "walk_ms", "walk_max", "again_ms");
    for (size_t p = 0; p < sizeof at / sizeof *at; p++) {
        double tot = 0, mx = 0, again = 0;
        int64_t cnt = 0;
        for (int r = 0; r < reps; r++) {
            gram_match *m;
            if (gram_match_new(&m, g, &e) ||
                gram_match_accept(m, (const uint8_t *)at[p][1], strlen(at[p][1]), &e)) {
                fprintf(stderr, "gram_mask: %s: %s\n", at[p][0], e.msg);
                return 1;
            }
            double t0 = now_ms();
            cnt = gram_match_mask(m, v, allow, &e);
            double t1 = now_ms();
            int64_t c2 = gram_match_mask(m, v, allow, &e);
            double t2 = now_ms();
            if (cnt < 0 || c2 != cnt) {
                fprintf(stderr, "gram_mask: %s\n", cnt < 0 ? e.msg : "the cached mask differs");
                return 1;
            }
            tot += t1 - t0;
            again += t2 - t1;
            if (t1 - t0 > mx) mx = t1 - t0;
            gram_match_free(m);
        }
        printf("%-28s %9lld %9.3f %9.3f %9.3f\n", at[p][0], (long long)cnt, tot / reps, mx, again / reps);
    }
    free(allow);
    free(gt);
    gram_free(g);
    gram_vocab_free(v);
    return 0;
}
