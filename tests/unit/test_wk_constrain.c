/* wk_constrain: the masks that wk_constrain_prepare computes on threads (while a forward pass
 * would run) equal, step by step, those that wk_constrain_row computes alone, for several
 * constrained rows of different grammars advancing together, a row that is not sampled in a step,
 * a row whose grammar does not parse (reported by wk_constrain_row, the others unaffected), and
 * logit biases, a grammar that goes through a special token (<[id]>), the errors' wording, and
 * min_tokens' stop tokens held back (not where a grammar can only end). The tokens each row takes are chosen from its own mask, so every step walks a
 * new grammar state. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_test.h"
#include "wk_constrain.h"

#define V 300u
#define ROWS 6
#define SPECIAL 250u

static gram_vocab *vocab(void) {
    static const char *alpha[] = {"{", "}", "[", "]", "\"", ",", ":", " ", "a", "b", "1", "2", "true", "null"};
    gram_vocab *v = gram_vocab_new(V);
    uint64_t x = 12345;
    for (uint32_t t = 0; t + 1 < V; t++) {
        uint8_t b[16];
        size_t n = 0;
        size_t want = 1 + (size_t)(t % 3);
        while (n < want) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = alpha[(x >> 33) % (sizeof alpha / sizeof alpha[0])];
            size_t al = strlen(a);
            if (n + al > sizeof b) break;
            memcpy(b + n, a, al);
            n += al;
        }
        if (t == SPECIAL) gram_vocab_set_special(v, t); /* a control token: no text */
        else gram_vocab_set(v, t, b, n);
    }
    gram_vocab_set_eos(v, V - 1);
    return v;
}

static const char *grammars[ROWS] = {
    "root ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= \"1\" | \"2\" | \"true\" | \"null\"",
    "root ::= \"{\" ( \"\\\"a\\\":\" val )? \"}\"\nval ::= \"1\" | \"[\" \"2\"* \"]\"",
    "root ::= ( \"a\" | \"b\" | \" \" )+",
    "root ::= \"a\" <[250]> ( \"b\" | \" \" )+", /* through a special token */
    "root ::= missing", /* does not parse: an undefined rule */
    NULL,              /* logit biases only */
};

int main(void) {
    wk_constrain *a = wk_constrain_new(NULL, V), *b = wk_constrain_new(NULL, V);
    wk_constrain_set_vocab(a, vocab());
    wk_constrain_set_vocab(b, vocab());
    int32_t tok[ROWS], pos[ROWS];
    int32_t bias_id = 7;
    float bias_val = -3.0f;
    wire_seq seqs[ROWS];
    memset(seqs, 0, sizeof seqs);
    for (int i = 0; i < ROWS; i++) {
        wire_seq *s = &seqs[i];
        s->seq_id = 100 + (uint64_t)i;
        s->n_tokens = 1;
        s->tokens = &tok[i];
        s->positions = &pos[i];
        s->sp.constrained = true;
        s->sp.grammar = (char *)grammars[i];
        s->sp.grammar_start = 5;
        if (!grammars[i]) {
            s->sp.n_bias = 1;
            s->sp.bias_ids = &bias_id;
            s->sp.bias_vals = &bias_val;
        }
        tok[i] = 3; /* the prompt's last token: before grammar_start, not taken */
        pos[i] = 4;
    }
    wire_step_plan plan = {1, ROWS, seqs};
    int steps_checked = 0;
    for (int step = 0; step < 12; step++) {
        for (int i = 0; i < ROWS; i++) {
            seqs[i].sp.constraint_setup = step == 0;
            seqs[i].sample = !(i == 2 && step == 3); /* one row not sampled in one step */
        }
        wk_constrain_prepare(a, &plan, NULL, true);
        /* (a forward pass would run here) */
        for (int i = 0; i < ROWS; i++) {
            sample_mod ma, mb;
            mla_err ea = {{0}}, eb = {{0}};
            int ra = wk_constrain_row(a, &seqs[i], &ma, &ea), rb = wk_constrain_row(b, &seqs[i], &mb, &eb);
            CHECKF(ra == rb, "step %d row %d: %d against %d", step, i, ra, rb);
            if (i == 4) { /* the grammar that does not parse: reported by both, each step */
                CHECK(ra == MLA_ERR && !strncmp(ea.msg, "sequence 104: ", 14));
                CHECKF(!strstr(ea.msg, ": :"), "one separator after the prefix: %s", ea.msg);
                CHECK(!strcmp(ea.msg, eb.msg));
                continue;
            }
            REQUIRE(ra == MLA_OK);
            CHECK(ma.n_bias == mb.n_bias && (!ma.n_bias || (ma.bias_ids[0] == 7 && mb.bias_vals[0] == -3.0f)));
            CHECK((ma.allow == NULL) == (mb.allow == NULL));
            if (!seqs[i].sample || !ma.allow || !mb.allow) continue;
            CHECKF(!memcmp(ma.allow, mb.allow, V), "step %d row %d: masks differ", step, i);
            if (i == 3 && step == 1) { /* after "a": the special token alone */
                uint32_t n_ok = 0;
                for (uint32_t t = 0; t < V; t++) n_ok += ma.allow[t];
                CHECKF(n_ok == 1 && ma.allow[SPECIAL], "step 1 row 3: %u tokens allowed", n_ok);
            }
            steps_checked++;
            /* the next token: the (step + i)-th allowed one, so rows walk different states */
            uint32_t n_ok = 0, pick = V - 1;
            for (uint32_t t = 0; t < V; t++) n_ok += ma.allow[t];
            for (uint32_t t = 0, k = 0; t < V && n_ok; t++)
                if (ma.allow[t] && k++ == (uint32_t)(step + i) % n_ok) pick = t;
            tok[i] = (int32_t)pick;
        }
        for (int i = 0; i < ROWS; i++) pos[i] = 5 + step; /* the token chosen above, taken next step */
    }
    CHECK(steps_checked >= 40);
    {   /* a grammar that passes the matcher's bounds only after two characters: the row's mask is
         * end of sequence only from there, and wk_constrain_failure names the bound (rank 0 sends
         * it with the row's result); before, no failure */
        enum { FV = 4 };
        gram_vocab *fv = gram_vocab_new(FV);
        gram_vocab_set(fv, 0, (const uint8_t *)"a", 1);
        gram_vocab_set(fv, 1, (const uint8_t *)"b", 1);
        gram_vocab_set(fv, 2, (const uint8_t *)"c", 1);
        gram_vocab_set_eos(fv, FV - 1);
        wk_constrain *f = wk_constrain_new(NULL, FV);
        wk_constrain_set_vocab(f, fv);
        size_t cap = 64 * 2200, n = 0;
        char *g = malloc(cap);
        n += (size_t)snprintf(g + n, cap - n, "root ::= \"a\" \"b\" ( \"c\" | r0 )\n");
        for (int i = 0; i < 2100; i++) n += (size_t)snprintf(g + n, cap - n, "r%d ::= \"x%d\" | r%d\n", i, i, i + 1);
        snprintf(g + n, cap - n, "r2100 ::= \"end\"\n");
        int32_t ft = 9, fp = 4;
        wire_seq fs = {.seq_id = 7, .n_tokens = 1, .tokens = &ft, .positions = &fp, .sample = true};
        fs.sp.constrained = true;
        fs.sp.constraint_setup = true;
        fs.sp.grammar = g;
        fs.sp.grammar_start = 5;
        for (int k = 0; k <= 1; k++) {
            sample_mod mod;
            mla_err e = {{0}};
            REQUIRE(wk_constrain_row(f, &fs, &mod, &e) == MLA_OK);
            REQUIRE(mod.allow != NULL);
            const char *why = wk_constrain_failure(f, 7);
            if (k == 0) {
                CHECKF(!why && mod.allow[0] && !mod.allow[1] && !mod.allow[FV - 1], "%s", why ? why : "-");
                fs.sp.constraint_setup = false;
                ft = 0; /* "a" */
                fp = 5;
            } else {
                CHECKF(why && strstr(why, "references in a row") && strstr(why, "after 1 generated token:"),
                       "the failure named: %s", why ? why : "(none)");
                CHECK(mod.allow[FV - 1] && !mod.allow[0] && !mod.allow[1] && !mod.allow[2]);
            }
        }
        wk_constrain_drop(f, 7);
        CHECK(wk_constrain_failure(f, 7) == NULL);
        free(g);
        wk_constrain_free(f);
    }
    {   /* min_tokens 3 from position 5: below position 8 the stop tokens (9 and the end, V - 1) are
         * biased to -inf after the row's own bias (7: -3); from 8 on the bias alone. With a grammar
         * that can only end (complete after "a"), the end stays allowed: a grammar that is done ends. */
        enum { FV = 12 };
        gram_vocab *mv = gram_vocab_new(FV);
        for (uint32_t t = 0; t + 1 < FV; t++) gram_vocab_set(mv, t, (const uint8_t *)(t == 0 ? "a" : "b"), 1);
        gram_vocab_set_eos(mv, FV - 1);
        wk_constrain *m = wk_constrain_new(NULL, FV);
        wk_constrain_set_vocab(m, mv);
        int32_t ban[2] = {9, FV - 1}, bid = 7, mt = 2, mp = 4;
        float bval = -3.0f;
        wire_seq ms = {.seq_id = 3, .n_tokens = 1, .tokens = &mt, .positions = &mp, .sample = true};
        ms.sp.constrained = ms.sp.constraint_setup = true;
        ms.sp.grammar_start = 5;
        ms.sp.n_bias = 1;
        ms.sp.bias_ids = &bid;
        ms.sp.bias_vals = &bval;
        ms.sp.min_tokens = 3;
        ms.sp.n_ban = 2;
        ms.sp.ban_ids = ban;
        for (mp = 4; mp <= 8; mp++) { /* the token sampled after position mp: at mp + 1 */
            sample_mod mod;
            mla_err e = {{0}};
            REQUIRE(wk_constrain_row(m, &ms, &mod, &e) == MLA_OK);
            ms.sp.constraint_setup = false;
            const bool early = mp + 1 < 8;
            CHECKF(mod.n_bias == (early ? 3u : 1u) && mod.bias_ids[0] == 7 && mod.bias_vals[0] == -3.0f,
                   "position %d: %u biases", mp + 1, mod.n_bias);
            if (early)
                CHECKF(mod.bias_ids[1] == 9 && mod.bias_ids[2] == FV - 1 && isinf(mod.bias_vals[1]) &&
                           mod.bias_vals[1] < 0 && isinf(mod.bias_vals[2]),
                       "position %d: the stop tokens at -inf", mp + 1);
        }
        int32_t gt = 2, gp = 4;
        wire_seq gs = {.seq_id = 4, .n_tokens = 1, .tokens = &gt, .positions = &gp, .sample = true};
        gs.sp.constrained = gs.sp.constraint_setup = true;
        gs.sp.grammar = "root ::= \"a\"";
        gs.sp.grammar_start = 5;
        gs.sp.min_tokens = 10;
        gs.sp.n_ban = 1;
        gs.sp.ban_ids = &ban[1];
        sample_mod mod;
        mla_err e = {{0}};
        REQUIRE(wk_constrain_row(m, &gs, &mod, &e) == MLA_OK);
        CHECK(mod.allow && mod.allow[0] && !mod.allow[FV - 1] && mod.n_bias == 1 && isinf(mod.bias_vals[0]));
        gs.sp.constraint_setup = false;
        gt = 0; /* "a": the grammar is complete, only the end continues it */
        gp = 5;
        REQUIRE(wk_constrain_row(m, &gs, &mod, &e) == MLA_OK);
        CHECKF(mod.allow && mod.allow[FV - 1] && !mod.allow[0] && mod.n_bias == 0,
               "a complete grammar ends within min_tokens: %u biases", mod.n_bias);
        wk_constrain_free(m);
    }
    {   /* the vocabulary of a model that cannot be read: the reason after one separator */
        gram_vocab *gv = NULL;
        mla_err e = {{0}};
        CHECK(wk_constrain_vocab_from_gguf(&gv, "/nonexistent/model.gguf", V, &e) == MLA_ERR && !gv);
        CHECKF(!strncmp(e.msg, "structured output: ", 19) && !strstr(e.msg, ": :"), "%s", e.msg);
    }
    wk_constrain_free(a);
    wk_constrain_free(b);
    return mla_test_finish();
}
