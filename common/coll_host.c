#include "coll_host.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sig_clean.h"

#define SEG_MAGIC 0x4d4c4143u /* "MLAC" */
#define SEG_VERSION 1u
#define HDR_BYTES 4096

typedef struct seg_hdr {
    uint32_t magic;
    uint32_t version;
    int32_t world;
    uint32_t pad0;
    uint64_t chunk_bytes;
    uint64_t total_bytes;
    _Atomic uint32_t abort_state; /* 0 none, 1 writing the message, 2 message ready */
    _Atomic uint32_t arrived;
    _Atomic uint32_t gen; /* futex word: bumped by the last rank to arrive */
    uint32_t pad1;
    char abort_msg[512];
} seg_hdr;

_Static_assert(sizeof(seg_hdr) <= HDR_BYTES, "header fits");

struct coll_host_seg {
    char name[COLL_HOST_NAME_MAX];
    seg_hdr *hdr;
    size_t size;
    int unlinked;
    int clean; /* its sig_clean entry: /dev/shm/NAME goes if a signal ends the process first */
};

typedef struct host_impl {
    seg_hdr *hdr;
    size_t size;
    unsigned char *slots; /* 2 sets x world slots x chunk_bytes */
    size_t chunk;
    int timeout_ms;
    unsigned set; /* which slot set the next chunk uses; identical on every rank */
    int dead;     /* this rank saw a failure; everything fails from now on */
    char dead_msg[600];
} host_impl;

/* ---- helpers ---------------------------------------------------------------------------- */

static long futex_wait(_Atomic uint32_t *addr, uint32_t expect, long ns) {
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    return syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expect, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void hdr_abort(seg_hdr *h, const char *why) {
    uint32_t expect = 0;
    if (atomic_compare_exchange_strong(&h->abort_state, &expect, 1)) {
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", why ? why : "aborted");
        atomic_store(&h->abort_state, 2);
    }
    futex_wake_all(&h->gen);
}

static void read_abort_msg(seg_hdr *h, char *buf, size_t n) {
    /* The writer holds state 1 only for one snprintf; wait for it briefly. */
    for (int i = 0; i < 100000 && atomic_load(&h->abort_state) == 1; i++) sched_yield();
    if (atomic_load(&h->abort_state) == 2) {
        char tmp[sizeof h->abort_msg];
        memcpy(tmp, h->abort_msg, sizeof tmp);
        tmp[sizeof tmp - 1] = '\0';
        snprintf(buf, n, "%s", tmp);
    } else {
        snprintf(buf, n, "aborted");
    }
}

static int fail_dead(host_impl *hi, mla_err *err) {
    return mla_errf(err, "host collective: %s", hi->dead_msg);
}

/* The barrier: every rank increments `arrived`; the last one resets it and bumps `gen`. */
static int barrier(coll *c, mla_err *err) {
    host_impl *hi = c->impl;
    seg_hdr *h = hi->hdr;
    if (hi->dead) return fail_dead(hi, err);
    if (atomic_load(&h->abort_state)) goto aborted;
    uint32_t gen = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->arrived, 1) == (uint32_t)c->world - 1) {
        atomic_store(&h->arrived, 0);
        atomic_fetch_add(&h->gen, 1);
        futex_wake_all(&h->gen);
        return MLA_OK;
    }
    for (int spin = 0; spin < 200; spin++) {
        if (atomic_load(&h->gen) != gen) return MLA_OK;
        sched_yield();
    }
    int64_t deadline = now_ns() + (int64_t)hi->timeout_ms * 1000000LL;
    for (;;) {
        if (atomic_load(&h->gen) != gen) return MLA_OK;
        if (atomic_load(&h->abort_state)) goto aborted;
        int64_t left = deadline - now_ns();
        if (left <= 0) {
            char why[256];
            snprintf(why, sizeof why,
                     "rank %d timed out after %d ms waiting for its peers (a peer died or hangs)",
                     c->rank, hi->timeout_ms);
            hdr_abort(h, why);
            hi->dead = 1;
            snprintf(hi->dead_msg, sizeof hi->dead_msg, "%s", why);
            return fail_dead(hi, err);
        }
        futex_wait(&h->gen, gen, left < 50000000L ? (long)left : 50000000L);
    }
aborted:;
    char msg[sizeof h->abort_msg];
    read_abort_msg(h, msg, sizeof msg);
    hi->dead = 1;
    snprintf(hi->dead_msg, sizeof hi->dead_msg, "group aborted: %s", msg);
    return fail_dead(hi, err);
}

static unsigned char *slot(host_impl *hi, int world, unsigned set, int r) {
    return hi->slots + ((size_t)set * (size_t)world + (size_t)r) * hi->chunk;
}

/* ---- operations ------------------------------------------------------------------------- */

static int host_allreduce_run(coll *c, float *buf, size_t n, mla_err *err);

/* every all-reduce of this process, for the worker's stats (coll_host_stats) */
static _Atomic uint64_t g_ar_count, g_ar_ns;

static int host_allreduce(coll *c, float *buf, size_t n, mla_err *err) {
    int64_t t0 = now_ns();
    int rc = host_allreduce_run(c, buf, n, err);
    atomic_fetch_add(&g_ar_ns, (uint64_t)(now_ns() - t0));
    atomic_fetch_add(&g_ar_count, 1);
    return rc;
}

void coll_host_stats(uint64_t *n_allreduce, double *seconds) {
    *n_allreduce = atomic_load(&g_ar_count);
    *seconds = (double)atomic_load(&g_ar_ns) / 1e9;
}

static int host_allreduce_run(coll *c, float *buf, size_t n, mla_err *err) {
    host_impl *hi = c->impl;
    if (hi->dead) return fail_dead(hi, err);
    const size_t per = hi->chunk / sizeof(float);
    const int T = c->world;
    if (n == 0) { /* keep every rank in step even for empty buffers */
        if (barrier(c, err)) return MLA_ERR;
        hi->set ^= 1u;
        return MLA_OK;
    }
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        unsigned s = hi->set;
        memcpy(slot(hi, T, s, c->rank), buf + off, m * sizeof(float));
        if (barrier(c, err)) return MLA_ERR;
        const float *src[COLL_HOST_MAX_WORLD];
        for (int r = 0; r < T; r++) src[r] = (const float *)slot(hi, T, s, r);
        float *dst = buf + off;
        for (size_t i = 0; i < m; i++) {
            float acc = src[0][i];
            for (int r = 1; r < T; r++) acc += src[r][i];
            dst[i] = acc;
        }
        hi->set ^= 1u;
    }
    return MLA_OK;
}

static int host_allgather(coll *c, const float *in, float *out, size_t n, mla_err *err) {
    host_impl *hi = c->impl;
    if (hi->dead) return fail_dead(hi, err);
    const size_t per = hi->chunk / sizeof(float);
    const int T = c->world;
    if (n == 0) {
        if (barrier(c, err)) return MLA_ERR;
        hi->set ^= 1u;
        return MLA_OK;
    }
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        unsigned s = hi->set;
        memcpy(slot(hi, T, s, c->rank), in + off, m * sizeof(float));
        if (barrier(c, err)) return MLA_ERR;
        for (int r = 0; r < T; r++)
            memcpy(out + (size_t)r * n + off, slot(hi, T, s, r), m * sizeof(float));
        hi->set ^= 1u;
    }
    return MLA_OK;
}

static int host_broadcast(coll *c, void *buf, size_t nbytes, int root, mla_err *err) {
    host_impl *hi = c->impl;
    if (hi->dead) return fail_dead(hi, err);
    MLA_ASSERT(root >= 0 && root < c->world);
    const int T = c->world;
    unsigned char *b = buf;
    if (nbytes == 0) {
        if (barrier(c, err)) return MLA_ERR;
        hi->set ^= 1u;
        return MLA_OK;
    }
    for (size_t off = 0; off < nbytes; off += hi->chunk) {
        size_t m = nbytes - off < hi->chunk ? nbytes - off : hi->chunk;
        unsigned s = hi->set;
        if (c->rank == root) memcpy(slot(hi, T, s, root), b + off, m);
        if (barrier(c, err)) return MLA_ERR;
        if (c->rank != root) memcpy(b + off, slot(hi, T, s, root), m);
        hi->set ^= 1u;
    }
    return MLA_OK;
}

static void host_destroy(coll *c) {
    host_impl *hi = c->impl;
    if (!hi) return;
    munmap(hi->hdr, hi->size);
    free(hi);
    c->impl = NULL;
}

static const coll_ops k_host_ops = {host_allreduce, host_allgather, host_broadcast, host_destroy};

/* ---- segment (owner side) ----------------------------------------------------------------- */

void coll_host_make_name(char *buf, size_t n) {
    static _Atomic unsigned counter = 0;
    unsigned k = atomic_fetch_add(&counter, 1);
    uint64_t r = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32) ^ ((uint64_t)k * 0x9e3779b97f4a7c15ull);
    r ^= r >> 29;
    r *= 0xbf58476d1ce4e5b9ull;
    r ^= r >> 32;
    snprintf(buf, n, "/mla-coll-%d-%u-%08x", (int)getpid(), k, (unsigned)(r & 0xffffffffu));
}

static size_t seg_size(int world, size_t chunk) {
    return HDR_BYTES + 2 * (size_t)world * chunk;
}

int coll_host_seg_create(coll_host_seg **out, const char *name, int world, size_t chunk_bytes,
                         mla_err *err) {
    *out = NULL;
    if (world < 1 || world > COLL_HOST_MAX_WORLD)
        return mla_errf(err, "host collective: world size %d outside [1, %d]", world,
                        COLL_HOST_MAX_WORLD);
    if (!name || name[0] != '/' || strlen(name) >= COLL_HOST_NAME_MAX || strchr(name + 1, '/'))
        return mla_errf(err, "host collective: bad shared-memory name '%s'", name ? name : "");
    if (chunk_bytes == 0) chunk_bytes = COLL_HOST_DEFAULT_CHUNK_BYTES;
    chunk_bytes = (chunk_bytes + 63) & ~(size_t)63;
    size_t size = seg_size(world, chunk_bytes);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return mla_errf(err, "host collective: shm_open(%s): %s", name, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return mla_errf(err, "host collective: sizing %s to %zu bytes: %s", name, size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return mla_errf(err, "host collective: mmap %s: %s", name, strerror(e));
    }
    seg_hdr *h = p;
    memset(h, 0, HDR_BYTES);
    h->world = world;
    h->chunk_bytes = chunk_bytes;
    h->total_bytes = size;
    atomic_store(&h->abort_state, 0);
    atomic_store(&h->arrived, 0);
    atomic_store(&h->gen, 0);
    h->version = SEG_VERSION;
    atomic_thread_fence(memory_order_seq_cst);
    h->magic = SEG_MAGIC;
    coll_host_seg *s = mla_xcalloc(1, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->hdr = h;
    s->size = size;
    char path[COLL_HOST_NAME_MAX + 16];
    snprintf(path, sizeof path, "/dev/shm%s", name); /* where Linux keeps POSIX shared memory */
    s->clean = sig_clean_file(path);
    *out = s;
    return MLA_OK;
}

const char *coll_host_seg_name(const coll_host_seg *s) { return s->name; }

void coll_host_seg_abort(coll_host_seg *s, const char *why) {
    if (s) hdr_abort(s->hdr, why);
}

void coll_host_seg_unlink(coll_host_seg *s) {
    if (!s || s->unlinked) return;
    shm_unlink(s->name);
    sig_clean_forget(s->clean); /* after: a signal in between finds it gone */
    s->unlinked = 1;
}

void coll_host_seg_free(coll_host_seg *s) {
    if (!s) return;
    munmap(s->hdr, s->size);
    coll_host_seg_unlink(s);
    free(s);
}

/* ---- attach (rank side) ------------------------------------------------------------------- */

int coll_host_attach(coll **out, const char *name, int rank, int world, int timeout_ms,
                     mla_err *err) {
    *out = NULL;
    if (world < 1 || world > COLL_HOST_MAX_WORLD || rank < 0 || rank >= world)
        return mla_errf(err, "host collective: rank %d / world %d out of range", rank, world);
    if (!name || name[0] != '/' || strlen(name) >= COLL_HOST_NAME_MAX || strchr(name + 1, '/'))
        return mla_errf(err, "host collective: bad shared-memory name '%s'", name ? name : "");
    if (timeout_ms <= 0) timeout_ms = COLL_HOST_DEFAULT_TIMEOUT_MS;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return mla_errf(err, "host collective: shm_open(%s): %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < HDR_BYTES) {
        close(fd);
        return mla_errf(err, "host collective: segment %s is too small", name);
    }
    size_t size = (size_t)st.st_size;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return mla_errf(err, "host collective: mmap %s: %s", name, strerror(e));
    seg_hdr *h = p;
    atomic_thread_fence(memory_order_seq_cst);
    if (h->magic != SEG_MAGIC || h->version != SEG_VERSION || h->world != world ||
        h->total_bytes != size || h->chunk_bytes == 0 || h->chunk_bytes % 64 ||
        seg_size(world, h->chunk_bytes) != size) {
        int w = h->world;
        munmap(p, size);
        return mla_errf(err,
                        "host collective: segment %s does not match (world %d expected, segment "
                        "says %d, or a bad header)",
                        name, world, w);
    }
    host_impl *hi = mla_xcalloc(1, sizeof *hi);
    hi->hdr = h;
    hi->size = size;
    hi->chunk = h->chunk_bytes;
    hi->slots = (unsigned char *)p + HDR_BYTES;
    hi->timeout_ms = timeout_ms;
    coll *c = mla_xcalloc(1, sizeof *c);
    c->ops = &k_host_ops;
    c->rank = rank;
    c->world = world;
    c->impl = hi;
    *out = c;
    return MLA_OK;
}

void coll_host_abort(coll *c, const char *why) {
    if (!c || c->ops != &k_host_ops || !c->impl) return;
    host_impl *hi = c->impl;
    hdr_abort(hi->hdr, why);
}
