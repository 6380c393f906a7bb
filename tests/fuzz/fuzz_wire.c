/* libFuzzer target for proto/wire: any byte string must be rejected with a message or decode to
 * a frame that survives encode -> decode -> encode with identical bytes. Built only with
 * -DMLA_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static void check_frame(const uint8_t *data, size_t size, const wire_limits *lim) {
    wire_msg m;
    mla_err err;
    if (wire_decode(data, size, lim, &m, &err) != MLA_OK) {
        if (!err.msg[0]) abort(); /* a rejection always names its reason */
        return;
    }
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (wire_encode(&m, &b1, &n1, &err) != MLA_OK) abort();
    wire_msg m2;
    if (wire_decode(b1, n1, lim, &m2, &err) != MLA_OK) abort();
    if (wire_encode(&m2, &b2, &n2, &err) != MLA_OK) abort();
    if (n1 != n2 || memcmp(b1, b2, n1)) abort();
    wire_msg_free(&m2);
    wire_msg_free(&m);
    free(b1);
    free(b2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_frame(data, size, NULL);
    wire_limits lim = {.n_vocab = 300, .max_ctx = 4096, .max_seqs = 16, .max_blocks = 8,
                       .world = 4, .max_frame = 1 << 16};
    check_frame(data, size, &lim);
    return 0;
}
