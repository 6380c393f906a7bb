/* The shared-memory host collective with fork()ed ranks: all-reduce, all-gather and broadcast
 * for T = 1..4 with random data and buffers larger than a chunk; every rank must hold the same
 * bits, equal to the in-order float sum computed here; a killed peer gives an error (not a
 * hang); an abort set by the owner reaches waiting ranks with its reason. */
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_host.h"
#include "mla_test.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(rng_next(&s) >> 11) / 9007199254740992.0;
        x[i] = (float)((u - 0.5) * 200.0);
    }
}

/* Results area shared with the children: per rank, status + the output buffers. */
typedef struct shared_out {
    int status[8];
    char msg[8][1024];
} shared_out;

static void *shared_alloc(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    memset(p, 0, n);
    return p;
}

/* waits for every child, at most `secs` seconds in all; kills stragglers. Returns 1 if all
 * exited by themselves. */
static int wait_children(pid_t *pids, int n, int secs) {
    int ok = 1;
    time_t end = time(NULL) + secs;
    for (int i = 0; i < n; i++) {
        int st;
        for (;;) {
            pid_t r = waitpid(pids[i], &st, WNOHANG);
            if (r == pids[i]) break;
            if (time(NULL) > end) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &st, 0);
                ok = 0;
                break;
            }
            usleep(10000);
        }
    }
    return ok;
}

static void test_ops(int T, size_t n, size_t chunk) {
    char name[COLL_HOST_NAME_MAX];
    coll_host_make_name(name, sizeof name);
    coll_host_seg *seg;
    mla_err err;
    REQUIRE(coll_host_seg_create(&seg, name, T, chunk, &err) == MLA_OK);
    shared_out *so = shared_alloc(sizeof *so);
    float *red = shared_alloc((size_t)T * n * sizeof(float));
    float *gat = shared_alloc((size_t)T * T * n * sizeof(float));
    unsigned char *bc = shared_alloc((size_t)T * (n * 4 + 3));
    pid_t pids[8];
    for (int r = 0; r < T; r++) {
        pid_t p = fork();
        REQUIRE(p >= 0);
        if (p == 0) {
            alarm(60);
            coll *c;
            mla_err e;
            int rc = coll_host_attach(&c, name, r, T, 10000, &e);
            if (rc == MLA_OK) {
                float *x = malloc(n * sizeof(float) + 1);
                fill(x, n, 1000u + (uint64_t)r);
                rc = coll_allreduce_sum_f32(c, x, n, &e);
                memcpy(red + (size_t)r * n, x, n * sizeof(float));
                if (rc == MLA_OK) {
                    fill(x, n, 2000u + (uint64_t)r);
                    rc = coll_allgather_f32(c, x, gat + (size_t)r * T * n, n, &e);
                }
                if (rc == MLA_OK) {
                    size_t nb = n * 4 + 3;
                    unsigned char *b = bc + (size_t)r * nb;
                    if (r == T - 1)
                        for (size_t i = 0; i < nb; i++) b[i] = (unsigned char)(i * 7 + 3);
                    rc = coll_broadcast(c, b, nb, T - 1, &e);
                }
                if (rc == MLA_OK) rc = coll_allreduce_sum_f32(c, x, 0, &e); /* empty: in step */
                free(x);
                coll_free(c);
            }
            so->status[r] = rc;
            if (rc) snprintf(so->msg[r], sizeof so->msg[r], "%s", e.msg);
            _exit(0);
        }
        pids[r] = p;
    }
    CHECK(wait_children(pids, T, 60));
    for (int r = 0; r < T; r++) CHECKF(so->status[r] == MLA_OK, "T=%d rank %d: %s", T, r, so->msg[r]);

    /* reference: the in-order float sum, and a double sum for sanity */
    float *ref = malloc(n * sizeof(float)), *tmp = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = 0;
    for (int r = 0; r < T; r++) {
        fill(tmp, n, 1000u + (uint64_t)r);
        for (size_t i = 0; i < n; i++) ref[i] = r == 0 ? tmp[i] : ref[i] + tmp[i];
    }
    int same_bits = 1, ref_ok = 1;
    for (int r = 0; r < T; r++)
        if (memcmp(red + (size_t)r * n, red, n * sizeof(float))) same_bits = 0;
    if (memcmp(red, ref, n * sizeof(float))) ref_ok = 0;
    CHECKF(same_bits, "T=%d: all-reduce results differ between ranks", T);
    CHECKF(ref_ok, "T=%d: all-reduce differs from the in-order sum", T);
    int gat_ok = 1;
    for (int r = 0; r < T; r++)
        for (int q = 0; q < T; q++) {
            fill(tmp, n, 2000u + (uint64_t)q);
            if (memcmp(gat + ((size_t)r * T + (size_t)q) * n, tmp, n * sizeof(float))) gat_ok = 0;
        }
    CHECKF(gat_ok, "T=%d: all-gather wrong", T);
    int bc_ok = 1;
    size_t nb = n * 4 + 3;
    for (int r = 0; r < T; r++)
        for (size_t i = 0; i < nb; i++)
            if (bc[(size_t)r * nb + i] != (unsigned char)(i * 7 + 3)) bc_ok = 0;
    CHECKF(bc_ok, "T=%d: broadcast wrong", T);
    free(ref);
    free(tmp);
    munmap(so, sizeof *so);
    munmap(red, (size_t)T * n * sizeof(float));
    munmap(gat, (size_t)T * T * n * sizeof(float));
    munmap(bc, (size_t)T * (n * 4 + 3));
    coll_host_seg_free(seg);
}

/* rank T-1 is SIGKILLed before it joins; the others must fail within their timeout. */
static void test_killed_peer(int T) {
    char name[COLL_HOST_NAME_MAX];
    coll_host_make_name(name, sizeof name);
    coll_host_seg *seg;
    mla_err err;
    REQUIRE(coll_host_seg_create(&seg, name, T, 4096, &err) == MLA_OK);
    shared_out *so = shared_alloc(sizeof *so);
    pid_t pids[8];
    for (int r = 0; r < T; r++) {
        pid_t p = fork();
        REQUIRE(p >= 0);
        if (p == 0) {
            alarm(30);
            coll *c;
            mla_err e;
            int rc = coll_host_attach(&c, name, r, T, 500, &e);
            if (rc == MLA_OK) {
                float x[3000];
                for (int i = 0; i < 3000; i++) x[i] = (float)i;
                /* one good round, then the last rank dies */
                rc = coll_allreduce_sum_f32(c, x, 3000, &e);
                if (r == T - 1) raise(SIGKILL);
                if (rc == MLA_OK) rc = coll_allreduce_sum_f32(c, x, 3000, &e);
                int rc2 = coll_allreduce_sum_f32(c, x, 10, &e); /* dead group: fails at once */
                if (rc == MLA_ERR && rc2 != MLA_ERR) rc = 99;
                coll_free(c);
            }
            so->status[r] = rc;
            snprintf(so->msg[r], sizeof so->msg[r], "%s", rc ? e.msg : "");
            _exit(0);
        }
        pids[r] = p;
    }
    CHECKF(wait_children(pids, T, 30), "ranks hung after a peer died");
    for (int r = 0; r < T - 1; r++) {
        CHECKF(so->status[r] == MLA_ERR, "T=%d rank %d status %d", T, r, so->status[r]);
        CHECKF(strstr(so->msg[r], "timed out") || strstr(so->msg[r], "aborted"), "msg: %s",
               so->msg[r]);
    }
    munmap(so, sizeof *so);
    coll_host_seg_free(seg);
}

/* the owner aborts while rank 0 waits for rank 1 (which never comes): rank 0 sees the reason. */
static void test_owner_abort(void) {
    char name[COLL_HOST_NAME_MAX];
    coll_host_make_name(name, sizeof name);
    coll_host_seg *seg;
    mla_err err;
    REQUIRE(coll_host_seg_create(&seg, name, 2, 0, &err) == MLA_OK);
    shared_out *so = shared_alloc(sizeof *so);
    pid_t p = fork();
    REQUIRE(p >= 0);
    if (p == 0) {
        alarm(30);
        coll *c;
        mla_err e;
        int rc = coll_host_attach(&c, name, 0, 2, 60000, &e);
        if (rc == MLA_OK) {
            float x[4] = {1, 2, 3, 4};
            rc = coll_allreduce_sum_f32(c, x, 4, &e);
            coll_free(c);
        }
        so->status[0] = rc;
        snprintf(so->msg[0], sizeof so->msg[0], "%s", rc ? e.msg : "");
        _exit(0);
    }
    usleep(200000);
    coll_host_seg_abort(seg, "worker 1 died (test)");
    CHECKF(wait_children(&p, 1, 20), "rank 0 did not notice the abort");
    CHECK(so->status[0] == MLA_ERR);
    CHECKF(strstr(so->msg[0], "worker 1 died (test)") != NULL, "msg: %s", so->msg[0]);
    /* a late rank attaching to an aborted group fails at once too */
    coll *c;
    REQUIRE(coll_host_attach(&c, name, 1, 2, 60000, &err) == MLA_OK);
    float y = 1;
    CHECK(coll_allreduce_sum_f32(c, &y, 1, &err) == MLA_ERR);
    coll_free(c);
    munmap(so, sizeof *so);
    coll_host_seg_free(seg);
}

static void test_bad_attach(void) {
    char name[COLL_HOST_NAME_MAX];
    coll_host_make_name(name, sizeof name);
    coll_host_seg *seg;
    mla_err err;
    coll *c = NULL;
    CHECK(coll_host_attach(&c, name, 0, 2, 0, &err) == MLA_ERR); /* no such segment */
    REQUIRE(coll_host_seg_create(&seg, name, 2, 0, &err) == MLA_OK);
    coll_host_seg *seg2 = NULL;
    CHECK(coll_host_seg_create(&seg2, name, 2, 0, &err) == MLA_ERR && !seg2); /* exclusive */
    CHECK(coll_host_attach(&c, name, 0, 3, 0, &err) == MLA_ERR);    /* world mismatch */
    CHECK(strstr(err.msg, "does not match") != NULL);
    CHECK(coll_host_attach(&c, name, 2, 2, 0, &err) == MLA_ERR); /* rank out of range */
    CHECK(coll_host_attach(&c, "no-slash", 0, 2, 0, &err) == MLA_ERR);
    coll_host_seg_free(seg);
}

int main(void) {
    for (int T = 1; T <= 4; T++) {
        test_ops(T, 1, 0);
        test_ops(T, 1000, 256);        /* several chunks, last one partial */
        test_ops(T, 300001, 1 << 16);  /* larger */
    }
    test_killed_peer(2);
    test_killed_peer(3);
    test_owner_abort();
    test_bad_attach();
    return mla_test_finish();
}
