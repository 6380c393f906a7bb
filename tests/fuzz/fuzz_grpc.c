/* libFuzzer target: the gRPC server's connection layer (coordinator/grpc_conn.c, HTTP/2 by
 * nghttp2 and our gRPC framing) and request decoding (coordinator/grpc_msg.c). The input is a
 * client byte stream, fed in pieces whose sizes come from its first byte; it starts with the
 * HTTP/2 preface (added when the input's second byte is odd, so that the fuzzer need not find
 * it). Every call the layer hands on is decoded and validated (protobuf unpack, field checks,
 * sampling parameters, chat messages), answered with a message and a status, or left open and
 * answered later; the output is drained after every piece. A clock moves on with each piece (by
 * its last byte, in ms), and requests not complete by their grpc-timeout are ended after it
 * (grpc_conn_expire). Must never crash, leak or read out of bounds; a protocol error stops the
 * stream as the server does. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/grpc_conn.h"
#include "coordinator/grpc_msg.h"

typedef struct fz {
    grpc_conn *c;
    int32_t open[8]; /* calls left open, answered at the end */
    int n_open;
    uint64_t now; /* the clock, ms */
} fz;

static uint64_t now_ms(void *ud) { return ((fz *)ud)->now; }

static void on_call(void *ud, const grpc_call_in *in) {
    fz *f = ud;
    grpc_request q;
    char param[48];
    mla_err err = {{0}};
    int rc = grpc_request_decode(in->method, in->msg, in->len, &q, param, &err);
    grpc_request_free(&q);
    if (rc != MLA_OK) {
        grpc_conn_finish(f->c, in->stream_id, GRPC_INVALID_ARGUMENT, err.msg);
        return;
    }
    Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
    m.text = "x\x01%\xff";
    grpc_conn_send_msg(f->c, in->stream_id, &m.base);
    if ((in->len & 1) && f->n_open < 8) {
        f->open[f->n_open++] = in->stream_id; /* a stream in progress */
        return;
    }
    grpc_conn_finish(f->c, in->stream_id, in->len & 2 ? GRPC_OK : GRPC_INTERNAL, "done\n");
}

static void on_cancel(void *ud, int32_t sid) {
    fz *f = ud;
    for (int i = 0; i < f->n_open; i++)
        if (f->open[i] == sid) f->open[i] = f->open[--f->n_open];
}

static void drain(grpc_conn *c) {
    uint8_t *out;
    grpc_conn_take_output(c, &out);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t piece = (size_t)(data[0] % 61) + 1;
    bool preface = data[1] & 1;
    data += 2;
    size -= 2;
    fz f = {0};
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    lim.max_msg = 4096;
    lim.max_streams = 8;
    lim.max_header_bytes = 2048;
    lim.max_buffered = 16384;
    lim.max_out = 4096;
    grpc_conn_cbs cb = {.ud = &f, .on_call = on_call, .on_cancel = on_cancel, .now_ms = now_ms};
    mla_err err = {{0}};
    if (grpc_conn_init(&f.c, &lim, &cb, &err) != MLA_OK) return 0;
    drain(f.c);
    if (preface) {
        static const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        if (grpc_conn_recv(f.c, (const uint8_t *)pre, sizeof pre - 1, &err) != MLA_OK) goto done;
    }
    for (size_t off = 0; off < size;) {
        size_t n = size - off < piece ? size - off : piece;
        int rc = grpc_conn_recv(f.c, data + off, n, &err);
        drain(f.c);
        if (rc != MLA_OK) goto done;
        off += n;
        f.now += data[off - 1];
        grpc_conn_expire(f.c, f.now);
        drain(f.c);
        if (f.n_open && (data[off - 1] & 0x80)) {
            int32_t sid = f.open[--f.n_open];
            Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
            grpc_conn_send_msg(f.c, sid, &m.base);
            grpc_conn_finish(f.c, sid, GRPC_OK, NULL);
        }
    }
    (void)grpc_conn_n_calls(f.c);
    (void)grpc_conn_done(f.c);
    grpc_conn_shutdown(f.c);
    drain(f.c);
done:
    grpc_conn_free(f.c);
    return 0;
}
