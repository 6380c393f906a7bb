#include "fdlink.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HDR 8

struct fdlink {
    int fd;
    size_t max_frame;
    uint8_t *out; /* queued bytes [out_off, out_len) */
    size_t out_off, out_len, out_cap;
    uint8_t *in; /* received bytes [0, in_len), a frame at a time at its start */
    size_t in_len, in_cap;
    bool dead;  /* the stream ended or cannot be trusted: nothing more either way */
    bool wdead; /* a write failed (the peer is gone): no more writes, but what it sent before can
                 * still be read */
};

fdlink *fdlink_new(int fd, size_t max_frame, mla_err *err) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        mla_errf(err, "link descriptor %d: %s", fd, strerror(errno));
        return NULL;
    }
    fdlink *l = mla_xcalloc(1, sizeof *l);
    l->fd = fd;
    l->max_frame = max_frame;
    return l;
}

void fdlink_free(fdlink *l) {
    if (!l) return;
    close(l->fd);
    free(l->out);
    free(l->in);
    free(l);
}

int fdlink_fd(const fdlink *l) { return l->fd; }

size_t fdlink_pending(const fdlink *l) { return l->out_len - l->out_off; }

int fdlink_flush(fdlink *l, mla_err *err) {
    if (l->dead || l->wdead) return mla_errf(err, "link closed");
    while (l->out_off < l->out_len) {
        /* MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE */
        ssize_t k = send(l->fd, l->out + l->out_off, l->out_len - l->out_off, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return MLA_OK;
            l->wdead = true;
            return mla_errf(err, "link write: %s", strerror(errno));
        }
        l->out_off += (size_t)k;
    }
    l->out_off = l->out_len = 0;
    return MLA_OK;
}

int fdlink_send(fdlink *l, const void *buf, size_t n, mla_err *err) {
    if (l->dead || l->wdead) return mla_errf(err, "link closed");
    if (n > l->max_frame) return mla_errf(err, "link: a frame of %zu bytes exceeds %zu", n, l->max_frame);
    if (l->out_off > 0 && l->out_off == l->out_len) l->out_off = l->out_len = 0;
    if (l->out_off > 0 && l->out_len + HDR + n > l->out_cap) { /* compact before growing */
        memmove(l->out, l->out + l->out_off, l->out_len - l->out_off);
        l->out_len -= l->out_off;
        l->out_off = 0;
    }
    if (l->out_len + HDR + n > l->out_cap) {
        l->out_cap = 2 * (l->out_len + HDR + n);
        l->out = mla_xrealloc(l->out, l->out_cap);
    }
    uint8_t *p = l->out + l->out_len;
    for (int i = 0; i < HDR; i++) p[i] = (uint8_t)((uint64_t)n >> (8 * i));
    if (n) memcpy(p + HDR, buf, n);
    l->out_len += HDR + n;
    return fdlink_flush(l, err);
}

int fdlink_pump(fdlink *l, bool writable, int max_frames, int (*on_frame)(void *ctx, const uint8_t *frame, size_t n),
                void *ctx, mla_err *err) {
    /* a failed write still lets the frames that arrived before it be handed out */
    mla_err werr;
    const bool wfail = writable && fdlink_flush(l, &werr) != MLA_OK;
    for (int k = 0; k < max_frames; k++) {
        uint8_t *f;
        size_t n;
        int got = fdlink_recv(l, &f, &n, err);
        if (got < 0) return got;
        if (got == 0) break;
        int stop = on_frame(ctx, f, n);
        free(f);
        if (stop) break;
    }
    if (wfail) {
        if (err) *err = werr;
        return MLA_ERR;
    }
    return MLA_OK;
}

/* the length in the header at l->in (HDR bytes there) */
static uint64_t hdr_len(const fdlink *l) {
    uint64_t v = 0;
    for (int i = 0; i < HDR; i++) v |= (uint64_t)l->in[i] << (8 * i);
    return v;
}

int fdlink_recv(fdlink *l, uint8_t **frame, size_t *n, mla_err *err) {
    *frame = NULL;
    *n = 0;
    if (l->dead) return mla_errf(err, "link closed");
    for (;;) {
        /* a whole frame at the start of the buffer: hand it out */
        if (l->in_len >= HDR) {
            uint64_t len = hdr_len(l);
            if (len > l->max_frame) {
                l->dead = true;
                return mla_errf(err, "link: a frame of %llu bytes exceeds %zu", (unsigned long long)len, l->max_frame);
            }
            if (l->in_len >= HDR + len) {
                uint8_t *f = mla_xmalloc(len ? len : 1);
                memcpy(f, l->in + HDR, len);
                memmove(l->in, l->in + HDR + len, l->in_len - HDR - len);
                l->in_len -= HDR + len;
                *frame = f;
                *n = len;
                return 1;
            }
            if (l->in_cap < HDR + len) {
                l->in_cap = HDR + len;
                l->in = mla_xrealloc(l->in, l->in_cap);
            }
        }
        if (l->in_cap - l->in_len < 4096) {
            l->in_cap = l->in_cap ? 2 * l->in_cap : 65536;
            l->in = mla_xrealloc(l->in, l->in_cap);
        }
        ssize_t k = recv(l->fd, l->in + l->in_len, l->in_cap - l->in_len, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            l->dead = true;
            return mla_errf(err, "link read: %s", strerror(errno));
        }
        if (k == 0) {
            l->dead = true;
            return mla_errf(err, "link closed by the peer%s", l->in_len ? " in the middle of a frame" : "");
        }
        l->in_len += (size_t)k;
    }
}
