/* common/gram: the GBNF parser (accepted and refused grammars, their messages), the automaton on
 * known strings, and token masks against a brute-force reference (each token's bytes run through
 * the automaton on its own) on random grammars and vocabularies. */
#include "gram_test.h"

#include <stdint.h>

#include "common/gram.h"

static gram *parse_ok(const char *t) {
    gram *g = NULL;
    mla_err e = {{0}};
    int rc = gram_parse(&g, t, strlen(t), &e);
    CHECKF(rc == MLA_OK, "%s: %s", t, e.msg);
    return g;
}

static void parse_bad(const char *t, const char *needle) {
    gram *g = NULL;
    mla_err e = {{0}};
    int rc = gram_parse(&g, t, strlen(t), &e);
    CHECKF(rc == MLA_ERR && g == NULL, "accepted: %s", t);
    CHECKF(strstr(e.msg, needle) != NULL, "'%s': message '%s' lacks '%s'", t, e.msg, needle);
    gram_free(g);
}

static void lang(const char *gt, const char *const *yes, const char *const *no) {
    gram_test_lang(parse_ok(gt), gt, yes, no);
}

static void test_parse(void) {
    lang("root ::= \"ab\" | \"c\"", (const char *[]){"ab", "c", NULL}, (const char *[]){"", "a", "abc", "cc", NULL});
    lang("root ::= [a-c]* \"x\"", (const char *[]){"x", "abcx", "ccx", NULL}, (const char *[]){"", "dx", "xa", NULL});
    lang("root ::= [^a-c]+", (const char *[]){"x", "\xc3\xa9", "zz", NULL}, (const char *[]){"", "a", "xb", NULL});
    lang("root ::= \"a\"{2,3}", (const char *[]){"aa", "aaa", NULL}, (const char *[]){"a", "aaaa", NULL});
    lang("root ::= \"a\"{2} \"b\"{1,}", (const char *[]){"aab", "aabbb", NULL}, (const char *[]){"ab", "aa", NULL});
    lang("root ::= (\"a\" | \"b\")? \"c\"  # comment\n", (const char *[]){"c", "ac", "bc", NULL},
         (const char *[]){"abc", "", NULL});
    lang("root ::= item (\",\" item)*\nitem ::= [0-9]+\n", (const char *[]){"1", "1,22,333", NULL},
         (const char *[]){"1,", ",1", "", NULL});
    lang("root ::= \"\\u00e9\\x41\\n\" .", (const char *[]){"\xc3\xa9" "A\nz", "\xc3\xa9" "A\n\xe2\x82\xac", NULL},
         (const char *[]){"\xc3\xa9" "A\n", NULL});
    lang("root ::= \"(\" root \")\" | \"\"", (const char *[]){"", "()", "(())", NULL}, (const char *[]){"(", "())", NULL});
    lang("root ::= [\\u0100-\\U0010FFFF]", (const char *[]){"\xc4\x80", "\xf4\x8f\xbf\xbf", NULL},
         (const char *[]){"\xc3\xbf", "\xed\xa0\x80", "\xc0\x80", NULL});

    parse_bad("", "no 'root' rule");
    parse_bad("root ::= foo", "'foo' (line 1) is used but not defined");
    parse_bad("root ::= \"a", "unterminated string");
    parse_bad("root ::= [a-", "unterminated character class");
    parse_bad("root ::= [z-a]", "end before its start");
    parse_bad("root ::= (\"a\"", "expected ')'");
    parse_bad("root ::= \"a\"{3,2}", "n < m");
    parse_bad("root ::= \"a\"{1001}", "above 1000");
    parse_bad("root ::= \"\\q\"", "unknown escape");
    parse_bad("root ::= x\nx ::= x \"a\" | \"b\"", "left recursion");
    parse_bad("root ::= (\"a\"?)*", "left recursion");
    parse_bad("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    parse_bad("root = \"a\"", "expected '::='");
    parse_bad("root ::= \"a\" )", "unexpected character");
    parse_bad("root ::= \"a\"**", "two repetition operators");
    char deep[400];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 120; i++) deep[k++] = '(';
    deep[k] = 0;
    parse_bad(deep, "nested too deeply");
}

static void test_bounds(void) {
    /* deep nesting through right recursion that is not a tail: the stack bound, an error */
    gram *g = parse_ok("root ::= \"(\" root \")\" | \"x\"");
    gram_match *m;
    mla_err e = {{0}};
    REQUIRE(gram_match_new(&m, g, &e) == MLA_OK);
    char buf[8192];
    memset(buf, '(', sizeof buf);
    int rc = gram_match_accept(m, (const uint8_t *)buf, sizeof buf, &e);
    CHECK(rc == MLA_ERR && strstr(e.msg, "deeper than") != NULL);
    CHECK(gram_match_accept(m, (const uint8_t *)"((x))", 5, &e) == MLA_OK && gram_match_complete(m));
    gram_match_free(m);
    gram_free(g);
    /* ambiguity: many ways to split a string */
    g = parse_ok("root ::= a a a a a a a a a a a a\na ::= \"x\"*");
    if (g) {
        CHECK(gram_test_accepts(g, "") == 1 && gram_test_accepts(g, "xxxxxxxxxxxxxxxxxxxx") == 1 &&
              gram_test_accepts(g, "xy") == 0);
        gram_free(g);
    }
    g = parse_ok("root ::= s\ns ::= \"q\" s \"z\" | \"q\" s \"y\" | \"\"");
    if (g) {
        REQUIRE(gram_match_new(&m, g, &e) == MLA_OK);
        memset(buf, 'q', 64);
        rc = gram_match_accept(m, (const uint8_t *)buf, 64, &e);
        CHECKF(rc == MLA_ERR && strstr(e.msg, "ambiguous") != NULL, "rc %d: %s", rc, e.msg);
        gram_match_free(m);
        gram_free(g);
    }
}

/* gram_check: a grammar that matches no text, or whose first byte already passes the matcher's
 * bounds, is refused; the empty text and multi-byte first characters pass. Many named rules: the
 * references resolve to the right rules (a chain of 16000, each naming the next). */
static void test_check(void) {
    static const struct { const char *g; const char *needle; } cases[] = {
        {"root ::= [^\\x00-\\U0010FFFF]", "matches no text"},
        {"root ::= (\"a\"{0,100}){0,100} \"b\"", "ambiguous"},
        {"root ::= \"\"", NULL},
        {"root ::= [\\u4e00-\\u9fa5]+", NULL},
        {"root ::= x\nx ::= [^\\x00-\\U0010FFFF] | \"q\"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mla_err e = {{0}};
        int rc = gram_check(cases[i].g, strlen(cases[i].g), &e);
        if (cases[i].needle) CHECKF(rc == MLA_ERR && strstr(e.msg, cases[i].needle), "%s: rc %d %s", cases[i].g, rc, e.msg);
        else CHECKF(rc == MLA_OK, "%s: %s", cases[i].g, e.msg);
    }
    const int n = 16000;
    char *t = malloc((size_t)n * 40 + 64);
    size_t k = (size_t)sprintf(t, "root ::= r0\n");
    for (int i = 0; i < n; i++) k += (size_t)sprintf(t + k, "r%d ::= \"%c\" r%d\n", i, 'a' + i % 3, i + 1);
    k += (size_t)sprintf(t + k, "r%d ::= \"z\"\n", n);
    gram *g = parse_ok(t);
    if (g) {
        char *want = malloc((size_t)n + 2);
        for (int i = 0; i < n; i++) want[i] = (char)('a' + i % 3);
        want[n] = 'z';
        want[n + 1] = 0;
        CHECK(gram_test_accepts(g, want) == 1);
        want[n - 1] = 'z'; /* one character early */
        want[n] = 0;
        CHECK(gram_test_accepts(g, want) == 0);
        free(want);
        gram_free(g);
    }
    free(t);
}

/* ---- masks against the brute-force reference ------------------------------------------------ */

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static const char *alpha[] = {"a", "b", "{", "}", "\"", "\xc3\xa9", "\xe2\x82\xac", " "};

/* tok: token elements too (<[id]>, !<[id]> for ids 0-7) */
static void rnd_atom(char *o, size_t *k, int depth, int n_rules, bool tok) {
    if (tok && rnd(4) == 0) {
        *k += (size_t)sprintf(o + *k, "%s<[%u]>", rnd(3) ? "" : "!", rnd(8));
        return;
    }
    switch (rnd(depth > 2 ? 3 : 6)) {
    case 0: *k += (size_t)sprintf(o + *k, "\"%s\"", alpha[rnd(8)][0] == '"' ? "\\\"" : alpha[rnd(8)]); break;
    case 1: *k += (size_t)sprintf(o + *k, "[%sa-b\\u00e9]", rnd(2) ? "^" : ""); break;
    case 2: *k += (size_t)sprintf(o + *k, "r%u", rnd((uint32_t)n_rules)); break;
    default:
        o[(*k)++] = '(';
        rnd_atom(o, k, depth + 1, n_rules, tok);
        o[(*k)++] = ' ';
        rnd_atom(o, k, depth + 1, n_rules, tok);
        if (rnd(2)) {
            o[(*k)++] = '|';
            rnd_atom(o, k, depth + 1, n_rules, tok);
        }
        o[(*k)++] = ')';
    }
    const char *post[] = {"", "", "*", "+", "?", "{1,2}"};
    *k += (size_t)sprintf(o + *k, "%s", post[rnd(6)]);
}

/* tok: grammars with token elements, over a vocabulary whose tokens 0-3 are special (no text);
 * the reference runs each token through gram_match_try_token */
static void test_masks(bool tok) {
    int tried = 0, compared = 0;
    for (int it = 0; it < 1000; it++) {
        char gt[4096];
        size_t k = 0;
        int nr = 1 + (int)rnd(3);
        k += (size_t)sprintf(gt + k, "root ::= r0 \"}\"\n");
        for (int r = 0; r < nr; r++) {
            k += (size_t)sprintf(gt + k, "r%d ::= \"a\" ", r);
            int n = 1 + (int)rnd(3);
            for (int j = 0; j < n; j++) {
                rnd_atom(gt, &k, 0, nr, tok);
                gt[k++] = ' ';
            }
            k += (size_t)sprintf(gt + k, "| \"b\"\n");
        }
        gt[k] = 0;
        gram *g = NULL;
        mla_err e;
        if (gram_parse(&g, gt, k, &e)) continue; /* e.g. left recursion through r_i */
        tried++;
        /* random vocabulary: strings over the alphabet, some cut mid-character */
        uint32_t V = 200 + rnd(300);
        gram_vocab *v = gram_vocab_new(V);
        for (uint32_t t = 0; t + 1 < V; t++) {
            uint8_t b[16];
            size_t n = 0, want = 1 + rnd(5);
            while (n < want) {
                const char *a = alpha[rnd(8)];
                size_t al = strlen(a);
                if (n + al > sizeof b) break;
                memcpy(b + n, a, al);
                n += al;
            }
            if (rnd(5) == 0 && n > 1) n--; /* maybe a cut UTF-8 sequence */
            if (tok && t < 4) gram_vocab_set_special(v, t);
            else gram_vocab_set(v, t, b, n);
        }
        gram_vocab_set_eos(v, V - 1);
        gram_match *m;
        if (gram_match_new(&m, g, &e)) {
            gram_vocab_free(v);
            gram_free(g);
            continue;
        }
        uint8_t *allow = malloc(V);
        for (int step = 0; step < 12; step++) {
            int64_t cnt = gram_match_mask(m, v, allow, &e);
            if (cnt < 0) break;
            int64_t ref = 0;
            int bad = 0;
            for (uint32_t t = 0; t < V; t++) {
                size_t n;
                const uint8_t *b = gram_vocab_bytes(v, t, &n);
                bool ok = false;
                if (t == V - 1) ok = gram_match_complete(m);
                else if (tok ? gram_match_try_token(m, v, t, &ok, &e) : gram_match_try(m, b, n, &ok, &e)) ok = false;
                ref += ok;
                if (ok != (allow[t] != 0)) bad++;
            }
            CHECKF(bad == 0 && ref == cnt, "grammar %s: step %d: %d tokens differ (mask %lld, reference %lld)", gt,
                   step, bad, (long long)cnt, (long long)ref);
            compared++;
            /* advance by a random allowed non-EOS token */
            uint32_t pick = UINT32_MAX, seen = 0;
            for (uint32_t t = 0; t + 1 < V; t++)
                if (allow[t] && rnd(++seen) == 0) pick = t;
            if (pick == UINT32_MAX) break;
            size_t n;
            const uint8_t *b = gram_vocab_bytes(v, pick, &n);
            CHECK(tok ? gram_match_accept_token(m, v, pick, &e) == MLA_OK : gram_match_accept(m, b, n, &e) == MLA_OK);
        }
        free(allow);
        gram_match_free(m);
        gram_vocab_free(v);
        gram_free(g);
    }
    CHECKF(tried > 100 && compared > 500, "only %d grammars, %d masks compared", tried, compared);
}

/* token elements: parsing, the tokens a state allows, and taking them */
static int64_t mask_of(gram_match *m, gram_vocab *v, uint8_t *allow, char *out) {
    mla_err e = {{0}};
    int64_t n = gram_match_mask(m, v, allow, &e);
    size_t k = 0;
    for (uint32_t i = 0; i < gram_vocab_n(v); i++)
        if (allow[i]) k += (size_t)sprintf(out + k, "%s%u", k ? "," : "", i);
    out[k] = 0;
    return n;
}

static void test_tokens(void) {
    gram *g = parse_ok("root ::= <[6]> \"ab\" !<[7]> x\nx ::= <[7]>? [c]");
    CHECK(gram_max_token(g) == 7);
    gram_free(g);
    g = parse_ok("root ::= \"a\"");
    CHECK(gram_max_token(g) == -1);
    gram_free(g);
    parse_bad("root ::= <think>", "token text is not supported");
    parse_bad("root ::= <[x]>", "expected a token id");
    parse_bad("root ::= <[5]", "expected ']>'");
    parse_bad("root ::= <[99999999999]>", "token id above");
    parse_bad("root ::= !x", "");
    /* text tokens 0 "a", 1 "b", 2 "ab", 3 "c"; specials 6, 7; 9 the end of sequence; 4, 5, 8 absent */
    gram_vocab *v = gram_vocab_new(10);
    gram_vocab_set(v, 0, (const uint8_t *)"a", 1);
    gram_vocab_set(v, 1, (const uint8_t *)"b", 1);
    gram_vocab_set(v, 2, (const uint8_t *)"ab", 2);
    gram_vocab_set(v, 3, (const uint8_t *)"c", 1);
    gram_vocab_set_special(v, 6);
    gram_vocab_set_special(v, 7);
    gram_vocab_set_special(v, 9);
    gram_vocab_set_eos(v, 9);
    uint8_t allow[10];
    char got[64];
    mla_err e = {{0}};
    /* a section between two special tokens */
    g = parse_ok("root ::= <[6]> \"ab\" <[7]>");
    gram_match *m;
    CHECK(gram_match_new(&m, g, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 1 && !strcmp(got, "6"), "start: %s", got);
    CHECK(gram_match_accept_token(m, v, 7, &e) == MLA_ERR); /* refused, state kept */
    CHECK(gram_match_accept_token(m, v, 6, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 2 && !strcmp(got, "0,2"), "after 6: %s", got);
    CHECK(gram_match_accept_token(m, v, 2, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 1 && !strcmp(got, "7"), "after ab: %s", got);
    CHECK(gram_match_accept_token(m, v, 7, &e) == MLA_OK && gram_match_complete(m));
    CHECKF(mask_of(m, v, allow, got) == 1 && !strcmp(got, "9"), "complete: %s", got);
    gram_match_free(m);
    gram_free(g);
    /* any token but 7 until 7, then "c": a lazy start; the end of sequence only when complete */
    g = parse_ok("root ::= (!<[7]>)* <[7]> \"c\"");
    CHECK(gram_match_new(&m, g, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 6 && !strcmp(got, "0,1,2,3,6,7"), "lazy start: %s", got);
    const uint32_t run[] = {2, 6, 3, 0};
    for (size_t i = 0; i < 4; i++) CHECK(gram_match_accept_token(m, v, run[i], &e) == MLA_OK);
    CHECK(!gram_match_complete(m));
    CHECK(gram_match_accept_token(m, v, 7, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 1 && !strcmp(got, "3"), "after 7: %s", got);
    CHECK(gram_match_accept_token(m, v, 3, &e) == MLA_OK && gram_match_complete(m));
    gram_match_free(m);
    gram_free(g);
    /* two different negations take every token; text and a token element at one point */
    g = parse_ok("root ::= !<[6]> | !<[7]> | \"a\" \"b\"");
    CHECK(gram_match_new(&m, g, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 6 && !strcmp(got, "0,1,2,3,6,7"), "two negations: %s", got);
    CHECK(gram_match_accept_token(m, v, 0, &e) == MLA_OK); /* "a": complete by !<[..]>, or "b" to come */
    CHECK(gram_match_complete(m));
    CHECKF(mask_of(m, v, allow, got) == 2 && !strcmp(got, "1,9"), "after a: %s", got);
    gram_match_free(m);
    gram_free(g);
    /* an end-of-sequence token is never taken by a token element: only where complete */
    g = parse_ok("root ::= \"a\" <[9]>");
    CHECK(gram_match_new(&m, g, &e) == MLA_OK && gram_match_accept_token(m, v, 0, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 0, "<[eos]>: %s", got);
    CHECK(gram_match_accept_token(m, v, 9, &e) == MLA_ERR);
    gram_match_free(m);
    gram_free(g);
    g = parse_ok("root ::= \"a\" <[9]>?");
    CHECK(gram_match_new(&m, g, &e) == MLA_OK && gram_match_accept_token(m, v, 0, &e) == MLA_OK);
    CHECKF(mask_of(m, v, allow, got) == 1 && !strcmp(got, "9"), "complete: %s", got);
    gram_match_free(m);
    gram_free(g);
    /* gram_check: a grammar that starts with a token matches something */
    int64_t mx = 0;
    uint32_t *taken = NULL;
    size_t n_taken = 0;
    CHECK(gram_check_tokens("root ::= <[12]>", 15, &mx, NULL, NULL, &e) == MLA_OK && mx == 12);
    /* the ids of its <[id]> elements, not those of !<[id]> */
    const char *tk = "root ::= (!<[30]>)* <[7]> <[12]>";
    CHECK(gram_check_tokens(tk, strlen(tk), &mx, &taken, &n_taken, &e) == MLA_OK && mx == 30 && n_taken == 2 &&
          taken[0] == 7 && taken[1] == 12);
    free(taken);
    gram_vocab_free(v);
}

static void test_gpt2(void) {
    CHECK(gram_gpt2_byte('A') == 'A');
    CHECK(gram_gpt2_byte(0x120) == ' '); /* the 'Ġ' of byte-level BPE */
    CHECK(gram_gpt2_byte(0x10A) == '\n'); /* 'Ċ' */
    CHECK(gram_gpt2_byte(0x100) == 0);
    CHECK(gram_gpt2_byte(0x143) == 0xAD);
    CHECK(gram_gpt2_byte(0x144) == -1);
    CHECK(gram_gpt2_byte(' ') == -1);
}

int main(void) {
    test_parse();
    test_bounds();
    test_check();
    test_gpt2();
    test_masks(false);
    test_masks(true);
    test_tokens();
    return mla_test_finish();
}
