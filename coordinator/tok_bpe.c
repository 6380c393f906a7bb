/* tok_bpe: byte-level BPE over a GGUF vocabulary. See tok.h for the contract. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_hash.h"
#include "common/mla_log.h"
#include "tok.h"

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenizer regexes.                                                                     */
/* Each entry is a sequence of HF "Split" pre-tokenizers with behavior "Isolated": every      */
/* regex is applied to each piece produced by the previous one; matches and the gaps between  */
/* them both become pieces (llama.cpp's unicode_regex_split does the same with its list).     */
/* ------------------------------------------------------------------------------------------ */

/* deepseek-v3: the three Split regexes of the pre_tokenizer "Sequence" in the fixture's
 * tokenizer.json (tests/fixtures/tiny-deepseek3/tokenizer.json, which is DeepSeek-V3's
 * tokenizer.json pre_tokenizer); identical to llama.cpp llama-vocab.cpp
 * LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM. The CJK class is written with \x{} escapes for the
 * same code point ranges (U+4E00-U+9FA5, U+3040-U+309F, U+30A0-U+30FF). */
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}",
    "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};

/* glm4: the single Split regex of tests/fixtures/tiny-glm5/tokenizer.json (GLM-4.5/GLM-5's
 * tokenizer.json); llama.cpp llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_CHATGLM4 has the same text
 * (the case-insensitive (?i:'s|...) of the original written out as character classes). */
static const char *const re_glm4[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};

/* deepseek-llm: DeepSeek-V2 / V2-Lite (and DeepSeek LLM)'s pre_tokenizer "Sequence" of Split
 * regexes, as llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM lists them, written in code points.
 * The second class is Unicode's cased letters (Lu, Ll, Lt); some copies of it carry six code points
 * NFC-normalized (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126 and U+212A turned into U+03CE, U+03B9,
 * U+0390, U+038A, U+03A9 and 'K'), which makes three ranges run backwards and one ('K'-U+212D)
 * cover most of the BMP; here they are as the cased-letter ranges have them. The last step
 * isolates each digit, as HF's Digits(individual_digits) does (DeepSeek LLM splits numbers into
 * digits); llama.cpp's list has \p{N}+ there: the same tokens where no merge joins two digits. */
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?["
    "\\x{41}-\\x{5a}\\x{61}-\\x{7a}\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}"
    "\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}"
    "\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}"
    "\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}"
    "\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}"
    "\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}"
    "\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}"
    "\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}"
    "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}"
    "\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}"
    "\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}"
    "\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}"
    "\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}"
    "\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}"
    "\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"
    "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}"
    "\\x{1e900}-\\x{1e943}"
    "]+",
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
    "\\p{N}",
    NULL,
};

/* kimi-k2: Kimi-K2's tiktoken pattern (`pat_str` of its tokenization_kimi.py): o200k's split
 * with Han runs taken whole first and kept out of the letter runs. tiktoken's `[X&&[^\p{Han}]]`
 * (a class intersection, which PCRE2 lacks) is written `(?:(?!\p{Han})[X])`, the same set. Han is
 * the Script property, as tiktoken's regex engine (and HF's) reads `\p{Han}`: PCRE2 from 10.40
 * reads a bare script name as Script_Extensions, which would take the CJK punctuation (U+3001,
 * U+3002, ...) as Han too, so there it is spelled `sc:Han`. */
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
#define RE_HAN "\\p{sc:Han}"
#else
#define RE_HAN "\\p{Han}"
#endif
static const char *const re_kimi_k2[] = {
    "[" RE_HAN "]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!" RE_HAN ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
    "(?:(?!" RE_HAN ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!" RE_HAN ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
    "(?:(?!" RE_HAN ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
#undef RE_HAN

/* gpt-2: GPT-2's pattern (HF ByteLevel pre-tokenizer with use_regex; llama.cpp
 * LLAMA_VOCAB_PRE_TYPE_GPT2). */
static const char *const re_gpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    NULL,
};

/* default: llama.cpp llama-vocab.cpp, the `default:` case of llm_tokenizer_bpe (what llama.cpp
 * uses for tokenizer.ggml.pre = "default"). */
static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
    NULL,
};

/* ------------------------------------------------------------------------------------------ */
/* Hash maps                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

typedef struct pair_slot {
    uint64_t key; /* (left << 32) | right, both +1 so that 0 means empty */
    int32_t rank;
    int32_t merged;
} pair_slot;

struct tok_vocab {
    size_t n;
    char *text;        /* all token texts, each NUL-terminated */
    size_t *text_off;  /* n + 1 */
    char *piece;       /* decoded bytes of every token */
    size_t *piece_off; /* n + 1 */
    int32_t *type;
    size_t max_piece;

    int32_t *tmap; /* text -> id, open addressing, -1 empty */
    size_t tmap_cap;

    pair_slot *pmap;
    size_t pmap_cap;
    size_t n_merges_used;

    int32_t byte_tok[256]; /* token of the single byte-level char of each byte, or -1 */

    /* special tokens to match in raw text, bucketed by first byte, longest first */
    int32_t *spec_ids;
    size_t n_spec;
    size_t spec_start[257];

    enum tok_pre pre;
    char pre_name[64];
    pcre2_code *re[8];
    int n_re;

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos;
    uint8_t *eog; /* n flags */
};

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to 256 + k in order. */
static void byte_map_build(uint32_t b2u[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + k++);
    }
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_seq_len(const unsigned char *s, size_t avail) {
    if (avail == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 0;
    if (avail < (size_t)n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

/* Decodes one code point of valid UTF-8 (caller checked), returns its length. */
static int utf8_get(const unsigned char *s, size_t avail, uint32_t *cp) {
    int n = tok_utf8_seq_len(s, avail);
    if (n == 0) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t c = s[0];
    if (n == 1) *cp = c;
    else if (n == 2) *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
    else if (n == 3) *cp = ((c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else
        *cp = ((c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
    return n;
}

static const char *vtext(const tok_vocab *v, int32_t id, size_t *len) {
    *len = v->text_off[id + 1] - v->text_off[id] - 1;
    return v->text + v->text_off[id];
}

int32_t tok_find(const tok_vocab *v, const char *text, size_t len) {
    size_t mask = v->tmap_cap - 1;
    for (size_t i = mla_fnv1a(text, len, MLA_FNV_BASIS) & mask;; i = (i + 1) & mask) {
        int32_t id = v->tmap[i];
        if (id < 0) return -1;
        size_t l;
        const char *t = vtext(v, id, &l);
        if (l == len && memcmp(t, text, len) == 0) return id;
    }
}

static void tmap_insert(tok_vocab *v, int32_t id) {
    size_t len;
    const char *t = vtext(v, id, &len);
    size_t mask = v->tmap_cap - 1;
    for (size_t i = mla_fnv1a(t, len, MLA_FNV_BASIS) & mask;; i = (i + 1) & mask) {
        int32_t o = v->tmap[i];
        if (o < 0) {
            v->tmap[i] = id;
            return;
        }
        size_t l;
        const char *ot = vtext(v, o, &l);
        if (l == len && memcmp(ot, t, len) == 0) return; /* duplicate text: first id wins */
    }
}

static const pair_slot *pair_find(const tok_vocab *v, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
    size_t mask = v->pmap_cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (v->pmap[i].key == 0) return NULL;
        if (v->pmap[i].key == key) return &v->pmap[i];
    }
}

static void pair_insert(tok_vocab *v, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)(b + 1);
    size_t mask = v->pmap_cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (v->pmap[i].key == key) return; /* duplicate merge: the lower rank stays */
        if (v->pmap[i].key == 0) {
            v->pmap[i].key = key;
            v->pmap[i].rank = rank;
            v->pmap[i].merged = merged;
            v->n_merges_used++;
            return;
        }
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* Construction                                                                               */
/* ------------------------------------------------------------------------------------------ */

void tok_vocab_desc_init(tok_vocab_desc *d) {
    memset(d, 0, sizeof *d);
    d->bos = d->eos = d->eot = d->eom = d->unk = d->pad = -1;
    d->add_bos = d->add_eos = -1;
}

void tok_vocab_free(tok_vocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_re; i++) pcre2_code_free(v->re[i]);
    free(v->text);
    free(v->text_off);
    free(v->piece);
    free(v->piece_off);
    free(v->type);
    free(v->tmap);
    free(v->pmap);
    free(v->spec_ids);
    free(v->eog);
    free(v);
}

/* tokenizer.ggml.pre -> the regexes above ("gpt2": llama.cpp's spelling of gpt-2; no key: default) */
static const struct {
    const char *name;
    enum tok_pre pre;
    const char *const *res;
} k_pres[] = {
    {"deepseek-v3", TOK_PRE_DEEPSEEK3, re_deepseek3}, {"deepseek-llm", TOK_PRE_DEEPSEEK_LLM, re_deepseek_llm},
    {"kimi-k2", TOK_PRE_KIMI_K2, re_kimi_k2},         {"glm4", TOK_PRE_GLM4, re_glm4},
    {"gpt-2", TOK_PRE_GPT2, re_gpt2},                 {"gpt2", TOK_PRE_GPT2, re_gpt2},
    {"default", TOK_PRE_DEFAULT, re_default},
};

static int compile_pre(tok_vocab *v, const char *pre, mla_err *err) {
    const size_t n_pres = sizeof k_pres / sizeof k_pres[0];
    size_t k = 0;
    while (k < n_pres && strcmp(pre ? pre : "default", k_pres[k].name)) k++;
    if (k == n_pres) {
        char names[256];
        int n = 0;
        for (size_t i = 0; i < n_pres; i++)
            if (strcmp(k_pres[i].name, "gpt2")) /* the alias: named once */
                n += snprintf(names + n, sizeof names - (size_t)n, "%s%s", n ? ", " : "", k_pres[i].name);
        return mla_errf(err, "tokenizer.ggml.pre = \"%s\" is not a supported pre-tokenizer (supported: %s)", pre,
                        names);
    }
    v->pre = k_pres[k].pre;
    const char *const *res = k_pres[k].res;
    snprintf(v->pre_name, sizeof v->pre_name, "%s", pre ? pre : "default");
    for (int i = 0; res[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)res[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                       &ec, &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            MLA_PANIC("pre-tokenizer regex %d of %s does not compile at %zu: %s", i, v->pre_name,
                      (size_t)eo, (char *)msg);
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
        v->re[v->n_re++] = re;
    }
    return MLA_OK;
}

static const char *const eog_texts[] = {
    /* llama.cpp llama-vocab.cpp: tokens that end generation by their text */
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", NULL,
};

static int cmp_spec_len_desc(const void *a, const void *b, void *ctx) {
    const tok_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx, ly;
    const char *tx = vtext(v, x, &lx), *ty = vtext(v, y, &ly);
    unsigned char fx = (unsigned char)tx[0], fy = (unsigned char)ty[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : (x > y);
}

int tok_vocab_from_arrays(tok_vocab **out, const tok_vocab_desc *d, mla_err *err) {
    *out = NULL;
    if (d->n_tokens == 0) return mla_errf(err, "tokenizer: the vocabulary is empty");
    if (d->n_tokens > 0x7FFFFFF0u) return mla_errf(err, "tokenizer: %zu tokens is too many", d->n_tokens);
    tok_vocab *v = mla_xcalloc(1, sizeof *v);
    size_t n = d->n_tokens;
    v->n = n;
    if (compile_pre(v, d->pre, err) != MLA_OK) {
        tok_vocab_free(v);
        return MLA_ERR;
    }

    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        total += l + 1;
    }
    v->text = mla_xmalloc(total);
    v->text_off = mla_xmalloc((n + 1) * sizeof *v->text_off);
    v->type = mla_xmalloc(n * sizeof *v->type);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        v->text_off[i] = off;
        memcpy(v->text + off, d->tokens[i], l);
        v->text[off + l] = 0;
        off += l + 1;
        v->type[i] = d->token_types ? d->token_types[i] : TOK_TYPE_NORMAL;
    }
    v->text_off[n] = off;

    v->tmap_cap = pow2_at_least(n * 2 + 1);
    v->tmap = mla_xmalloc(v->tmap_cap * sizeof *v->tmap);
    memset(v->tmap, 0xFF, v->tmap_cap * sizeof *v->tmap);
    for (size_t i = 0; i < n; i++) tmap_insert(v, (int32_t)i);

    /* byte-level alphabet */
    uint32_t b2u[256];
    byte_map_build(b2u);
    int16_t u2b[512];
    for (int i = 0; i < 512; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        u2b[b2u[b]] = (int16_t)b;
        char buf[4];
        int l = utf8_put(b2u[b], buf);
        v->byte_tok[b] = tok_find(v, buf, (size_t)l);
    }

    /* decoded pieces */
    v->piece = mla_xmalloc(total);
    v->piece_off = mla_xmalloc((n + 1) * sizeof *v->piece_off);
    off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *t = vtext(v, (int32_t)i, &l);
        v->piece_off[i] = off;
        int ty = v->type[i];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) {
            memcpy(v->piece + off, t, l);
            off += l;
        } else {
            size_t p = 0;
            while (p < l) {
                uint32_t cp;
                int cl = tok_utf8_seq_len((const unsigned char *)t + p, l - p);
                if (cl == 0) { /* invalid stored text: copy the byte */
                    v->piece[off++] = t[p++];
                    continue;
                }
                utf8_get((const unsigned char *)t + p, l - p, &cp);
                if (cp < 512 && u2b[cp] >= 0) v->piece[off++] = (char)u2b[cp];
                else {
                    memcpy(v->piece + off, t + p, (size_t)cl);
                    off += (size_t)cl;
                }
                p += (size_t)cl;
            }
        }
        if (off - v->piece_off[i] > v->max_piece) v->max_piece = off - v->piece_off[i];
    }
    v->piece_off[n] = off;

    /* merges */
    v->pmap_cap = pow2_at_least(d->n_merges * 2 + 1);
    v->pmap = mla_xcalloc(v->pmap_cap, sizeof *v->pmap);
    size_t skipped = 0;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t r = 0; r < d->n_merges; r++) {
        const char *m = d->merges[r];
        size_t ml = d->merge_lens ? d->merge_lens[r] : strlen(m);
        /* llama.cpp splits at the first space after position 0 */
        const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
        if (!sp) {
            skipped++;
            continue;
        }
        size_t la = (size_t)(sp - m), lb = ml - la - 1;
        int32_t a = tok_find(v, m, la), b = tok_find(v, sp + 1, lb);
        if (cat_cap < la + lb) {
            cat_cap = (la + lb) * 2;
            cat = mla_xrealloc(cat, cat_cap);
        }
        memcpy(cat, m, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t c = tok_find(v, cat, la + lb);
        if (a < 0 || b < 0 || c < 0) {
            skipped++;
            continue;
        }
        pair_insert(v, a, b, (int32_t)r, c);
    }
    free(cat);
    if (skipped) MLA_WARN("tokenizer: %zu of %zu merges name tokens not in the vocabulary; ignored", skipped, d->n_merges);

    /* special tokens */
    size_t ns = 0;
    for (size_t i = 0; i < n; i++)
        if ((v->type[i] == TOK_TYPE_CONTROL || v->type[i] == TOK_TYPE_USER_DEFINED) &&
            v->text_off[i + 1] - v->text_off[i] > 1)
            ns++;
    v->spec_ids = mla_xmalloc((ns ? ns : 1) * sizeof *v->spec_ids);
    v->n_spec = 0;
    for (size_t i = 0; i < n; i++)
        if ((v->type[i] == TOK_TYPE_CONTROL || v->type[i] == TOK_TYPE_USER_DEFINED) &&
            v->text_off[i + 1] - v->text_off[i] > 1)
            v->spec_ids[v->n_spec++] = (int32_t)i;
    qsort_r(v->spec_ids, v->n_spec, sizeof *v->spec_ids, cmp_spec_len_desc, v);
    {
        size_t j = 0;
        for (int c = 0; c <= 256; c++) {
            while (j < v->n_spec && (unsigned char)v->text[v->text_off[v->spec_ids[j]]] < c) j++;
            v->spec_start[c] = j;
        }
        v->spec_start[256] = v->n_spec;
    }

    int32_t *ids[] = {&v->bos, &v->eos, &v->eot, &v->eom, &v->unk, &v->pad};
    const int32_t src[] = {d->bos, d->eos, d->eot, d->eom, d->unk, d->pad};
    for (int i = 0; i < 6; i++) *ids[i] = (src[i] >= 0 && (size_t)src[i] < n) ? src[i] : -1;
    v->add_bos = d->add_bos > 0;
    v->add_eos = d->add_eos > 0;
    if (v->add_bos && v->bos < 0) {
        tok_vocab_free(v);
        return mla_errf(err, "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
    }
    if (v->add_eos && v->eos < 0) {
        tok_vocab_free(v);
        return mla_errf(err, "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
    }

    v->eog = mla_xcalloc(n, 1);
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;
    for (int i = 0; eog_texts[i]; i++) {
        int32_t id = tok_find(v, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0) v->eog[id] = 1;
    }
    *out = v;
    return MLA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Accessors                                                                                  */
/* ------------------------------------------------------------------------------------------ */

size_t tok_n_tokens(const tok_vocab *v) { return v->n; }
enum tok_pre tok_pre_type(const tok_vocab *v) { return v->pre; }
const char *tok_pre_name(const tok_vocab *v) { return v->pre_name; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_eot(const tok_vocab *v) { return v->eot; }
int32_t tok_eom(const tok_vocab *v) { return v->eom; }
int32_t tok_unk(const tok_vocab *v) { return v->unk; }
int32_t tok_pad(const tok_vocab *v) { return v->pad; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos; }
size_t tok_max_piece_len(const tok_vocab *v) { return v->max_piece; }

bool tok_is_eog(const tok_vocab *v, int32_t id) {
    return id >= 0 && (size_t)id < v->n && v->eog[id];
}

int tok_token_type(const tok_vocab *v, int32_t id) {
    if (id < 0 || (size_t)id >= v->n) return -1;
    return v->type[id];
}

const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= v->n) return NULL;
    size_t l;
    const char *t = vtext(v, id, &l);
    if (len) *len = l;
    return t;
}

const char *tok_token_piece(const tok_vocab *v, int32_t id, size_t *len) {
    if (id < 0 || (size_t)id >= v->n) return NULL;
    if (len) *len = v->piece_off[id + 1] - v->piece_off[id];
    return v->piece + v->piece_off[id];
}

void tok_ids_push(tok_ids *t, int32_t id) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->ids = mla_xrealloc(t->ids, t->cap * sizeof *t->ids);
    }
    t->ids[t->n++] = id;
}

void tok_ids_free(tok_ids *t) {
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* BPE of one pre-tokenized word                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool dead;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank;
    int32_t left; /* symbol index */
    int32_t a, b; /* ids at the time it was pushed */
} bpe_cand;

typedef struct bpe_work {
    bpe_sym *sym;
    size_t sym_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
} bpe_work;

static bool cand_less(const bpe_cand *x, const bpe_cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void heap_push(bpe_work *w, bpe_cand c) {
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 64;
        w->heap = mla_xrealloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static bpe_cand heap_pop(bpe_work *w) {
    bpe_cand top = w->heap[0];
    bpe_cand last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_cand *mv = &last;
        if (l < n && cand_less(&w->heap[l], mv)) {
            m = l;
            mv = &w->heap[l];
        }
        if (r < n && cand_less(&w->heap[r], mv)) m = r;
        if (m == i) break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void try_pair(const tok_vocab *v, bpe_work *w, int32_t left) {
    if (left < 0) return;
    int32_t right = w->sym[left].next;
    if (right < 0) return;
    int32_t a = w->sym[left].id, b = w->sym[right].id;
    if (a < 0 || b < 0) return;
    const pair_slot *p = pair_find(v, a, b);
    if (!p) return;
    heap_push(w, (bpe_cand){p->rank, left, a, b});
}

static void bpe_word(const tok_vocab *v, bpe_work *w, const unsigned char *s, size_t len, tok_ids *out) {
    if (len == 0) return;
    if (w->sym_cap < len) {
        w->sym_cap = len * 2;
        w->sym = mla_xrealloc(w->sym, w->sym_cap * sizeof *w->sym);
    }
    for (size_t i = 0; i < len; i++) {
        w->sym[i].id = v->byte_tok[s[i]];
        w->sym[i].prev = (int32_t)i - 1;
        w->sym[i].next = i + 1 < len ? (int32_t)i + 1 : -1;
        w->sym[i].dead = false;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < len; i++) try_pair(v, w, (int32_t)i);
    while (w->heap_n) {
        bpe_cand c = heap_pop(w);
        bpe_sym *L = &w->sym[c.left];
        if (L->dead || L->id != c.a || L->next < 0) continue;
        bpe_sym *R = &w->sym[L->next];
        if (R->id != c.b) continue;
        const pair_slot *p = pair_find(v, c.a, c.b);
        L->id = p->merged;
        R->dead = true;
        L->next = R->next;
        if (R->next >= 0) w->sym[R->next].prev = c.left;
        try_pair(v, w, L->prev);
        try_pair(v, w, c.left);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
        int32_t id = w->sym[i].id;
        if (id >= 0) tok_ids_push(out, id);
        else if (v->unk >= 0) tok_ids_push(out, v->unk);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Pre-tokenization and encode                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct span {
    size_t off, len;
} span;

typedef struct span_vec {
    span *v;
    size_t n, cap;
} span_vec;

static void span_push(span_vec *s, size_t off, size_t len) {
    if (len == 0) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = mla_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
}

/* Splits text[0..len) (valid UTF-8) with the vocab's regex sequence; appends pieces to out. */
static int pre_split(const tok_vocab *v, const char *text, size_t len, span_vec *out,
                     pcre2_match_data *md, mla_err *err) {
    span_vec cur = {0}, nxt = {0};
    span_push(&cur, 0, len);
    for (int r = 0; r < v->n_re; r++) {
        nxt.n = 0;
        for (size_t k = 0; k < cur.n; k++) {
            const char *sub = text + cur.v[k].off;
            size_t sl = cur.v[k].len, pos = 0, gap = 0;
            while (pos < sl) {
                int rc = pcre2_match(v->re[r], (PCRE2_SPTR)sub, sl, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep input: the interpreter has no such limit */
                    rc = pcre2_match(v->re[r], (PCRE2_SPTR)sub, sl, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                                     md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    free(cur.v);
                    free(nxt.v);
                    return mla_errf(err, "tokenizer: pre-tokenizer regex failed: %s", (char *)msg);
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) { /* empty match: step one character */
                    int cl = tok_utf8_seq_len((const unsigned char *)sub + ms, sl - ms);
                    pos = ms + (cl ? (size_t)cl : 1);
                    continue;
                }
                span_push(&nxt, cur.v[k].off + gap, ms - gap);
                span_push(&nxt, cur.v[k].off + ms, me - ms);
                gap = pos = me;
            }
            span_push(&nxt, cur.v[k].off + gap, sl - gap);
        }
        span_vec t = cur;
        cur = nxt;
        nxt = t;
    }
    for (size_t k = 0; k < cur.n; k++) span_push(out, cur.v[k].off, cur.v[k].len);
    free(cur.v);
    free(nxt.v);
    return MLA_OK;
}

static int encode_raw(const tok_vocab *v, const char *text, size_t len, tok_ids *out, bpe_work *w,
                      pcre2_match_data *md, mla_err *err) {
    if (len == 0) return MLA_OK;
    span_vec pieces = {0};
    if (pre_split(v, text, len, &pieces, md, err) != MLA_OK) return MLA_ERR;
    for (size_t k = 0; k < pieces.n; k++)
        bpe_word(v, w, (const unsigned char *)text + pieces.v[k].off, pieces.v[k].len, out);
    free(pieces.v);
    return MLA_OK;
}

/* Copy of s with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD;
 * NULL when s is already valid. */
static char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    size_t i = 0;
    while (i < len) {
        int n = tok_utf8_seq_len((const unsigned char *)s + i, len - i);
        if (!n) break;
        i += (size_t)n;
    }
    if (i == len) return NULL;
    char *o = mla_xmalloc(len * 3 + 1);
    size_t j = 0;
    i = 0;
    while (i < len) {
        int n = tok_utf8_seq_len((const unsigned char *)s + i, len - i);
        if (n) {
            memcpy(o + j, s + i, (size_t)n);
            j += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(o + j, "\xEF\xBF\xBD", 3);
            j += 3;
            i++;
        }
    }
    *out_len = j;
    return o;
}

/* Longest special token matching at text+pos, or -1. */
static int32_t special_at(const tok_vocab *v, const char *text, size_t len, size_t pos, bool parse_special,
                          size_t *mlen) {
    unsigned char c = (unsigned char)text[pos];
    for (size_t j = v->spec_start[c]; j < v->spec_start[c + 1]; j++) {
        int32_t id = v->spec_ids[j];
        if (!parse_special && v->type[id] == TOK_TYPE_CONTROL) continue;
        size_t l;
        const char *t = vtext(v, id, &l);
        if (l <= len - pos && memcmp(text + pos, t, l) == 0) {
            *mlen = l;
            return id;
        }
    }
    return -1;
}

size_t tok_control_at(const tok_vocab *v, const char *text, size_t len, size_t pos) {
    if (!v->n_spec || pos >= len) return 0;
    size_t ml = 0;
    int32_t id = special_at(v, text, len, pos, true, &ml);
    return id >= 0 && v->type[id] == TOK_TYPE_CONTROL ? ml : 0;
}

/* Encodes text[0, len) (valid UTF-8) into out; CONTROL tokens are matched only when
 * parse_special and the match does not touch a plain span. */
static int encode_clean(const tok_vocab *v, const char *text, size_t len, bool parse_special, const size_t *plain,
                        size_t n_plain, tok_ids *out, mla_err *err) {
    bpe_work w = {0};
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    int rc = MLA_OK;
    size_t start = 0, pos = 0, k = 0;
    while (pos < len && rc == MLA_OK) {
        while (k < n_plain && plain[2 * k + 1] <= pos) k++;
        bool in_plain = k < n_plain && plain[2 * k] <= pos;
        size_t ml = 0;
        int32_t id = v->n_spec ? special_at(v, text, len, pos, parse_special && !in_plain, &ml) : -1;
        if (id >= 0 && v->type[id] == TOK_TYPE_CONTROL && k < n_plain && pos + ml > plain[2 * k])
            id = special_at(v, text, len, pos, false, &ml); /* would reach into a plain span */
        if (id < 0) {
            pos++;
            continue;
        }
        rc = encode_raw(v, text + start, pos - start, out, &w, md, err);
        tok_ids_push(out, id);
        pos += ml;
        start = pos;
    }
    if (rc == MLA_OK) rc = encode_raw(v, text + start, len - start, out, &w, md, err);
    pcre2_match_data_free(md);
    free(w.sym);
    free(w.heap);
    return rc;
}

int tok_encode_spans(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                     const size_t *plain, size_t n_plain, tok_ids *out, mla_err *err) {
    if (add_special && v->add_bos) tok_ids_push(out, v->bos);
    /* sanitize piece by piece so that the span offsets follow the sanitized text */
    char *clean = NULL;
    size_t clean_len = 0, cap = 0;
    size_t *cp = n_plain ? mla_xmalloc(2 * n_plain * sizeof *cp) : NULL;
    size_t at = 0;
    for (size_t k = 0; k <= n_plain; k++) {
        size_t b = k < n_plain ? plain[2 * k] : len, e = k < n_plain ? plain[2 * k + 1] : len;
        if (b < at) b = at;
        if (e < b) e = b;
        if (b > len) b = len;
        if (e > len) e = len;
        for (int half = 0; half < 2; half++) {
            size_t from = half ? b : at, to = half ? e : b;
            if (half && k == n_plain) break;
            if (half) cp[2 * k] = clean_len;
            size_t pl = 0;
            char *piece = utf8_sanitize(text + from, to - from, &pl);
            const char *src = piece ? piece : text + from;
            if (!piece) pl = to - from;
            if (clean_len + pl + 1 > cap) {
                cap = (clean_len + pl + 1) * 2;
                clean = mla_xrealloc(clean, cap);
            }
            memcpy(clean + clean_len, src, pl);
            clean_len += pl;
            free(piece);
            if (half) cp[2 * k + 1] = clean_len;
        }
        at = e;
    }
    int rc = encode_clean(v, clean ? clean : "", clean_len, parse_special, cp, n_plain, out, err);
    if (rc == MLA_OK && add_special && v->add_eos) tok_ids_push(out, v->eos);
    free(cp);
    free(clean);
    return rc;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
               tok_ids *out, mla_err *err) {
    return tok_encode_spans(v, text, len, add_special, parse_special, NULL, 0, out, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Decode                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static bool skip_tok(const tok_vocab *v, int32_t id, bool skip_special) {
    if (id < 0 || (size_t)id >= v->n) return true;
    return skip_special && (v->type[id] == TOK_TYPE_CONTROL || v->type[id] == TOK_TYPE_UNKNOWN);
}

char *tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, bool skip_special, size_t *out_len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (!skip_tok(v, ids[i], skip_special)) total += v->piece_off[ids[i] + 1] - v->piece_off[ids[i]];
    char *s = mla_xmalloc(total + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_tok(v, ids[i], skip_special)) continue;
        size_t l = v->piece_off[ids[i] + 1] - v->piece_off[ids[i]];
        memcpy(s + o, v->piece + v->piece_off[ids[i]], l);
        o += l;
    }
    s[o] = 0;
    if (out_len) *out_len = o;
    return s;
}

void tok_stream_init(tok_stream *s, const tok_vocab *v, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->v = v;
    s->skip_special = skip_special;
}

void tok_stream_free(tok_stream *s) { memset(s, 0, sizeof *s); }

/* Could bytes p[0..n) (0 < n < 4) still become a valid sequence with more bytes? */
static bool utf8_viable_prefix(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) { need = 3; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 3;
    else if (c == 0xED) { need = 3; hi = 0x9F; }
    else if (c == 0xF0) { need = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) { need = 4; hi = 0x8F; }
    else return false;
    if (n >= need) return false;
    if (n >= 2 && (p[1] < lo || p[1] > hi)) return false;
    for (size_t k = 2; k < n; k++)
        if ((p[k] & 0xC0) != 0x80) return false;
    return true;
}

int tok_stream_feed(tok_stream *s, int32_t id, char *buf, size_t cap) {
    const tok_vocab *v = s->v;
    if (skip_tok(v, id, s->skip_special)) return 0;
    size_t pl = v->piece_off[id + 1] - v->piece_off[id];
    const unsigned char *p = (const unsigned char *)v->piece + v->piece_off[id];
    size_t n = (size_t)s->n_held + pl;
    if (n > cap) return -1;
    memcpy(buf, s->held, (size_t)s->n_held);
    memcpy(buf + s->n_held, p, pl);
    /* emit up to the start of a trailing incomplete but still viable sequence */
    size_t i = 0, keep_from = n;
    const unsigned char *u = (const unsigned char *)buf;
    while (i < n) {
        int l = tok_utf8_seq_len(u + i, n - i);
        if (l) {
            i += (size_t)l;
            continue;
        }
        size_t rest = n - i;
        if (rest < 4 && utf8_viable_prefix(u + i, rest)) {
            keep_from = i;
            break;
        }
        i++; /* invalid byte: passes through */
    }
    s->n_held = (int)(n - keep_from);
    memcpy(s->held, u + keep_from, (size_t)s->n_held);
    return (int)keep_from;
}

int tok_stream_finish(tok_stream *s, char *buf, size_t cap) {
    if ((size_t)s->n_held > cap) return -1;
    int n = s->n_held;
    memcpy(buf, s->held, (size_t)n);
    s->n_held = 0;
    return n;
}
