/* coord_io: the coordinator's I/O thread (coordinator/coord.h). It owns the ROUTER socket and the
 * local links: sends each request from the caller (coord_step.c) to the ranks, routes the frames
 * the workers send back, and fails the group when something goes wrong. */
#include "coord_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/steptrace.h"
#include "mla_log.h"

int64_t coord_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- I/O thread helpers -------------------------------------------------------------------- */

/* a send to rank r failed (why) or went through (NULL): one warning a run of failures */
static void send_outcome(rank_st *rs, int r, const char *why) {
    if (why && !rs->send_failing)
        MLA_WARN("send to worker %d: %s (further failures not logged until a send goes through)", r, why);
    else if (!why && rs->send_failing) MLA_INFO("send to worker %d: delivered again", r);
    rs->send_failing = why != NULL;
}

void coord_send_to_rank(coord *c, int r, const void *buf, size_t n) {
    rank_st *rs = &c->ranks[r];
    if (!rs->registered || rs->link_dead) return;
    if (rs->link_on) {
        mla_err err;
        send_outcome(rs, r, fdlink_send(rs->link, buf, n, &err) ? err.msg : NULL);
        return;
    }
    const bool ok =
        zmq_send(c->router, rs->ident, rs->ident_len, ZMQ_SNDMORE) >= 0 && zmq_send(c->router, buf, n, 0) >= 0;
    send_outcome(rs, r, ok ? NULL : zmq_strerror(zmq_errno()));
}

void coord_send_frame_to_ident(coord *c, const void *ident, size_t ilen, const wire_msg *m) {
    uint8_t *buf;
    size_t n;
    mla_err err;
    if (wire_encode(m, &buf, &n, &err)) {
        MLA_ERROR("%s", err.msg);
        return;
    }
    if (zmq_send(c->router, ident, ilen, ZMQ_SNDMORE) < 0 || zmq_send(c->router, buf, n, 0) < 0)
        MLA_WARN("send: %s", zmq_strerror(zmq_errno()));
    free(buf);
}

static void broadcast_control(coord *c, wire_control_kind kind) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = kind;
    uint8_t *buf;
    size_t n;
    mla_err err;
    if (wire_encode(&m, &buf, &n, &err)) MLA_PANIC("%s", err.msg);
    for (int r = 0; r < c->cfg.world; r++)
        if (c->ranks[r].registered && !c->ranks[r].exited) coord_send_to_rank(c, r, buf, n);
    free(buf);
}

static void api_reply(coord *c, char tag, const void *payload, size_t n) {
    zmq_send(c->api_io, &tag, 1, n ? ZMQ_SNDMORE : 0);
    if (n) zmq_send(c->api_io, payload, n, 0);
}

static void api_reply_err(coord *c, const char *msg) { api_reply(c, 'E', msg, strlen(msg) + 1); }

/* The group failed: remember why (first reason wins), release the ranks blocked in the
 * collective, fail the in-flight step, tell the survivors to shut down. */
void coord_group_fail(coord *c, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    int first = c->state == ST_STARTING || c->state == ST_READY;
    if (first) {
        c->state = ST_FAILED;
        c->fail_at = coord_now_ms();
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", msg);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!first) return;
    MLA_ERROR("worker group failed: %s", msg);
    coll_host_seg_abort(c->seg, msg);
    if (c->inflight) {
        char m2[1200];
        snprintf(m2, sizeof m2, "%s %" PRIu64 " failed: %s", c->inflight_bench ? "bench request" : "step",
                 c->inflight_step, msg);
        api_reply_err(c, m2);
        c->inflight = 0;
    }
    broadcast_control(c, WIRE_CTL_SHUTDOWN);
}

static void handle_frame(coord *c, int r, const void *ident, size_t ilen, const void *data, size_t len);

static void handle_router(coord *c) {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, c->router, 0) < 0) goto out;
    if (!zmq_msg_more(&id)) goto out;
    if (zmq_msg_recv(&body, c->router, 0) < 0) goto out;
    while (zmq_msg_more(&body)) { /* a well-behaved peer never sends more parts */
        zmq_msg_close(&body);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, c->router, 0) < 0) goto out;
    }
    const void *ident = zmq_msg_data(&id);
    size_t ilen = zmq_msg_size(&id);
    int r = coord_find_rank(c, ident, ilen);
    if (r >= 0 && (c->ranks[r].link_on || c->ranks[r].link_dead))
        MLA_WARN("dropping a ZeroMQ frame from worker %d (it talks over its link)", r);
    else
        handle_frame(c, r, ident, ilen, zmq_msg_data(&body), zmq_msg_size(&body));
out:
    zmq_msg_close(&id);
    zmq_msg_close(&body);
}

/* One frame from worker r (-1: a peer not registered yet, which may only register; ident its
 * ZeroMQ routing id), from the router or from the worker's link. */
static void handle_frame(coord *c, int r, const void *ident, size_t ilen, const void *data, size_t len) {
    wire_limits lim = {.n_vocab = c->n_vocab, .world = (uint32_t)c->cfg.world};
    wire_msg m;
    mla_err err;
    if (wire_decode(data, len, &lim, &m, &err)) {
        MLA_WARN("dropping a malformed frame from %s: %s", r >= 0 ? "a worker" : "an unknown peer", err.msg);
        return;
    }
    if (r < 0) {
        if (m.kind == WIRE_REGISTER) coord_handle_register(c, ident, ilen, &m.u.reg);
        else MLA_WARN("dropping a %s frame from an unregistered peer", wire_kind_name(m.kind));
        wire_msg_free(&m);
        return;
    }
    c->ranks[r].last_rx = coord_now_ms();
    switch (m.kind) {
    case WIRE_CONTROL:
        if (m.u.ctl.kind == WIRE_CTL_HEARTBEAT && m.u.ctl.has_stats) {
            pthread_mutex_lock(&c->mu);
            c->ranks[r].has_stats = 1;
            c->ranks[r].stats = m.u.ctl.stats;
            pthread_mutex_unlock(&c->mu);
        } else if (m.u.ctl.kind == WIRE_CTL_LOAD_PROGRESS) {
            rank_st *rs = &c->ranks[r];
            int64_t t = c->ranks[r].last_rx;
            pthread_mutex_lock(&c->mu);
            int more = m.u.ctl.load_done > rs->load_done || m.u.ctl.load_total != rs->load_total;
            if (!rs->load_t0) rs->load_t0 = t;
            if (more) rs->load_t = t;
            rs->load_done = m.u.ctl.load_done;
            rs->load_total = m.u.ctl.load_total;
            pthread_mutex_unlock(&c->mu);
            if (more) c->start_deadline = t + c->cfg.start_timeout_ms; /* the timeout counts time without progress */
            MLA_DEBUG("worker %d: loaded %" PRIu64 " of %" PRIu64 " bytes", r, m.u.ctl.load_done, m.u.ctl.load_total);
        } else if (m.u.ctl.kind == WIRE_CTL_LOADED) {
            if (m.u.ctl.status != 0) {
                coord_group_fail(c, "worker %d failed to load the model: %s", r, m.u.ctl.message);
            } else if (c->n_vocab && c->n_vocab != m.u.ctl.n_vocab) {
                coord_group_fail(c, "worker %d reports vocabulary %u, others %u", r, m.u.ctl.n_vocab, c->n_vocab);
            } else if (r > 0 && c->ranks[0].kv_block_size && c->ranks[0].kv_block_size != m.u.ctl.kv_block_size) {
                coord_group_fail(c, "worker %d uses cache blocks of %u positions, worker 0 of %u", r, m.u.ctl.kv_block_size,
                           c->ranks[0].kv_block_size);
            } else {
                c->n_vocab = m.u.ctl.n_vocab;
                pthread_mutex_lock(&c->mu);
                c->ranks[r].kv_blocks = m.u.ctl.kv_blocks;
                c->ranks[r].kv_block_size = m.u.ctl.kv_block_size;
                c->ranks[r].kv_block_bytes = m.u.ctl.kv_block_bytes;
                c->ranks[r].has_backend = m.u.ctl.has_backend;
                c->ranks[r].backend = m.u.ctl.backend;
                c->ranks[r].loaded = 1;
                if (c->ranks[r].load_total) c->ranks[r].load_done = c->ranks[r].load_total;
                pthread_mutex_unlock(&c->mu);
                c->start_deadline = c->ranks[r].last_rx + c->cfg.start_timeout_ms;
                coord_check_ready(c);
            }
        } else if (m.u.ctl.kind == WIRE_CTL_ERROR) {
            coord_group_fail(c, "worker %d: %s", r, m.u.ctl.message);
        } else if (m.u.ctl.kind == WIRE_CTL_NCCL_ID) {
            /* wire_decode checked 128 bytes and rank 0 in the frame; the sender must be rank 0 */
            if (r != 0) {
                MLA_WARN("dropping an NCCL id from worker %d (only rank 0 makes it)", r);
            } else if (c->nccl_id_known) {
                MLA_WARN("dropping a second NCCL id from worker 0");
            } else {
                memcpy(c->nccl_id, m.u.ctl.nccl_id, WIRE_MAX_NCCL_ID);
                c->nccl_id_known = 1;
                int n = 0;
                for (int q = 1; q < c->cfg.world; q++)
                    if (c->ranks[q].registered && !c->ranks[q].exited) coord_send_nccl_id(c, q), n++;
                MLA_INFO("NCCL id from worker 0 relayed to %d registered rank(s); later ones get it at registration", n);
            }
        }
        break;
    case WIRE_STEP_RESULT:
        if (r != 0) {
            MLA_WARN("dropping a step result from worker %d (only rank 0 answers)", r);
        } else if (!c->inflight || c->inflight_bench || m.u.result.step_id != c->inflight_step) {
            MLA_WARN("dropping a result for step %" PRIu64 " (none in flight with that id)", m.u.result.step_id);
        } else if (!m.u.result.ok) {
            coord_group_fail(c, "worker 0: %s", m.u.result.error);
        } else {
            steptrace_mark(m.u.result.step_id, 'G');
            wire_msg *heap = mla_xmalloc(sizeof *heap);
            *heap = m;
            memset(&m, 0, sizeof m);
            c->inflight = 0;
            atomic_store(&c->consecutive_restarts, 0);
            api_reply(c, 'R', &heap, sizeof heap);
        }
        break;
    case WIRE_BENCH_RESULT: {
        const wire_bench_result *br = &m.u.bench_result;
        if (!c->inflight || !c->inflight_bench || br->bench_id != c->inflight_step) {
            MLA_WARN("dropping a bench result %" PRIu64 " from worker %d (none in flight with that id)", br->bench_id, r);
        } else if ((int)br->rank != r || c->bench_answered[r]) {
            MLA_WARN("dropping a bench result from worker %d (rank %u in the frame%s)", r, br->rank,
                     c->bench_answered[r] ? ", already answered" : "");
        } else {
            /* every rank answers; the lowest failing rank's error is reported (whatever the order of
             * arrival), else the slowest rank's time */
            c->bench_answered[r] = 1;
            c->bench_n_answered++;
            if (!br->ok && (!c->bench_err[0] || r < c->bench_err_rank)) {
                snprintf(c->bench_err, sizeof c->bench_err, "worker %d: %s", r, br->error);
                c->bench_err_rank = r;
            }
            if (br->ok && br->sec_per_op > c->bench_sec) c->bench_sec = br->sec_per_op;
            if (c->bench_n_answered == c->cfg.world) {
                c->inflight = 0;
                if (c->bench_err[0]) api_reply_err(c, c->bench_err);
                else api_reply(c, 'S', &c->bench_sec, sizeof c->bench_sec);
            }
        }
        break;
    }
    default:
        MLA_WARN("dropping an unexpected %s frame from worker %d", wire_kind_name(m.kind), r);
        break;
    }
    wire_msg_free(&m);
}

/* returns 1 when asked to quit */
static int handle_api(coord *c) {
    zmq_msg_t tag, body;
    zmq_msg_init(&tag);
    zmq_msg_init(&body);
    int quit = 0;
    if (zmq_msg_recv(&tag, c->api_io, 0) < 0) goto out;
    char t = *(char *)zmq_msg_data(&tag);
    if (zmq_msg_more(&tag) && zmq_msg_recv(&body, c->api_io, 0) < 0) goto out;
    if (t == 'Q') {
        quit = 1;
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    int st = c->state;
    char why[1024];
    snprintf(why, sizeof why, "%s", c->fail_msg);
    pthread_mutex_unlock(&c->mu);
    if (st != ST_READY) {
        char m[1100];
        snprintf(m, sizeof m, "the worker group is not available: %s",
                 st == ST_FAILED ? why : "not ready");
        api_reply_err(c, m);
        goto out;
    }
    if (t == 'P' || t == 'B') {
        if (c->inflight) {
            api_reply_err(c, "a step or bench request is already in flight");
            goto out;
        }
        /* the step id sits in the frame; the API side passed it first */
        uint64_t step_id;
        MLA_ASSERT(zmq_msg_size(&body) > sizeof step_id);
        memcpy(&step_id, zmq_msg_data(&body), sizeof step_id);
        const uint8_t *frame = (const uint8_t *)zmq_msg_data(&body) + sizeof step_id;
        size_t n = zmq_msg_size(&body) - sizeof step_id;
        c->inflight = 1;
        c->inflight_bench = t == 'B';
        c->inflight_step = step_id;
        c->inflight_since = coord_now_ms();
        if (t == 'B') {
            memset(c->bench_answered, 0, sizeof c->bench_answered);
            c->bench_n_answered = 0;
            c->bench_sec = 0;
            c->bench_err[0] = '\0';
        }
        if (t == 'P') steptrace_mark(step_id, 'B');
        MLA_DEBUG("%s %" PRIu64 ": a frame of %zu bytes to %d ranks", t == 'P' ? "step" : "bench request", step_id, n,
                  c->cfg.world);
        for (int r = 0; r < c->cfg.world; r++) coord_send_to_rank(c, r, frame, n);
    } else if (t == 'F') {
        for (int r = 0; r < c->cfg.world; r++) coord_send_to_rank(c, r, zmq_msg_data(&body), zmq_msg_size(&body));
        api_reply(c, 'K', NULL, 0);
    }
out:
    zmq_msg_close(&tag);
    zmq_msg_close(&body);
    return quit;
}

typedef struct link_src {
    coord *c;
    int r;
} link_src;

static int link_frame(void *ctx, const uint8_t *f, size_t n) {
    const link_src *ls = ctx;
    const rank_st *rs = &ls->c->ranks[ls->r];
    handle_frame(ls->c, ls->r, rs->ident, rs->ident_len, f, n);
    return 0;
}

/* A local worker's link is readable or writable (revents of its poll item): every whole frame
 * that has arrived goes through handle_frame, queued bytes go out. A link that fails is closed;
 * the worker is then gone, and coord_supervise() or the heartbeat timeout says how. */
static void handle_link(coord *c, int r, short revents) {
    rank_st *rs = &c->ranks[r];
    mla_err err;
    link_src ls = {c, r};
    if (fdlink_pump(rs->link, (revents & ZMQ_POLLOUT) != 0, 64, link_frame, &ls, &err) == MLA_OK) return;
    MLA_INFO("worker %d: %s", r, err.msg);
    rs->link_on = 0;
    rs->link_dead = 1;
    fdlink_free(rs->link);
    rs->link = NULL;
}

void *coord_io_main(void *arg) {
    coord *c = arg;
    mla_log_set_tag("coord");
    int64_t last_hb = 0, last_iter = 0;
    for (;;) {
        /* A gap between two turns of this loop (which waits at most 10 ms) means the whole
         * process stood still (SIGSTOP, swapping, a debugger): what the workers did meanwhile was
         * not read, so their silence is not theirs. Note the stall (a failure right after it is
         * restarted, see coord_sup_main) and give every rank a fresh heartbeat window. */
        int64_t t_top = coord_now_ms();
        int64_t stall_ms = c->cfg.heartbeat_timeout_ms / 2 > 500 ? c->cfg.heartbeat_timeout_ms / 2 : 500;
        if (last_iter && t_top - last_iter > stall_ms) {
            MLA_WARN("the coordinator stood still for %lld ms (stopped or starved)", (long long)(t_top - last_iter));
            atomic_store(&c->stall_at, t_top);
            for (int r = 0; r < c->cfg.world; r++)
                if (c->ranks[r].registered) c->ranks[r].last_rx = t_top;
        }
        last_iter = t_top;
        /* the router, the API pair, the ZAP socket (CURVE), then the local workers' links */
        zmq_pollitem_t items[3 + WIRE_MAX_WORLD] = {{c->router, 0, ZMQ_POLLIN, 0}, {c->api_io, 0, ZMQ_POLLIN, 0},
                                                    {c->zap, 0, ZMQ_POLLIN, 0}};
        const int first_link = c->zap ? 3 : 2;
        int n_items = first_link, link_rank[WIRE_MAX_WORLD];
        for (int r = 0; r < c->cfg.world; r++) {
            rank_st *rs = &c->ranks[r];
            if (!rs->link_on) continue;
            link_rank[n_items - first_link] = r;
            items[n_items++] = (zmq_pollitem_t){NULL, fdlink_fd(rs->link),
                                                (short)(ZMQ_POLLIN | (fdlink_pending(rs->link) ? ZMQ_POLLOUT : 0)), 0};
        }
        int rc = zspin_poll(items, n_items, 10, c->inflight ? c->spin_us : 0);
        if (rc > 0 && c->zap && (items[2].revents & ZMQ_POLLIN)) coord_handle_zap(c);
        if (rc < 0 && zmq_errno() != EINTR) {
            coord_group_fail(c, "zmq poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        for (int i = first_link; rc > 0 && i < n_items; i++)
            if (items[i].revents) handle_link(c, link_rank[i - first_link], items[i].revents);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN))
            for (int k = 0; k < 64; k++) {
                handle_router(c);
                int ev = 0;
                size_t sz = sizeof ev;
                zmq_getsockopt(c->router, ZMQ_EVENTS, &ev, &sz);
                if (!(ev & ZMQ_POLLIN)) break;
            }
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN))
            if (handle_api(c)) break;
        int64_t t = coord_now_ms();
        if (t - last_hb >= c->cfg.heartbeat_ms) {
            broadcast_control(c, WIRE_CTL_HEARTBEAT);
            last_hb = t;
        }
        coord_supervise(c, t);
    }
    broadcast_control(c, WIRE_CTL_SHUTDOWN);
    return NULL;
}
