/* wk_constrain: the masks that wk_constrain_prepare computes on threads (while a forward pass
 * would run) equal, step by step, those that wk_constrain_row computes alone, for several
 * constrained rows of different grammars advancing together, a row that is not sampled in a step,
 * a row whose grammar does not parse (reported by wk_constrain_row, the others unaffected), and
 * logit biases, and the errors' wording. The tokens each row takes are chosen from its own mask, so every step walks a
 * new grammar state. */
#include <stdint.h>
#include <string.h>

#include "mla_test.h"
#include "wk_constrain.h"

#define V 300u
#define ROWS 6

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
        gram_vocab_set(v, t, b, n);
    }
    gram_vocab_set_eos(v, V - 1);
    return v;
}

static const char *grammars[ROWS] = {
    "root ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= \"1\" | \"2\" | \"true\" | \"null\"",
    "root ::= \"{\" ( \"\\\"a\\\":\" val )? \"}\"\nval ::= \"1\" | \"[\" \"2\"* \"]\"",
    "root ::= ( \"a\" | \"b\" | \" \" )+",
    "root ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= \"1\" | \"2\" | \"true\" | \"null\"",
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
