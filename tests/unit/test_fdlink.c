/* fdlink (common/fdlink.h) over a socketpair: frames of 0 bytes to 8 MB arrive whole and in order
 * when the writer must queue (the socket buffer made small) and the reader drains in between;
 * a partial frame is not handed out; a frame over max_frame is refused on send and, arriving
 * from a peer with a larger limit, ends the link with an error naming the size; the peer
 * closing is an error saying "closed", also in the middle of a frame; fdlink_pump hands frames
 * out in order, bounded a call, until its callback stops it; a failed write leaves what the peer
 * sent before it readable. */
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fdlink.h"
#include "mla_test.h"

static void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed);
}

/* drains every whole frame that has arrived into got[], returns how many */
static int drain(fdlink *l, uint8_t **got, size_t *got_n, int at, int max) {
    mla_err e;
    int rc;
    uint8_t *f;
    size_t n;
    while (at < max && (rc = fdlink_recv(l, &f, &n, &e)) == 1) {
        got[at] = f;
        got_n[at++] = n;
    }
    return at;
}

static void test_order_and_queueing(void) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    mla_err e;
    fdlink *a = fdlink_new(sv[0], 16u << 20, &e), *b = fdlink_new(sv[1], 16u << 20, &e);
    REQUIRE(a && b);
    enum { NF = 7 };
    const size_t sizes[NF] = {0, 1, 7, 8, 65536, 3u << 20, 8u << 20};
    uint8_t *src[NF], *got[NF] = {0};
    size_t got_n[NF] = {0};
    for (int i = 0; i < NF; i++) {
        src[i] = malloc(sizes[i] ? sizes[i] : 1);
        fill(src[i], sizes[i], (uint32_t)i);
        CHECK(fdlink_send(a, src[i], sizes[i], &e) == MLA_OK);
    }
    CHECKF(fdlink_pending(a) > 0, "8 MB cannot fit a 4 KB socket buffer: some must be queued");
    int have = 0;
    for (int spins = 0; have < NF && spins < 1000000; spins++) {
        struct pollfd p[2] = {{fdlink_fd(a), fdlink_pending(a) ? POLLOUT : 0, 0}, {fdlink_fd(b), POLLIN, 0}};
        poll(p, 2, 1000);
        if (p[0].revents & POLLOUT) CHECK(fdlink_flush(a, &e) == MLA_OK);
        have = drain(b, got, got_n, have, NF);
    }
    CHECK(have == NF);
    CHECK(fdlink_pending(a) == 0);
    for (int i = 0; i < have; i++) {
        CHECKF(got_n[i] == sizes[i] && memcmp(got[i], src[i], sizes[i]) == 0, "frame %d (%zu bytes)", i, sizes[i]);
        free(got[i]);
    }
    for (int i = 0; i < NF; i++) free(src[i]);
    /* nothing more: 0, not an error */
    uint8_t *f;
    size_t n;
    CHECK(fdlink_recv(b, &f, &n, &e) == 0 && f == NULL);
    fdlink_free(a);
    /* the writer gone: "closed" */
    CHECK(fdlink_recv(b, &f, &n, &e) == MLA_ERR && strstr(e.msg, "closed"));
    fdlink_free(b);
}

static void test_partial_and_limits(void) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    mla_err e;
    fdlink *b = fdlink_new(sv[1], 100, &e);
    REQUIRE(b);
    /* half a header, then the rest of a 5-byte frame in two pieces */
    const uint8_t hdr[8] = {5, 0, 0, 0, 0, 0, 0, 0};
    uint8_t *f;
    size_t n;
    CHECK(write(sv[0], hdr, 3) == 3);
    CHECK(fdlink_recv(b, &f, &n, &e) == 0);
    CHECK(write(sv[0], hdr + 3, 5) == 5 && write(sv[0], "he", 2) == 2);
    CHECK(fdlink_recv(b, &f, &n, &e) == 0);
    CHECK(write(sv[0], "llo", 3) == 3);
    CHECK(fdlink_recv(b, &f, &n, &e) == 1 && n == 5 && memcmp(f, "hello", 5) == 0);
    free(f);
    /* sending over the limit is refused and leaves the link usable */
    uint8_t big[101] = {0};
    CHECK(fdlink_send(b, big, sizeof big, &e) == MLA_ERR && strstr(e.msg, "101 bytes exceeds 100"));
    CHECK(fdlink_send(b, big, 100, &e) == MLA_OK);
    /* a header announcing more than the limit ends the link */
    const uint8_t huge[8] = {0, 0, 0, 0, 1, 0, 0, 0}; /* 2^32 */
    CHECK(write(sv[0], huge, 8) == 8);
    CHECK(fdlink_recv(b, &f, &n, &e) == MLA_ERR && strstr(e.msg, "4294967296 bytes exceeds 100"));
    CHECK(fdlink_recv(b, &f, &n, &e) == MLA_ERR);
    fdlink_free(b);
    close(sv[0]);
    /* the peer closing in the middle of a frame */
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    b = fdlink_new(sv[1], 100, &e);
    CHECK(write(sv[0], hdr, 8) == 8 && write(sv[0], "ab", 2) == 2);
    close(sv[0]);
    CHECK(fdlink_recv(b, &f, &n, &e) == MLA_ERR && strstr(e.msg, "in the middle of a frame"));
    fdlink_free(b);
    /* writing to a closed peer: an error, no SIGPIPE */
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    fdlink *a = fdlink_new(sv[0], 100, &e);
    close(sv[1]);
    CHECK(fdlink_send(a, "x", 1, &e) == MLA_ERR && strstr(e.msg, "link write"));
    fdlink_free(a);
    /* a descriptor that is not open */
    CHECK(fdlink_new(-1, 100, &e) == NULL && strstr(e.msg, "link descriptor -1"));
}

/* fdlink_pump: each whole frame to the callback in order, at most max_frames a call, stopping
 * when the callback says so; the rest wait for the next call; a closed peer is MLA_ERR */
typedef struct seen {
    int n, stop_at;
    char got[8];
} seen;

static int on_frame(void *ctx, const uint8_t *f, size_t n) {
    seen *s = ctx;
    if (n == 1 && s->n < 8) s->got[s->n] = (char)f[0];
    s->n++;
    return s->n == s->stop_at;
}

static void test_pump(void) {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    mla_err e;
    fdlink *a = fdlink_new(sv[0], 100, &e), *b = fdlink_new(sv[1], 100, &e);
    REQUIRE(a && b);
    for (const char *p = "abcde"; *p; p++) CHECK(fdlink_send(a, p, 1, &e) == MLA_OK);
    seen s = {0, 2, {0}};
    CHECK(fdlink_pump(b, true, 64, on_frame, &s, &e) == MLA_OK && s.n == 2); /* stopped at 2 */
    s.stop_at = 0;
    CHECK(fdlink_pump(b, false, 2, on_frame, &s, &e) == MLA_OK && s.n == 4); /* at most 2 */
    CHECK(fdlink_pump(b, false, 64, on_frame, &s, &e) == MLA_OK && s.n == 5);
    CHECK(memcmp(s.got, "abcde", 5) == 0);
    CHECK(fdlink_pump(b, false, 64, on_frame, &s, &e) == MLA_OK && s.n == 5); /* nothing more */
    fdlink_free(a);
    CHECK(fdlink_pump(b, false, 64, on_frame, &s, &e) == MLA_ERR && strstr(e.msg, "closed"));
    fdlink_free(b);
}

/* The peer sent frames, then went (a worker that reports a failed load and exits, while frames to
 * it sit unread): a write to it fails, later writes are refused, and what it sent is still read,
 * through fdlink_recv and through fdlink_pump, whose failed flush comes after the frames. */
static void test_read_after_failed_write(void) {
    static const uint8_t two[2][9] = {{1, 0, 0, 0, 0, 0, 0, 0, 'p'}, {1, 0, 0, 0, 0, 0, 0, 0, 'q'}};
    for (int pump = 0; pump < 2; pump++) {
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        mla_err e;
        fdlink *a = fdlink_new(sv[0], 100, &e);
        REQUIRE(a);
        CHECK(fdlink_send(a, "z", 1, &e) == MLA_OK); /* left unread by the peer */
        CHECK(write(sv[1], two[0], 9) == 9 && write(sv[1], two[1], 9) == 9);
        close(sv[1]);
        CHECK(fdlink_send(a, "x", 1, &e) == MLA_ERR && strstr(e.msg, "link write"));
        CHECK(fdlink_send(a, "y", 1, &e) == MLA_ERR && strstr(e.msg, "closed"));
        CHECK(fdlink_pending(a) > 0);
        if (pump) {
            seen s = {0, 0, {0}};
            /* the frames, then the end: a reset (the peer left "z" unread) */
            CHECKF(fdlink_pump(a, true, 64, on_frame, &s, &e) == MLA_ERR && strstr(e.msg, "link read"), "%s", e.msg);
            CHECKF(s.n == 2 && memcmp(s.got, "pq", 2) == 0, "pumped %d frames", s.n);
        } else {
            uint8_t *f;
            size_t n;
            for (int i = 0; i < 2; i++) {
                CHECKF(fdlink_recv(a, &f, &n, &e) == 1 && n == 1 && f[0] == two[i][8], "frame %d: %s", i, e.msg);
                free(f);
            }
            CHECKF(fdlink_recv(a, &f, &n, &e) == MLA_ERR && strstr(e.msg, "link read"), "%s", e.msg);
        }
        fdlink_free(a);
    }
}

int main(void) {
    test_order_and_queueing();
    test_partial_and_limits();
    test_pump();
    test_read_after_failed_write();
    return mla_test_finish();
}
