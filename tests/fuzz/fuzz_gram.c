/* libFuzzer target for common/gram: the input up to the first NUL byte is GBNF text, the rest
 * bytes to run through its automaton. Any text must parse or be refused with a message; a parsed
 * grammar's matcher must accept or refuse every byte string within its bounds, and its token mask
 * over a small vocabulary (text and special tokens) must agree with running each token on its own
 * (gram_match_try_token: its text, and the token elements <[id]> / !<[id]>). Built only with
 * -DMLA_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    gram *g = NULL;
    mla_err err = {{0}};
    if (gram_parse(&g, (const char *)data, glen, &err) != MLA_OK) {
        if (!err.msg[0] || g) abort();
        return 0;
    }
    gram_match *m;
    if (gram_match_new(&m, g, &err) == MLA_OK) {
        const uint8_t *in = nul ? nul + 1 : data + size;
        size_t n = (size_t)(data + size - in);
        /* a vocabulary of the input's 1..3-byte slices, every seventh token special (no text:
         * only token elements take it) */
        uint32_t V = n * 3 < 64 ? (uint32_t)n * 3 + 1 : 64;
        gram_vocab *v = gram_vocab_new(V);
        for (uint32_t t = 0; t + 1 < V && n; t++) {
            size_t o = t / 3 % n, l = 1 + t % 3;
            if (t % 7 == 6) gram_vocab_set_special(v, t);
            else gram_vocab_set(v, t, in + o, l < n - o ? l : n - o);
        }
        gram_vocab_set_eos(v, V - 1);
        uint8_t *allow = malloc(V);
        for (size_t k = 0; k <= n; k++) {
            if (gram_match_mask(m, v, allow, &err) >= 0) {
                for (uint32_t t = 0; t + 1 < V; t++) {
                    bool ok = false;
                    if (gram_match_try_token(m, v, t, &ok, &err) == MLA_OK && ok != (allow[t] != 0)) abort();
                }
                if ((allow[V - 1] != 0) != gram_match_complete(m)) abort();
            }
            if (k < n && gram_match_accept(m, in + k, 1, &err) != MLA_OK) break;
        }
        free(allow);
        gram_vocab_free(v);
        gram_match_free(m);
    }
    gram_free(g);
    return 0;
}
