/* coord_step: the caller's side of a worker group (coordinator/coord.h): a step plan, freed
 * sequences and bench requests go to the I/O thread (coord_io.c) over an inproc pair, and the
 * caller waits for the answer. */
#include "coord_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/steptrace.h"

/* waits for the I/O thread's answer: 'R' + result pointer, 'S' + a double (bench), 'K', or 'E' +
 * message */
static int api_wait_any(coord *c, wire_msg **res, double *sec, mla_err *err) {
    zmq_msg_t tag, body;
    zmq_msg_init(&tag);
    zmq_msg_init(&body);
    int rc = MLA_OK;
    zmq_pollitem_t it = {c->api_user, 0, ZMQ_POLLIN, 0};
    zspin_poll(&it, 1, -1, c->spin_us); /* the answer to a decode step comes within milliseconds */
    while (zmq_msg_recv(&tag, c->api_user, 0) < 0) {
        if (zmq_errno() != EINTR) {
            zmq_msg_close(&tag);
            return mla_errf(err, "coordinator: %s", zmq_strerror(zmq_errno()));
        }
    }
    char t = *(char *)zmq_msg_data(&tag);
    if (zmq_msg_more(&tag)) zmq_msg_recv(&body, c->api_user, 0);
    if (t == 'E') {
        rc = mla_errf(err, "%.*s", (int)zmq_msg_size(&body), (const char *)zmq_msg_data(&body));
    } else if (t == 'R') {
        MLA_ASSERT(res && zmq_msg_size(&body) == sizeof *res);
        memcpy(res, zmq_msg_data(&body), sizeof *res);
    } else if (t == 'S') {
        MLA_ASSERT(sec && zmq_msg_size(&body) == sizeof *sec);
        memcpy(sec, zmq_msg_data(&body), sizeof *sec);
    }
    zmq_msg_close(&tag);
    zmq_msg_close(&body);
    return rc;
}

static int api_wait(coord *c, wire_msg **res, mla_err *err) { return api_wait_any(c, res, NULL, err); }

static int api_send(coord *c, char tag, uint64_t *prefix, const uint8_t *buf, size_t n) {
    zmq_msg_t m;
    size_t pre = prefix ? sizeof *prefix : 0;
    zmq_msg_init_size(&m, pre + n);
    if (prefix) memcpy(zmq_msg_data(&m), prefix, pre);
    memcpy((uint8_t *)zmq_msg_data(&m) + pre, buf, n);
    zmq_send(c->api_user, &tag, 1, ZMQ_SNDMORE);
    int rc = zmq_msg_send(&m, c->api_user, 0);
    if (rc < 0) zmq_msg_close(&m);
    return rc < 0 ? MLA_ERR : MLA_OK;
}

/* Encodes m and decodes it back as a worker will (cheap, and a bad request fails here with a
 * clear message naming `what`). *buf is the caller's on success. */
static int encode_checked(const wire_msg *m, const wire_limits *lim, const char *what, uint8_t **buf, size_t *n,
                          mla_err *err) {
    if (wire_encode(m, buf, n, err)) return MLA_ERR;
    wire_msg chk;
    if (wire_decode(*buf, *n, lim, &chk, err)) {
        free(*buf);
        *buf = NULL;
        return mla_err_prefix(err, "invalid %s", what);
    }
    wire_msg_free(&chk);
    return MLA_OK;
}

int coord_step(coord *c, const wire_step_plan *plan, wire_step_result *out, mla_err *err) {
    memset(out, 0, sizeof *out);
    /* the workers sized their scratch for the group's steps at load: a larger step would make them
     * grow it after the cache pool took the memory */
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++) tokens += plan->seqs[i].n_tokens;
    const uint32_t max_t = wire_kv_step_cap(&c->cfg.kv);
    if (plan->n_seqs > c->cfg.kv.max_seqs || tokens > max_t)
        return mla_errf(err, "coordinator: a step of %u sequences and %llu tokens; the workers were sized for %u sequences "
                             "and %u tokens a step",
                        plan->n_seqs, (unsigned long long)tokens, c->cfg.kv.max_seqs, max_t);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_STEP_PLAN;
    m.u.plan = *plan;
    uint8_t *buf;
    size_t n;
    wire_limits lim = {.n_vocab = c->n_vocab, .world = (uint32_t)c->cfg.world};
    if (encode_checked(&m, &lim, "step plan", &buf, &n, err)) return MLA_ERR;
    pthread_mutex_lock(&c->api_mu);
    uint64_t id = plan->step_id;
    steptrace_mark(id, 'A');
    int rc = api_send(c, 'P', &id, buf, n);
    free(buf);
    wire_msg *res = NULL;
    if (rc == MLA_OK) rc = api_wait(c, &res, err);
    else mla_errf(err, "coordinator: cannot queue the step");
    pthread_mutex_unlock(&c->api_mu);
    steptrace_mark(id, 'H');
    if (rc) return MLA_ERR;
    *out = res->u.result;
    free(res);
    return MLA_OK;
}

void coord_result_free(wire_step_result *r) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_STEP_RESULT;
    m.u.result = *r;
    wire_msg_free(&m);
    memset(r, 0, sizeof *r);
}

int coord_free_seqs(coord *c, const uint64_t *ids, uint32_t n, mla_err *err) {
    if (n == 0) return MLA_OK;
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = WIRE_CTL_FREE_SEQ;
    m.u.ctl.n_seq_ids = n;
    m.u.ctl.seq_ids = (uint64_t *)ids;
    uint8_t *buf;
    size_t len;
    if (wire_encode(&m, &buf, &len, err)) return MLA_ERR;
    pthread_mutex_lock(&c->api_mu);
    int rc = api_send(c, 'F', NULL, buf, len);
    free(buf);
    if (rc == MLA_OK) rc = api_wait(c, NULL, err);
    pthread_mutex_unlock(&c->api_mu);
    return rc;
}

/* Sends a Bench request to every rank and waits until all answered (or the group failed). */
static int coord_bench(coord *c, wire_bench *b, double *sec, mla_err *err) {
    static _Atomic uint64_t next_id = 1;
    b->bench_id = atomic_fetch_add(&next_id, 1);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_BENCH;
    m.u.bench = *b;
    uint8_t *buf;
    size_t n;
    if (encode_checked(&m, NULL, "bench request", &buf, &n, err)) return MLA_ERR;
    pthread_mutex_lock(&c->api_mu);
    uint64_t id = b->bench_id;
    int rc = api_send(c, 'B', &id, buf, n);
    free(buf);
    double s = 0;
    if (rc == MLA_OK) rc = api_wait_any(c, NULL, &s, err);
    else mla_errf(err, "coordinator: cannot queue the bench request");
    pthread_mutex_unlock(&c->api_mu);
    if (rc == MLA_OK && sec) *sec = s;
    return rc;
}

int coord_slot_table(const coord *c, uint32_t slot, uint32_t n_slots, uint32_t positions, uint32_t *ids, uint32_t *n,
                     mla_err *err) {
    coord_kv_info k;
    coord_kv_pool(c, &k);
    if (k.block_size == 0) return mla_errf(err, "the workers reported no cache pool");
    const uint64_t per = ((uint64_t)positions + k.block_size - 1) / k.block_size;
    if (slot >= n_slots || per * n_slots > k.n_blocks)
        return mla_errf(err, "%u sequences of %u positions need %llu cache blocks of %u positions; the pool holds %u "
                             "(--kv-memory, --gpu-memory-utilization)",
                        n_slots, positions, (unsigned long long)(per * n_slots), k.block_size, k.n_blocks);
    for (uint64_t b = 0; b < per; b++) ids[b] = (uint32_t)(slot * per + b);
    *n = (uint32_t)per;
    return MLA_OK;
}

uint32_t coord_table_len(const coord *c, uint32_t positions) {
    const uint32_t bs = c->ranks[0].kv_block_size ? c->ranks[0].kv_block_size : 1;
    return (uint32_t)(((uint64_t)positions + bs - 1) / bs);
}

int coord_bench_fill(coord *c, const uint64_t *ids, uint32_t n, uint32_t n_past, uint32_t cover, mla_err *err) {
    const uint32_t per = coord_table_len(c, cover > n_past ? cover : n_past);
    uint32_t *blocks = mla_xmalloc((size_t)n * (per ? per : 1) * sizeof *blocks);
    int rc = MLA_OK;
    for (uint32_t i = 0; rc == MLA_OK && i < n; i++) {
        uint32_t got;
        rc = coord_slot_table(c, i, n, cover > n_past ? cover : n_past, blocks + (size_t)i * per, &got, err);
    }
    if (rc == MLA_OK) {
        wire_bench b = {.op = WIRE_BENCH_FILL, .n_seq_ids = n, .seq_ids = (uint64_t *)ids, .n_past = n_past,
                        .blocks_per_seq = per, .n_blocks = n * per, .blocks = blocks};
        rc = coord_bench(c, &b, NULL, err);
    }
    free(blocks);
    return rc;
}

int coord_bench_coll(coord *c, size_t n_floats, int iters, double *sec_per_op, mla_err *err) {
    if (iters < 1) return mla_errf(err, "%d all-reduce iterations (need at least 1)", iters);
    wire_bench b = {.op = WIRE_BENCH_COLL, .n_floats = n_floats, .iters = (uint32_t)iters};
    *sec_per_op = 0;
    return coord_bench(c, &b, sec_per_op, err);
}
