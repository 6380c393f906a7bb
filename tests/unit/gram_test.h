/* Checks of a compiled grammar (common/gram) that the unit tests of the GBNF parser
 * (test_gram.c) and of the JSON-schema compiler (test_constrain.c) share: whether the automaton
 * accepts a string as a complete sentence, and a grammar's language against strings it must
 * accept and strings it must refuse. Header only (static inline), with mla_test.h's counters. */
#ifndef GRAM_TEST_H
#define GRAM_TEST_H

#include <stdint.h>
#include <string.h>

#include "common/gram.h"
#include "mla_test.h"

/* 1: g accepts s as a complete sentence; 0: it does not; -1: no matcher could be made */
static inline int gram_test_accepts(const gram *g, const char *s) {
    gram_match *m;
    mla_err e;
    if (gram_match_new(&m, g, &e)) return -1;
    int ok = gram_match_accept(m, (const uint8_t *)s, strlen(s), &e) == MLA_OK && gram_match_complete(m);
    gram_match_free(m);
    return ok;
}

/* g accepts every string of yes and refuses every string of no (both NULL-terminated); what
 * names the grammar in the messages of failed checks. Takes g and frees it; g NULL (a grammar
 * that did not compile, a failure its compiler's check has counted): nothing to check. */
static inline void gram_test_lang(gram *g, const char *what, const char *const *yes, const char *const *no) {
    if (!g) return;
    for (; *yes; yes++) CHECKF(gram_test_accepts(g, *yes) == 1, "%s should accept '%s'", what, *yes);
    for (; *no; no++) CHECKF(gram_test_accepts(g, *no) == 0, "%s should refuse '%s'", what, *no);
    gram_free(g);
}

#endif
