/* libFuzzer target: the protobuf API's frame decoder (coordinator/pbapi_frame.c): a byte stream
 * cut into frames (fed in pieces whose sizes come from the input's first byte) and every frame
 * decoded and validated into a request (protobuf unpack, field checks, sampling parameters,
 * chat messages), then freed. Must never crash, leak or read out of bounds; a malformed header
 * stops the stream as the server does. */
#include <stddef.h>
#include <stdint.h>

#include "coordinator/pbapi_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t piece = (size_t)(data[0] % 17) + 1;
    data++;
    size--;
    pbapi_framer f;
    pbapi_framer_init(&f, 4096);
    for (size_t off = 0; off < size;) {
        size_t n = size - off < piece ? size - off : piece;
        pbapi_framer_feed(&f, data + off, n);
        off += n;
        for (;;) {
            int kind, code;
            const uint8_t *p;
            size_t len;
            mla_err err = {{0}};
            int rc = pbapi_framer_next(&f, &kind, &p, &len, &code, &err);
            if (rc == 0) break;
            if (rc < 0) goto done;
            pbapi_request q;
            char param[48];
            (void)pbapi_request_decode(kind, p, len, &q, &code, param, &err);
            pbapi_request_free(&q);
        }
    }
done:
    pbapi_framer_free(&f);
    return 0;
}
