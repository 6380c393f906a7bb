/* Helpers for the tokenizer / chat tests: reading files, and building a vocabulary either from
 * a JSON dump of the GGUF tokenizer metadata (tests/tok/dump_vocab.py, written by gguf-py) or,
 * when our GGUF reader is built (MLA_TOK_HAVE_GGUF), from the GGUF file itself. */
#ifndef TOK_FIXTURE_H
#define TOK_FIXTURE_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/tok.h"

static inline char *tf_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static inline cJSON *tf_read_json(const char *path) {
    char *s = tf_read_file(path, NULL);
    if (!s) return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

static inline int32_t tf_int(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? (int32_t)x->valuedouble : -1;
}

static inline int tf_flag(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(x)) return cJSON_IsTrue(x) ? 1 : 0;
    return -1;
}

/* Builds the vocab from a dump_vocab.py JSON object. */
static inline tok_vocab *tf_vocab_from_dump(const cJSON *d, mla_err *err) {
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(d, "tokenizer.ggml.tokens");
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(d, "tokenizer.ggml.token_type");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(d, "tokenizer.ggml.merges");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(d, "tokenizer.ggml.pre");
    size_t n = (size_t)cJSON_GetArraySize(toks), nm = (size_t)cJSON_GetArraySize(merges);
    const char **tp = calloc(n + 1, sizeof *tp);
    int32_t *tt = calloc(n + 1, sizeof *tt);
    const char **mp = calloc(nm + 1, sizeof *mp);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, toks) tp[i++] = it->valuestring;
    i = 0;
    cJSON_ArrayForEach(it, types) tt[i++] = (int32_t)it->valuedouble;
    i = 0;
    cJSON_ArrayForEach(it, merges) mp[i++] = it->valuestring;
    tok_vocab_desc desc;
    tok_vocab_desc_init(&desc);
    desc.n_tokens = n;
    desc.tokens = tp;
    desc.token_types = types ? tt : NULL;
    desc.n_merges = nm;
    desc.merges = mp;
    desc.pre = cJSON_IsString(pre) ? pre->valuestring : NULL;
    desc.bos = tf_int(d, "tokenizer.ggml.bos_token_id");
    desc.eos = tf_int(d, "tokenizer.ggml.eos_token_id");
    desc.eot = tf_int(d, "tokenizer.ggml.eot_token_id");
    desc.eom = tf_int(d, "tokenizer.ggml.eom_token_id");
    desc.unk = tf_int(d, "tokenizer.ggml.unknown_token_id");
    desc.pad = tf_int(d, "tokenizer.ggml.padding_token_id");
    desc.add_bos = tf_flag(d, "tokenizer.ggml.add_bos_token");
    desc.add_eos = tf_flag(d, "tokenizer.ggml.add_eos_token");
    tok_vocab *v = NULL;
    if (tok_vocab_from_arrays(&v, &desc, err) != MLA_OK) v = NULL;
    free(tp);
    free(tt);
    free(mp);
    return v;
}

/* UTF-8 validity of a whole buffer. */
static inline int tf_utf8_valid(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = tok_utf8_seq_len((const unsigned char *)s + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* Appends the UTF-8 of code point cp to buf at *o. */
static inline void tf_put_cp(char *buf, size_t *o, unsigned cp) {
    if (cp < 0x80) buf[(*o)++] = (char)cp;
    else if (cp < 0x800) {
        buf[(*o)++] = (char)(0xC0 | (cp >> 6));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        buf[(*o)++] = (char)(0xE0 | (cp >> 12));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        buf[(*o)++] = (char)(0xF0 | (cp >> 18));
        buf[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static unsigned long long tf_rng_state = 88172645463325252ULL;
static inline unsigned tf_rand(void) {
    tf_rng_state ^= tf_rng_state << 13;
    tf_rng_state ^= tf_rng_state >> 7;
    tf_rng_state ^= tf_rng_state << 17;
    return (unsigned)(tf_rng_state >> 11);
}

/* Random valid UTF-8 of about n code points: ASCII words, space / newline / tab runs, digits,
 * Latin-1, combining marks, CJK, kana, emoji, any plane. buf needs 4 * n + 1 bytes. */
static inline size_t tf_random_utf8(char *buf, size_t n) {
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        unsigned r = tf_rand() % 16, cp;
        switch (r) {
        case 0: case 1: case 2: cp = 'a' + tf_rand() % 26; break;
        case 3: cp = ' '; break;
        case 4: cp = "\n\t\r  \n"[tf_rand() % 6]; break;
        case 5: cp = '0' + tf_rand() % 10; break;
        case 6: cp = 0x21 + tf_rand() % 94; break;
        case 7: cp = 0xA0 + tf_rand() % 0x160; break;
        case 8: cp = 0x300 + tf_rand() % 0x70; break; /* combining marks */
        case 9: cp = 0x4E00 + tf_rand() % 0x51A6; break; /* CJK */
        case 10: cp = 0x3040 + tf_rand() % 0xC0; break; /* kana */
        case 11: cp = 0x1F300 + tf_rand() % 0x300; break; /* emoji */
        case 12: cp = 0x10000 + tf_rand() % 0x100000; break; /* any supplementary plane */
        case 13: do cp = 0x80 + tf_rand() % 0xFF80; while (cp >= 0xD800 && cp < 0xE000); break;
        case 14: cp = 'A' + tf_rand() % 26; break;
        default: cp = "'.,!?-()"[tf_rand() % 8]; break;
        }
        tf_put_cp(buf, &o, cp);
    }
    buf[o] = 0;
    return o;
}

#endif
