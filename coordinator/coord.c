#include "coord.h"
#include "worker/curve.h"
#include "worker/zspin.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "coll_host.h"
#include "common/fdlink.h"
#include "common/shard_plan.h"
#include "common/steptrace.h"
#include "mla_log.h"
#include "mla_switch.h"

extern char **environ;

enum { ST_STARTING = 0, ST_READY = 1, ST_FAILED = 2, ST_STOPPED = 3 };

typedef struct rank_st {
    int registered, loaded;
    unsigned char ident[256];
    size_t ident_len;
    pid_t pid;         /* spawned child (local mode) */
    int32_t reg_pid;   /* pid the worker reported */
    _Atomic int64_t last_rx; /* ms of its last message (read by coord_workers on other threads) */
    int exited;
    int wstatus;
    char refusal[WIRE_MAX_STR];
    /* a local worker's link (common/fdlink.h; NULL: ZeroMQ only): made at the spawn, used both
     * ways for everything after the registration reply (link_on); a link that failed
     * (link_dead: the worker is gone) takes nothing more, supervise() reports the exit */
    fdlink *link;
    int link_on, link_dead;
    /* the cache pool it took (LOADED) */
    uint32_t kv_blocks, kv_block_size;
    uint64_t kv_block_bytes;
    /* load progress (Control LOAD_PROGRESS) and the last heartbeat's stats (under mu: read by
     * coord_workers from other threads) */
    uint64_t load_done, load_total;
    int64_t load_t0, load_t; /* ms: first and last progress report */
    int has_stats;
    wire_worker_stats stats;
    char device[WIRE_MAX_STR];
} rank_st;

struct coord {
    coord_config cfg;
    char *model_path, *worker_exe, *curve_dir;
    char **worker_args;
    char endpoint[512];
    char ipc_path[256];
    char ipc_dir[128]; /* the private folder (mode 0700) holding ipc_path when we made it */
    void *zctx, *router, *api_io, *api_user;
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    char fail_msg[1024];
    uint32_t n_vocab;
    _Atomic long spin_us; /* zspin_default(the workers' backend), set at start and when a CUDA worker
                           * registers: how long the I/O thread (while a step is out) and the caller
                           * waiting for an answer poll before sleeping */
    int ever_ready;       /* under mu: the group was ready once (later STARTING = a restart) */
    coll_host_seg *seg;
    rank_st ranks[WIRE_MAX_WORLD];
    pthread_mutex_t api_mu;
    /* CURVE: the ZAP handler socket (served by the I/O thread) and the allowed client keys */
    void *zap;
    uint8_t (*allowed)[32];
    int n_allowed;
    unsigned zap_refusals;
    /* restart policy (under mu): the supervisor thread, its stop flag, counters */
    pthread_t sup_th;
    int sup_started, quit, gave_up, restarts;
    int no_restart;   /* policy STOP: the supervisor decided this failure is not restarted */
    int64_t fail_at;  /* when the group last failed (ms, now_ms) */
    _Atomic int64_t stall_at; /* when the I/O thread last found the process had stalled */
    _Atomic int consecutive_restarts; /* since the last successful step */
    /* I/O thread only: the step or bench request in flight (one at a time) */
    int inflight;
    int inflight_bench;   /* 1: a Bench request (answered by every rank), 0: a step */
    uint64_t inflight_step; /* its step id or bench id */
    int64_t inflight_since;
    int bench_answered[WIRE_MAX_WORLD], bench_n_answered;
    double bench_sec;     /* the slowest rank's seconds per operation */
    char bench_err[1024]; /* the error of the lowest failing rank so far */
    int bench_err_rank;
    int64_t start_deadline;
    /* the NCCL unique id rank 0 published (Control NCCL_ID) for this group; relayed to the
     * other ranks (I/O thread only; reset by group_launch) */
    uint8_t nccl_id[WIRE_MAX_NCCL_ID];
    int nccl_id_known;
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- I/O thread helpers -------------------------------------------------------------------- */

static void send_to_rank(coord *c, int r, const void *buf, size_t n) {
    rank_st *rs = &c->ranks[r];
    if (!rs->registered || rs->link_dead) return;
    if (rs->link_on) {
        mla_err err;
        if (fdlink_send(rs->link, buf, n, &err)) MLA_WARN("send to worker %d: %s", r, err.msg);
        return;
    }
    if (zmq_send(c->router, rs->ident, rs->ident_len, ZMQ_SNDMORE) < 0 ||
        zmq_send(c->router, buf, n, 0) < 0)
        MLA_WARN("send to worker %d: %s", r, zmq_strerror(zmq_errno()));
}

static void send_frame_to_ident(coord *c, const void *ident, size_t ilen, const wire_msg *m) {
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
        if (c->ranks[r].registered && !c->ranks[r].exited) send_to_rank(c, r, buf, n);
    free(buf);
}

static void api_reply(coord *c, char tag, const void *payload, size_t n) {
    zmq_send(c->api_io, &tag, 1, n ? ZMQ_SNDMORE : 0);
    if (n) zmq_send(c->api_io, payload, n, 0);
}

static void api_reply_err(coord *c, const char *msg) { api_reply(c, 'E', msg, strlen(msg) + 1); }

/* The group failed: remember why (first reason wins), release the ranks blocked in the
 * collective, fail the in-flight step, tell the survivors to shut down. */
static void group_fail(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void group_fail(coord *c, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    int first = c->state == ST_STARTING || c->state == ST_READY;
    if (first) {
        c->state = ST_FAILED;
        c->fail_at = now_ms();
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

static int find_rank(coord *c, const void *ident, size_t n) {
    for (int r = 0; r < c->cfg.world; r++)
        if (c->ranks[r].registered && c->ranks[r].ident_len == n && !memcmp(c->ranks[r].ident, ident, n))
            return r;
    return -1;
}

static void refuse(coord *c, const void *ident, size_t ilen, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refuse(coord *c, const void *ident, size_t ilen, int rank, const char *fmt, ...) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER_REPLY;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.reply.reason, sizeof m.u.reply.reason, fmt, ap);
    va_end(ap);
    MLA_WARN("refusing worker (rank %d): %s", rank, m.u.reply.reason);
    if (rank >= 0 && rank < c->cfg.world && !c->ranks[rank].refusal[0])
        snprintf(c->ranks[rank].refusal, sizeof c->ranks[rank].refusal, "%s", m.u.reply.reason);
    send_frame_to_ident(c, ident, ilen, &m);
}

/* Relays the NCCL unique id published by rank 0 to rank r (a Control NCCL_ID frame, rank 0). */
static void send_nccl_id(coord *c, int r) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = WIRE_CTL_NCCL_ID;
    m.u.ctl.rank = 0;
    memcpy(m.u.ctl.nccl_id, c->nccl_id, WIRE_MAX_NCCL_ID);
    m.u.ctl.nccl_id_len = WIRE_MAX_NCCL_ID;
    uint8_t *buf;
    size_t n;
    mla_err err;
    if (wire_encode(&m, &buf, &n, &err)) MLA_PANIC("%s", err.msg);
    send_to_rank(c, r, buf, n);
    free(buf);
}

static void handle_register(coord *c, const void *ident, size_t ilen, const wire_register *rg) {
    int r = (int)rg->rank;
    int st;
    pthread_mutex_lock(&c->mu);
    st = c->state;
    pthread_mutex_unlock(&c->mu);
    if (rg->protocol_version != WIRE_VERSION)
        return refuse(c, ident, ilen, r, "protocol version %u, the coordinator speaks version %u",
                      rg->protocol_version, WIRE_VERSION);
    if ((int)rg->world != c->cfg.world)
        return refuse(c, ident, ilen, r, "world size %u, the coordinator runs world size %d",
                      rg->world, c->cfg.world);
    if (rg->model_hash != c->cfg.model_hash)
        return refuse(c, ident, ilen, r,
                      "model hash %016" PRIx64 " differs from the coordinator's %016" PRIx64
                      " (a different model file?)",
                      rg->model_hash, c->cfg.model_hash);
    if (st != ST_STARTING)
        return refuse(c, ident, ilen, r, "the group is not accepting workers (%s)",
                      st == ST_READY ? "already complete" : "it failed or stopped");
    rank_st *rs = &c->ranks[r];
    if (rs->registered)
        return refuse(c, ident, ilen, r, "rank %d is already registered (pid %d)", r, (int)rs->reg_pid);
    if (!c->cfg.external && rs->pid != (pid_t)rg->pid)
        return refuse(c, ident, ilen, r, "rank %d belongs to the local worker pid %d, not pid %d", r,
                      (int)rs->pid, (int)rg->pid);
    if (ilen > sizeof rs->ident) return refuse(c, ident, ilen, r, "routing id too long");
    memcpy(rs->ident, ident, ilen);
    rs->ident_len = ilen;
    rs->registered = 1;
    rs->reg_pid = rg->pid;
    rs->last_rx = now_ms();
    c->start_deadline = rs->last_rx + c->cfg.start_timeout_ms; /* progress: the timeout starts again */
    pthread_mutex_lock(&c->mu);
    snprintf(rs->device, sizeof rs->device, "%s", rg->device);
    pthread_mutex_unlock(&c->mu);
    if (!strncmp(rg->device, "cuda", 4) && !c->cfg.backend && !c->cfg.spin_us_given)
        c->spin_us = zspin_default("cuda", -1); /* the workers chose CUDA themselves */
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER_REPLY;
    m.u.reply.ok = true;
    if (c->seg) snprintf(m.u.reply.coll_shm_name, sizeof m.u.reply.coll_shm_name, "%s", coll_host_seg_name(c->seg));
    m.u.reply.heartbeat_ms = (uint32_t)c->cfg.heartbeat_ms;
    m.u.reply.heartbeat_timeout_ms = (uint32_t)c->cfg.heartbeat_timeout_ms;
    m.u.reply.coll_timeout_ms = (uint32_t)c->cfg.coll_timeout_ms;
    m.u.reply.kv = c->cfg.kv;
    m.u.reply.kv.local_group = !c->cfg.external;
    m.u.reply.wo = (wire_worker_opts){.nccl_id_timeout_ms = (uint32_t)c->cfg.nccl_id_timeout_ms,
                                      .spin_us = c->cfg.spin_us_given ? c->cfg.spin_us : -1,
                                      .step_ahead = (uint32_t)c->cfg.step_ahead,
                                      .nccl = (uint32_t)c->cfg.nccl,
                                      .cuda_precision = (uint32_t)c->cfg.cuda_precision,
                                      .log_level = mla_log_level_given() ? 1u + (uint32_t)mla_log_level() : 0};
    send_frame_to_ident(c, ident, ilen, &m);
    rs->link_on = rs->link != NULL; /* from here on everything goes over the link */
    MLA_INFO("worker %d registered (pid %d, host %s, device %s%s)", r, (int)rg->pid, rg->host, rg->device,
             rs->link_on ? ", local link" : "");
    /* rank 0 published its NCCL id before this rank registered: it follows the reply */
    if (c->nccl_id_known && r != 0) send_nccl_id(c, r);
}

static void check_ready(coord *c) {
    for (int r = 0; r < c->cfg.world; r++)
        if (!c->ranks[r].loaded) return;
    coll_host_seg_unlink(c->seg); /* every rank has attached (LOADED comes after the attach) */
    pthread_mutex_lock(&c->mu);
    if (c->state == ST_STARTING) {
        c->state = ST_READY;
        c->ever_ready = 1;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    MLA_INFO("worker group ready: %d ranks, vocabulary %u", c->cfg.world, c->n_vocab);
    for (int r = 0; r < c->cfg.world; r++)
        MLA_INFO("cache pool of rank %d: %u blocks of %u positions (%.0f positions, %.2f GiB)", r, c->ranks[r].kv_blocks,
                 c->ranks[r].kv_block_size, (double)c->ranks[r].kv_blocks * c->ranks[r].kv_block_size,
                 (double)c->ranks[r].kv_blocks * (double)c->ranks[r].kv_block_bytes / 1073741824.0);
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
    int r = find_rank(c, ident, ilen);
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
        if (m.kind == WIRE_REGISTER) handle_register(c, ident, ilen, &m.u.reg);
        else MLA_WARN("dropping a %s frame from an unregistered peer", wire_kind_name(m.kind));
        wire_msg_free(&m);
        return;
    }
    c->ranks[r].last_rx = now_ms();
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
                group_fail(c, "worker %d failed to load the model: %s", r, m.u.ctl.message);
            } else if (c->n_vocab && c->n_vocab != m.u.ctl.n_vocab) {
                group_fail(c, "worker %d reports vocabulary %u, others %u", r, m.u.ctl.n_vocab, c->n_vocab);
            } else if (r > 0 && c->ranks[0].kv_block_size && c->ranks[0].kv_block_size != m.u.ctl.kv_block_size) {
                group_fail(c, "worker %d uses cache blocks of %u positions, worker 0 of %u", r, m.u.ctl.kv_block_size,
                           c->ranks[0].kv_block_size);
            } else {
                c->n_vocab = m.u.ctl.n_vocab;
                pthread_mutex_lock(&c->mu);
                c->ranks[r].kv_blocks = m.u.ctl.kv_blocks;
                c->ranks[r].kv_block_size = m.u.ctl.kv_block_size;
                c->ranks[r].kv_block_bytes = m.u.ctl.kv_block_bytes;
                c->ranks[r].loaded = 1;
                if (c->ranks[r].load_total) c->ranks[r].load_done = c->ranks[r].load_total;
                pthread_mutex_unlock(&c->mu);
                c->start_deadline = c->ranks[r].last_rx + c->cfg.start_timeout_ms;
                check_ready(c);
            }
        } else if (m.u.ctl.kind == WIRE_CTL_ERROR) {
            group_fail(c, "worker %d: %s", r, m.u.ctl.message);
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
                    if (c->ranks[q].registered && !c->ranks[q].exited) send_nccl_id(c, q), n++;
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
            group_fail(c, "worker 0: %s", m.u.result.error);
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
        c->inflight_since = now_ms();
        if (t == 'B') {
            memset(c->bench_answered, 0, sizeof c->bench_answered);
            c->bench_n_answered = 0;
            c->bench_sec = 0;
            c->bench_err[0] = '\0';
        }
        if (t == 'P') steptrace_mark(step_id, 'B');
        MLA_DEBUG("%s %" PRIu64 ": a frame of %zu bytes to %d ranks", t == 'P' ? "step" : "bench request", step_id, n,
                  c->cfg.world);
        for (int r = 0; r < c->cfg.world; r++) send_to_rank(c, r, frame, n);
    } else if (t == 'F') {
        for (int r = 0; r < c->cfg.world; r++) send_to_rank(c, r, zmq_msg_data(&body), zmq_msg_size(&body));
        api_reply(c, 'K', NULL, 0);
    }
out:
    zmq_msg_close(&tag);
    zmq_msg_close(&body);
    return quit;
}

static void describe_exit(char *buf, size_t n, int ws) {
    if (WIFEXITED(ws)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(ws));
    else if (WIFSIGNALED(ws)) snprintf(buf, n, "was killed by signal %d", WTERMSIG(ws));
    else snprintf(buf, n, "stopped (wait status %d)", ws);
}

static void supervise(coord *c, int64_t t) {
    /* local children: waitpid, so that a death is seen within one poll tick */
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (!rs->pid || rs->exited) continue;
        int ws;
        pid_t p = waitpid(rs->pid, &ws, WNOHANG);
        if (p == rs->pid) {
            rs->exited = 1;
            rs->wstatus = ws;
            char how[64];
            describe_exit(how, sizeof how, ws);
            if (rs->refusal[0])
                group_fail(c, "worker %d (pid %d) %s: registration refused: %s", r, (int)rs->pid, how, rs->refusal);
            else
                group_fail(c, "worker %d (pid %d) %s", r, (int)rs->pid, how);
        }
    }
    pthread_mutex_lock(&c->mu);
    int st = c->state;
    pthread_mutex_unlock(&c->mu);
    if (st != ST_STARTING && st != ST_READY) return;
    if (c->inflight && c->cfg.step_timeout_ms > 0 && t - c->inflight_since > c->cfg.step_timeout_ms) {
        group_fail(c, "%s %" PRIu64 " did not finish within %d ms (a worker hangs or is too slow; see --step-timeout-ms)",
                   c->inflight_bench ? "bench request" : "step", c->inflight_step, c->cfg.step_timeout_ms);
        return;
    }
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (rs->registered && t - rs->last_rx > c->cfg.heartbeat_timeout_ms)
            group_fail(c, "worker %d (pid %d) stopped answering: no message for %lld ms", r,
                       (int)rs->reg_pid, (long long)(t - rs->last_rx));
    }
    if (st == ST_STARTING && t > c->start_deadline) {
        char missing[512] = "";
        size_t off = 0;
        for (int r = 0; r < c->cfg.world && off < sizeof missing - 16; r++)
            if (!c->ranks[r].loaded)
                off += (size_t)snprintf(missing + off, sizeof missing - off, " %d%s", r,
                                        c->ranks[r].registered ? "(loading)" : "");
        group_fail(c, "workers made no start-up progress (registration, load progress) for %d ms "
                      "(--start-timeout-ms); missing ranks:%s%s%s",
                   c->cfg.start_timeout_ms, missing, c->ranks[0].refusal[0] ? "; last refusal: " : "",
                   c->ranks[0].refusal);
    }
}

/* One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism,
 * credentials. CURVE clients are admitted when their public key is in authorized_keys. */
static void handle_zap(coord *c) {
    char parts[7][256];
    size_t len[7];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->zap, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        more = zmq_msg_more(&m);
        if (n < 7) {
            len[n] = zmq_msg_size(&m) < sizeof parts[n] - 1 ? zmq_msg_size(&m) : sizeof parts[n] - 1;
            memcpy(parts[n], zmq_msg_data(&m), len[n]);
            parts[n][len[n]] = '\0';
        }
        n++;
        zmq_msg_close(&m);
    }
    const char *status = "400", *text = "malformed ZAP request";
    if (n >= 7 && len[5] == 5 && !memcmp(parts[5], "CURVE", 5) && len[6] == 32) {
        int ok = 0;
        for (int k = 0; k < c->n_allowed && !ok; k++) ok = !memcmp(c->allowed[k], parts[6], 32);
        if (ok) {
            status = "200";
            text = "OK";
        } else {
            text = "client key not authorized";
            char z[41] = "?";
            zmq_z85_encode(z, (const uint8_t *)parts[6], 32);
            unsigned k = c->zap_refusals++;
            if (k < 5 || k % 100 == 0)
                MLA_WARN("refusing a control-plane connection from %s: its CURVE key %s is not in authorized_keys "
                         "(%u refusals so far)", parts[3], z, k + 1);
        }
    } else if (n >= 6) {
        text = "mechanism not allowed";
        MLA_WARN("refusing a control-plane connection from %s: mechanism %s (CURVE required)", parts[3], parts[5]);
    }
    const char *rid = n >= 2 ? parts[1] : "";
    size_t rlen = n >= 2 ? len[1] : 0;
    zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(c->zap, rid, rlen, ZMQ_SNDMORE);
    zmq_send(c->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(c->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, 0);
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
 * the worker is then gone, and supervise() or the heartbeat timeout says how. */
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

static void *io_main(void *arg) {
    coord *c = arg;
    mla_log_set_tag("coord");
    int64_t last_hb = 0, last_iter = 0;
    for (;;) {
        /* A gap between two turns of this loop (which waits at most 10 ms) means the whole
         * process stood still (SIGSTOP, swapping, a debugger): what the workers did meanwhile was
         * not read, so their silence is not theirs. Note the stall (a failure right after it is
         * restarted, see sup_main) and give every rank a fresh heartbeat window. */
        int64_t t_top = now_ms();
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
        if (rc > 0 && c->zap && (items[2].revents & ZMQ_POLLIN)) handle_zap(c);
        if (rc < 0 && zmq_errno() != EINTR) {
            group_fail(c, "zmq poll: %s", zmq_strerror(zmq_errno()));
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
        int64_t t = now_ms();
        if (t - last_hb >= c->cfg.heartbeat_ms) {
            broadcast_control(c, WIRE_CTL_HEARTBEAT);
            last_hb = t;
        }
        supervise(c, t);
    }
    broadcast_control(c, WIRE_CTL_SHUTDOWN);
    return NULL;
}

/* ---- security ----------------------------------------------------------------------------- */

int coord_endpoint_is_local(const char *ep) {
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) return 1;
    if (strncmp(ep, "tcp://", 6)) return 0;
    const char *h = ep + 6;
    const char *semi = strchr(h, ';'); /* tcp://src;dst: judge the destination */
    if (semi) h = semi + 1;
    if (!strncmp(h, "127.", 4)) return 1;
    if (!strncmp(h, "localhost:", 10)) return 1;
    if (!strncmp(h, "[::1]:", 6)) return 1;
    return 0;
}

/* Loads server.key and authorized_keys from the curve folder, binds the ZAP handler and makes the
 * ROUTER a CURVE server. */
static int setup_curve(coord *c, mla_err *err) {
    if (!zmq_has("curve"))
        return mla_errf(err, "--curve-dir: this libzmq was built without CURVE support (needs libsodium)");
    char path[PATH_MAX + 32], secret[41];
    snprintf(path, sizeof path, "%s/server.key", c->curve_dir);
    if (curve_read_z85_key(path, secret, err)) return MLA_ERR;
    snprintf(path, sizeof path, "%s/authorized_keys", c->curve_dir);
    FILE *f = fopen(path, "r");
    if (!f) return mla_errf(err, "cannot read %s: %s (write it with `mlaserve keygen`)", path, strerror(errno));
    char line[512];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *p = line;
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p || (p[0] == '#' && (!p[1] || isspace((unsigned char)p[1])))) continue; /* Z85 has '#' */
        size_t k = 0;
        while (p[k] && !isspace((unsigned char)p[k])) k++;
        char z[41];
        uint8_t bin[32];
        if (k == 40) {
            memcpy(z, p, 40);
            z[40] = '\0';
        }
        if (k != 40 || !zmq_z85_decode(bin, z)) {
            fclose(f);
            return mla_errf(err, "%s:%d: not a Z85 public key", path, ln);
        }
        c->allowed = mla_xrealloc(c->allowed, (size_t)(c->n_allowed + 1) * sizeof *c->allowed);
        memcpy(c->allowed[c->n_allowed++], bin, 32);
    }
    fclose(f);
    if (c->n_allowed == 0) return mla_errf(err, "%s lists no client key: no worker could join", path);
    c->zap = zmq_socket(c->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
        return mla_errf(err, "cannot bind the ZAP handler: %s", zmq_strerror(zmq_errno()));
    int one = 1;
    if (zmq_setsockopt(c->router, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(c->router, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(c->router, ZMQ_ZAP_DOMAIN, "mlaserve", 8))
        return mla_errf(err, "CURVE setup: %s", zmq_strerror(zmq_errno()));
    memset(secret, 0, sizeof secret);
    MLA_INFO("control plane: CURVE on, %d authorized client key(s) from %s", c->n_allowed, path);
    return MLA_OK;
}

/* ---- options -------------------------------------------------------------------------------- */

static int opt_step_timeout(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > 24L * 3600 * 1000)
        return mla_errf(err, "'%s' is not a number of milliseconds in [0, 86400000]", v);
    cfg->step_timeout_ms = n == 0 ? -1 : (int)n;
    return MLA_OK;
}

static int opt_backend(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    if (strcmp(v, "cpu") && strcmp(v, "cuda")) return mla_errf(err, "'%s' is not cpu or cuda", v);
    cfg->backend = v;
    return MLA_OK;
}

/* BYTES with an optional K/M/G/T (powers of 1024) suffix; 0 on a bad value. */
static uint64_t parse_bytes(const char *v) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !(x > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0; end++; break;
    case 'M': case 'm': mul = 1048576.0; end++; break;
    case 'G': case 'g': mul = 1073741824.0; end++; break;
    case 'T': case 't': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end || x * mul >= 1.8e19) return 0;
    return (uint64_t)(x * mul);
}

static int opt_kv_memory(void *ctx, const char *v, mla_err *err) {
    coord_config *cfg = ctx;
    if (!(cfg->kv.kv_memory_bytes = parse_bytes(v)))
        return mla_errf(err, "'%s' is not a size in bytes (suffixes K, M, G, T)", v);
    return MLA_OK;
}

static const char *const failure_names[] = {"stop", "restart", "exit", NULL}; /* COORD_ON_FAILURE_* order */
static const char *const ahead_names[] = {"queue", "off", "sync", NULL};         /* WIRE_AHEAD_* order */
static const char *const nccl_names[] = {"auto", "off", "on", NULL};             /* WIRE_NCCL_* order */
static const char *const precision_names[] = {"split", "bf16", "exact", NULL};   /* WIRE_PREC_* order */

void coord_opt_specs(coord_config *cfg, opt_spec *s) {
    const double day_ms = 24.0 * 3600 * 1000;
    const opt_spec t[COORD_N_OPTS] = {
        {.name = "--backend", .kind = OPT_FN, .arg = "cpu|cuda", .def = "cuda where a GPU is visible, else cpu",
         .help = "what the workers compute on", .fn = opt_backend, .ctx = cfg},
        {.name = "--coord", .kind = OPT_STR, .arg = "ENDPOINT", .def = "a fresh ipc:// path",
         .help = "control-plane bind address (tcp://HOST:PORT for workers on other hosts)", .dest = &cfg->endpoint},
        {.name = "--workers-external", .kind = OPT_FLAG, .help = "start no workers: wait for them to register",
         .dest = &cfg->external},
        {.name = "--curve-dir", .kind = OPT_STR, .arg = "DIR", .def = "none",
         .help = "CURVE keys from `mlaserve keygen DIR` (required for a non-loopback tcp:// bind)",
         .dest = &cfg->curve_dir},
        {.name = "--insecure-control-plane", .kind = OPT_FLAG,
         .help = "allow a non-loopback tcp:// control plane without CURVE", .dest = &cfg->insecure},
        {.name = "--start-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "120000",
         .help = "fail the start when no worker registers or makes load progress for this long",
         .dest = &cfg->start_timeout_ms, .lo = 1, .hi = day_ms},
        {.name = "--heartbeat-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "5000",
         .help = "a worker silent this long has failed", .dest = &cfg->heartbeat_timeout_ms, .lo = 1, .hi = day_ms},
        {.name = "--step-timeout-ms", .kind = OPT_FN, .arg = "N", .def = "600000",
         .help = "a step in flight this long fails the group (0: no limit)", .fn = opt_step_timeout, .ctx = cfg},
        {.name = "--on-worker-failure", .kind = OPT_CHOICE, .arg = "stop|restart|exit", .def = "stop",
         .help = "after a worker fails: stay failed, restart the group, or exit 1", .dest = &cfg->on_failure,
         .choices = failure_names},
        {.name = "--max-restarts", .kind = OPT_INT, .arg = "N", .def = "5",
         .help = "restarts in a row without a successful step before giving up", .dest = &cfg->max_restarts,
         .lo = 1, .hi = 1000000},
        {.name = "--gpu-memory-utilization", .kind = OPT_FLOAT, .arg = "F", .def = "0.90",
         .help = "CUDA: the fraction of each GPU's memory a worker uses in all, weights and cache pool included",
         .dest = &cfg->kv.gpu_memory_utilization, .lo = 0.01, .hi = 1},
        {.name = "--kv-memory", .kind = OPT_FN, .arg = "BYTES", .def = "CPU 1G; CUDA: from the fraction",
         .help = "the cache pool's size (suffixes K, M, G, T); on CUDA instead of the fraction", .fn = opt_kv_memory,
         .ctx = cfg},
        {.name = "--coll-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "30000",
         .help = "a host all-reduce waiting this long for the other ranks fails", .dest = &cfg->coll_timeout_ms,
         .lo = 1, .hi = 3600000},
        {.name = "--nccl-id-timeout-ms", .kind = OPT_INT, .arg = "N", .def = "120000",
         .help = "how long the ranks wait for rank 0's NCCL id", .dest = &cfg->nccl_id_timeout_ms, .lo = 1,
         .hi = 3600000},
        {.name = "--spin-us", .kind = OPT_INT, .arg = "N", .def = "2000 with cuda, else 0",
         .help = "microseconds the step loop's threads poll before they sleep (0: no spinning)",
         .dest = &cfg->spin_us, .lo = 0, .hi = 1000000, .seen = &cfg->spin_us_given},
        {.name = "--step-ahead", .kind = OPT_CHOICE, .arg = "queue|off|sync", .def = "queue",
         .help = "greedy decode: queue the next step on the device before the result returns, run it after, or not",
         .dest = &cfg->step_ahead, .choices = ahead_names},
        {.name = "--nccl", .kind = OPT_CHOICE, .arg = "auto|off|on", .def = "auto",
         .help = "CUDA all-reduce over NCCL: where it can serve, never (host collective), or required",
         .dest = &cfg->nccl, .choices = nccl_names},
        {.name = "--cuda-precision", .kind = OPT_CHOICE, .arg = "split|bf16|exact", .def = "split",
         .help = "CUDA float weights: split bf16 pairs, plain bf16 tensor cores, or exact fp32 (reference)",
         .dest = &cfg->cuda_precision, .choices = precision_names},
    };
    memcpy(s, t, sizeof t);
}

/* ---- commands that start a worker group ---------------------------------------------------- */

void coord_group_opt_specs(coord_group_opts *o, opt_spec *s) {
    if (o->tp == 0) o->tp = 1;
    if (o->threads == 0) o->threads = 1;
    const opt_spec t[COORD_GROUP_N_OPTS] = {
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH",
         .help = "the GGUF file (of a split model: its first part, *-00001-of-*.gguf)", .dest = &o->model},
        {.name = "--tp", .kind = OPT_INT, .arg = "N", .def = "1",
         .help = "tensor-parallel degree: worker processes, one per GPU", .dest = &o->tp, .lo = 1, .hi = WIRE_MAX_WORLD},
        {.name = "--threads", .kind = OPT_INT, .arg = "N", .def = "1", .help = "CPU threads per worker",
         .dest = &o->threads, .lo = 1, .hi = 1024},
        {.name = "--worker-exe", .kind = OPT_STR, .arg = "PATH", .def = "mlaserve-worker beside mlaserve",
         .help = "the worker program", .dest = &o->worker_exe},
    };
    memcpy(s, t, sizeof t);
}

int coord_group_start(const coord_group_opts *o, const gguf_ctx *g, coord **c, mla_err *err) {
    *c = NULL;
    if (coord_check_model(g, o->tp, NULL, err)) return mla_err_prefix(err, "%s", o->model);
    coord_config cfg = o->cc;
    cfg.world = o->tp;
    cfg.model_path = o->model;
    cfg.model_hash = gguf_index_hash(g);
    cfg.worker_exe = o->worker_exe;
    cfg.n_threads = o->threads;
    if (coord_start(c, &cfg, err)) return mla_err_prefix(err, "starting %d workers", o->tp);
    return MLA_OK;
}

/* ---- public API ------------------------------------------------------------------------------- */

static char *default_worker_exe(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            const char *cands[] = {"/mlaserve-worker", "/../worker/mlaserve-worker"};
            for (size_t i = 0; i < 2; i++) {
                char p[PATH_MAX + 64];
                snprintf(p, sizeof p, "%s%s", self, cands[i]);
                if (access(p, X_OK) == 0) return mla_xstrdup(p);
            }
        }
    }
    return mla_xstrdup("mlaserve-worker");
}

/* the descriptor a local worker finds its link on (--link-fd) */
#define LINK_FD 3

static int spawn_worker(coord *c, int r, mla_err *err) {
    char rank_s[16], world_s[16], thr_s[16];
    snprintf(rank_s, sizeof rank_s, "%d", r);
    snprintf(world_s, sizeof world_s, "%d", c->cfg.world);
    snprintf(thr_s, sizeof thr_s, "%d", c->cfg.n_threads > 0 ? c->cfg.n_threads : 1);
    size_t nextra = 0;
    while (c->worker_args && c->worker_args[nextra]) nextra++;
    char **argv = mla_xcalloc(24 + nextra, sizeof *argv);
    size_t k = 0;
    argv[k++] = c->worker_exe;
    argv[k++] = "--coord";
    argv[k++] = c->endpoint;
    argv[k++] = "--rank";
    argv[k++] = rank_s;
    argv[k++] = "--world";
    argv[k++] = world_s;
    argv[k++] = "-m";
    argv[k++] = c->model_path;
    argv[k++] = "--threads";
    argv[k++] = thr_s;
    if (c->cfg.curve_dir) {
        argv[k++] = "--curve-dir";
        argv[k++] = (char *)c->cfg.curve_dir;
    }
    if (c->cfg.backend) {
        argv[k++] = "--backend";
        argv[k++] = (char *)c->cfg.backend;
    }
    if (mla_log_level_given()) { /* from the start; workers on other hosts get it at registration */
        argv[k++] = "--log-level";
        argv[k++] = (char *)mla_log_level_name(mla_log_level());
    }
    for (size_t i = 0; i < nextra; i++) argv[k++] = c->worker_args[i];
    /* the link (common/fdlink.h): one end stays here, the other is the child's descriptor
     * LINK_FD; MLA_LOCAL_LINK=0 (a developer switch) leaves every frame on ZeroMQ */
    int sv[2] = {-1, -1};
    char link_s[16];
    if (mla_sw_bool(MLA_SW_LOCAL_LINK)) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            MLA_WARN("worker %d: no local link (socketpair: %s); ZeroMQ only", r, strerror(errno));
            sv[0] = sv[1] = -1;
        } else if (sv[1] == LINK_FD) { /* dup2 onto itself would keep close-on-exec */
            int d = fcntl(sv[1], F_DUPFD_CLOEXEC, LINK_FD + 1);
            close(sv[1]);
            sv[1] = d;
            if (d < 0) { /* no link then: both ends or neither */
                close(sv[0]);
                sv[0] = -1;
            }
        }
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (sv[1] >= 0) {
        posix_spawn_file_actions_adddup2(&fa, sv[1], LINK_FD);
        snprintf(link_s, sizeof link_s, "%d", LINK_FD);
        argv[k++] = "--link-fd";
        argv[k++] = link_s;
    }
    argv[k] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, c->worker_exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    if (sv[1] >= 0) close(sv[1]);
    if (rc != 0) {
        if (sv[0] >= 0) close(sv[0]);
        return mla_errf(err, "cannot start worker %d (%s): %s", r, c->worker_exe, strerror(rc));
    }
    c->ranks[r].pid = pid;
    if (sv[0] >= 0) {
        mla_err e2;
        c->ranks[r].link = fdlink_new(sv[0], WIRE_MAX_FRAME, &e2);
        if (!c->ranks[r].link) {
            MLA_WARN("worker %d: %s", r, e2.msg);
            close(sv[0]);
        }
    }
    MLA_INFO("started worker %d: pid %d", r, (int)pid);
    return MLA_OK;
}

/* Creates the collective segment, starts (or awaits) the workers and the I/O thread, and waits
 * until the group is ready or failed. The sockets exist already. */
static int group_launch(coord *c, mla_err *err) {
    pthread_mutex_lock(&c->mu);
    int quit = c->quit;
    pthread_mutex_unlock(&c->mu);
    if (quit) return mla_errf(err, "the coordinator is stopping");
    pthread_mutex_lock(&c->mu);
    memset(c->ranks, 0, sizeof c->ranks);
    pthread_mutex_unlock(&c->mu);
    c->state = ST_STARTING;
    c->no_restart = 0;
    c->fail_msg[0] = '\0';
    c->n_vocab = 0;
    c->inflight = 0;
    c->nccl_id_known = 0;
    memset(c->nccl_id, 0, sizeof c->nccl_id);
    if (c->cfg.world > 1) {
        char name[COLL_HOST_NAME_MAX];
        coll_host_make_name(name, sizeof name);
        if (coll_host_seg_create(&c->seg, name, c->cfg.world, c->cfg.coll_chunk_bytes, err)) return MLA_ERR;
    }
    if (!c->cfg.external) {
        for (int r = 0; r < c->cfg.world; r++)
            if (spawn_worker(c, r, err)) return MLA_ERR;
    } else {
        MLA_INFO("waiting for %d external workers on %s", c->cfg.world, c->endpoint);
    }
    c->start_deadline = now_ms() + c->cfg.start_timeout_ms;
    if (pthread_create(&c->th, NULL, io_main, c) != 0) MLA_PANIC("pthread_create failed");
    c->th_started = 1;
    if (c->cfg.no_wait && !c->ever_ready) return MLA_OK; /* the first start: coord_phase tells */
    pthread_mutex_lock(&c->mu);
    while (c->state == ST_STARTING && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
    int st = c->state;
    if (st != ST_READY) mla_errf(err, "%s", st == ST_STARTING ? "the coordinator is stopping" : c->fail_msg);
    pthread_mutex_unlock(&c->mu);
    return st == ST_READY ? MLA_OK : MLA_ERR;
}

/* Stops the I/O thread (which tells the workers to shut down), reaps the local workers (SIGKILL
 * after a grace period) and removes the segment. The caller holds api_mu or is the only user. */
static void group_teardown(coord *c) {
    if (c->th_started) {
        zmq_send(c->api_user, "Q", 1, 0);
        pthread_join(c->th, NULL);
        c->th_started = 0;
    }
    pthread_mutex_lock(&c->mu);
    if (c->state != ST_FAILED) c->state = ST_STOPPED;
    pthread_mutex_unlock(&c->mu);
    int64_t deadline = now_ms() + 3000;
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (!rs->pid || rs->exited) continue;
        int ws;
        for (;;) {
            pid_t p = waitpid(rs->pid, &ws, WNOHANG);
            if (p == rs->pid || (p < 0 && errno == ECHILD)) break;
            if (now_ms() > deadline) {
                MLA_WARN("worker %d (pid %d) did not exit; killing it", r, (int)rs->pid);
                kill(rs->pid, SIGKILL);
                waitpid(rs->pid, &ws, 0);
                break;
            }
            usleep(5000);
        }
        rs->exited = 1;
    }
    for (int r = 0; r < c->cfg.world; r++) {
        fdlink_free(c->ranks[r].link);
        c->ranks[r].link = NULL;
        c->ranks[r].link_on = 0;
    }
    coll_host_seg_free(c->seg);
    c->seg = NULL;
}

/* ---- restart policy ---------------------------------------------------------------------- */

/* Whether the failure came right after the coordinator itself stood still (the workers then
 * exit on the missed heartbeat through no fault of theirs). Under mu. */
static int failed_after_stall(coord *c) {
    int64_t st = atomic_load(&c->stall_at);
    int64_t win = 2 * (int64_t)c->cfg.heartbeat_timeout_ms + 2000;
    return st > 0 && c->fail_at - st < win && st - c->fail_at < win;
}

/* The supervisor thread (policies RESTART and STOP): waits for a failure, backs off, restarts
 * the group; under STOP only a failure that followed a stall of the coordinator itself is
 * restarted. Gives up after max_restarts restarts without a successful step in between. */
static void *sup_main(void *arg) {
    coord *c = arg;
    mla_log_set_tag("coord");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->quit && (c->state != ST_FAILED || c->gave_up || c->no_restart)) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        int n = atomic_load(&c->consecutive_restarts);
        /* back off 250 ms, 500 ms, ... up to 5 s; coord_stop interrupts */
        int64_t wait_ms = 250LL << (n < 5 ? n : 5);
        if (wait_ms > 5000) wait_ms = 5000;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(wait_ms / 1000);
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!c->quit && pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0) {
        }
        if (c->quit) break;
        if (c->cfg.on_failure != COORD_ON_FAILURE_RESTART && !failed_after_stall(c)) {
            c->no_restart = 1; /* STOP: a worker's own failure stays (coord_failed_for_good) */
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        if (n >= c->cfg.max_restarts) {
            c->gave_up = 1;
            MLA_ERROR("worker group: %d restarts in a row without a successful step; giving up (%s)", n,
                      c->fail_msg);
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        c->restarts++;
        atomic_fetch_add(&c->consecutive_restarts, 1);
        char why[1024];
        snprintf(why, sizeof why, "%s", c->fail_msg);
        int k = c->restarts;
        int stalled = c->cfg.on_failure != COORD_ON_FAILURE_RESTART;
        pthread_mutex_unlock(&c->mu);
        MLA_WARN("restarting the worker group (restart %d%s; it failed: %s)", k,
                 stalled ? ", after the coordinator stood still" : "", why);
        mla_err err = {{0}};
        if (coord_restart(c, &err)) MLA_ERROR("worker group restart %d failed: %s", k, err.msg);
        else MLA_INFO("worker group restarted (restart %d)", k);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int coord_policy(const coord *c) { return c->cfg.on_failure; }

int coord_phase(coord *c) {
    pthread_mutex_lock(&c->mu);
    int p = c->state == ST_READY ? COORD_PHASE_READY
            : c->state == ST_STARTING ? (c->ever_ready ? COORD_PHASE_RESTARTING : COORD_PHASE_LOADING)
            : c->state == ST_FAILED && !c->ever_ready ? COORD_PHASE_START_FAILED
                                                      : COORD_PHASE_FAILED;
    pthread_mutex_unlock(&c->mu);
    return p;
}

int coord_workers(coord *c, coord_worker_info *info, int cap) {
    const int64_t t = now_ms();
    pthread_mutex_lock(&c->mu);
    int n = c->cfg.world < cap ? c->cfg.world : cap;
    for (int r = 0; r < n; r++) {
        const rank_st *rs = &c->ranks[r];
        coord_worker_info *w = &info[r];
        memset(w, 0, sizeof *w);
        w->registered = rs->registered;
        w->loaded = rs->loaded;
        snprintf(w->device, sizeof w->device, "%s", rs->device);
        w->load_done = rs->load_done;
        w->load_total = rs->load_total;
        w->load_seconds = rs->load_t0 ? (double)(rs->load_t - rs->load_t0) / 1000.0 : 0;
        int64_t rx = rs->last_rx;
        w->heartbeat_age = rs->registered && rx ? (double)(t - rx) / 1000.0 : -1;
        w->has_stats = rs->has_stats;
        w->stats = rs->stats;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

int coord_restarts(coord *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->restarts;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int coord_gave_up(coord *c) {
    pthread_mutex_lock(&c->mu);
    int r = c->gave_up;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int coord_failed_for_good(coord *c) {
    pthread_mutex_lock(&c->mu);
    int r = c->state == ST_FAILED && (c->cfg.on_failure == COORD_ON_FAILURE_EXIT || c->gave_up || c->no_restart);
    pthread_mutex_unlock(&c->mu);
    return r;
}

int coord_restart(coord *c, mla_err *err) {
    pthread_mutex_lock(&c->api_mu);
    group_teardown(c);
    MLA_INFO("restarting the worker group");
    int rc = group_launch(c, err);
    pthread_mutex_unlock(&c->api_mu);
    return rc;
}

int coord_check_model(const gguf_ctx *g, int world, mla_config *cfg_out, mla_err *err) {
    mla_config cfg;
    if (mla_config_from_gguf(&cfg, g, err) || mla_config_check_tensors(&cfg, g, err)) return MLA_ERR;
    shard_plan plan;
    if (shard_plan_for_model(&plan, g, &cfg, 0, world, err)) return MLA_ERR;
    shard_plan_free(&plan);
    if (cfg_out) *cfg_out = cfg;
    return MLA_OK;
}

int coord_start(coord **out, const coord_config *cfg_in, mla_err *err) {
    *out = NULL;
    if (cfg_in->world < 1 || cfg_in->world > WIRE_MAX_WORLD)
        return mla_errf(err, "world size %d outside [1, %d]", cfg_in->world, WIRE_MAX_WORLD);
    if (!cfg_in->model_path) return mla_errf(err, "no model path");
    const wire_kv_opts *kv = &cfg_in->kv;
    if (kv->gpu_memory_utilization < 0 || kv->gpu_memory_utilization > 1 || kv->max_step_tokens > WIRE_MAX_STEP_TOKENS ||
        kv->max_context > WIRE_MAX_CTX || kv->max_seqs > WIRE_MAX_SEQS)
        return mla_errf(err, "cache pool settings out of range: --gpu-memory-utilization %g (0, 1], steps of %u tokens "
                             "(at most %u), context %u (at most %u), %u sequences (at most %u)",
                        kv->gpu_memory_utilization, kv->max_step_tokens, WIRE_MAX_STEP_TOKENS, kv->max_context,
                        WIRE_MAX_CTX, kv->max_seqs, WIRE_MAX_SEQS);
    if (cfg_in->step_ahead < 0 || cfg_in->step_ahead > WIRE_AHEAD_SYNC || cfg_in->nccl < 0 ||
        cfg_in->nccl > WIRE_NCCL_REQUIRED || cfg_in->cuda_precision < 0 || cfg_in->cuda_precision > WIRE_PREC_EXACT ||
        cfg_in->nccl_id_timeout_ms < 0 || cfg_in->nccl_id_timeout_ms > 3600000 ||
        (cfg_in->spin_us_given && (cfg_in->spin_us < 0 || cfg_in->spin_us > 1000000)))
        return mla_errf(err, "worker settings out of range: --step-ahead %d, --nccl %d, --cuda-precision %d, "
                             "--nccl-id-timeout-ms %d, --spin-us %d",
                        cfg_in->step_ahead, cfg_in->nccl, cfg_in->cuda_precision, cfg_in->nccl_id_timeout_ms,
                        cfg_in->spin_us);
    coord *c = mla_xcalloc(1, sizeof *c);
    c->cfg = *cfg_in;
    c->spin_us = zspin_default(c->cfg.backend, c->cfg.spin_us_given ? c->cfg.spin_us : -1);
    if (c->cfg.heartbeat_ms <= 0) c->cfg.heartbeat_ms = 100;
    if (c->cfg.heartbeat_timeout_ms <= 0) c->cfg.heartbeat_timeout_ms = 5000;
    if (c->cfg.heartbeat_timeout_ms <= c->cfg.heartbeat_ms) c->cfg.heartbeat_timeout_ms = 2 * c->cfg.heartbeat_ms;
    if (c->cfg.coll_timeout_ms <= 0) c->cfg.coll_timeout_ms = COLL_HOST_DEFAULT_TIMEOUT_MS;
    if (c->cfg.start_timeout_ms <= 0) c->cfg.start_timeout_ms = 120000;
    if (c->cfg.step_timeout_ms == 0) c->cfg.step_timeout_ms = 600000;
    if (c->cfg.max_restarts <= 0) c->cfg.max_restarts = 5;
    if (!(c->cfg.kv.gpu_memory_utilization > 0)) c->cfg.kv.gpu_memory_utilization = 0.90f;
    if (c->cfg.kv.max_step_tokens == 0) c->cfg.kv.max_step_tokens = 512;
    if (c->cfg.kv.max_seqs == 0) c->cfg.kv.max_seqs = 32;
    c->curve_dir = cfg_in->curve_dir ? mla_xstrdup(cfg_in->curve_dir) : NULL;
    c->cfg.curve_dir = c->curve_dir;
    c->model_path = mla_xstrdup(cfg_in->model_path);
    c->worker_exe = cfg_in->worker_exe ? mla_xstrdup(cfg_in->worker_exe) : default_worker_exe();
    size_t nextra = 0;
    while (cfg_in->worker_args && cfg_in->worker_args[nextra]) nextra++;
    c->worker_args = mla_xcalloc(nextra + 1, sizeof *c->worker_args);
    for (size_t i = 0; i < nextra; i++) c->worker_args[i] = mla_xstrdup(cfg_in->worker_args[i]);
    c->cfg.model_path = c->model_path;
    c->cfg.worker_exe = c->worker_exe;
    c->cfg.worker_args = (const char *const *)c->worker_args;
    c->cfg.endpoint = NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->api_mu, NULL);
    c->state = ST_STARTING;

    c->zctx = zmq_ctx_new();
    c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
    int one = 1, linger = 200;
    zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    int64_t maxmsg = (int64_t)WIRE_MAX_FRAME; /* larger messages are dropped by ZeroMQ itself */
    zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (c->curve_dir) {
        if (setup_curve(c, err)) {
            coord_stop(c);
            return MLA_ERR;
        }
    } else if (cfg_in->endpoint && !coord_endpoint_is_local(cfg_in->endpoint)) {
        if (!cfg_in->insecure) {
            mla_errf(err,
                     "refusing to bind the control plane on %s without CURVE keys: anyone who can reach it could "
                     "join as a worker and read the traffic. Give --curve-dir DIR (keys from `mlaserve keygen DIR`), "
                     "bind a loopback or ipc:// endpoint, or pass --insecure-control-plane on a trusted network",
                     cfg_in->endpoint);
            coord_stop(c);
            return MLA_ERR;
        }
        MLA_WARN("control plane on %s WITHOUT authentication or encryption (--insecure-control-plane)",
                 cfg_in->endpoint);
    }
    if (cfg_in->endpoint) {
        snprintf(c->endpoint, sizeof c->endpoint, "%s", cfg_in->endpoint);
    } else {
        /* a fresh folder only this user can enter (mkdtemp: mode 0700, unpredictable name), the
         * socket inside it; $TMPDIR when its path leaves room for the socket name */
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !tmp[0] || strlen(tmp) > 60) tmp = "/tmp";
        snprintf(c->ipc_dir, sizeof c->ipc_dir, "%s/mla-coord-XXXXXX", tmp);
        if (!mkdtemp(c->ipc_dir)) {
            mla_errf(err, "cannot create a private folder for the control socket (%s): %s", c->ipc_dir,
                     strerror(errno));
            c->ipc_dir[0] = '\0';
            coord_stop(c);
            return MLA_ERR;
        }
        snprintf(c->ipc_path, sizeof c->ipc_path, "%s/ctrl.sock", c->ipc_dir);
        snprintf(c->endpoint, sizeof c->endpoint, "ipc://%s", c->ipc_path);
    }
    if (zmq_bind(c->router, c->endpoint) != 0) {
        mla_errf(err, "cannot bind %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        c->ipc_path[0] = '\0';
        coord_stop(c);
        return MLA_ERR;
    }
    if (c->ipc_dir[0] && chmod(c->ipc_path, 0600) != 0)
        MLA_WARN("control socket %s: chmod 0600: %s", c->ipc_path, strerror(errno));
    size_t elen = sizeof c->endpoint;
    zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, c->endpoint, &elen);
    if (!strncmp(c->endpoint, "ipc://", 6) && !c->ipc_path[0])
        snprintf(c->ipc_path, sizeof c->ipc_path, "%s", c->endpoint + 6);

    c->api_io = zmq_socket(c->zctx, ZMQ_PAIR);
    c->api_user = zmq_socket(c->zctx, ZMQ_PAIR);
    char api_ep[64];
    snprintf(api_ep, sizeof api_ep, "inproc://coord-api-%p", (void *)c);
    if (zmq_bind(c->api_io, api_ep) || zmq_connect(c->api_user, api_ep))
        MLA_PANIC("inproc: %s", zmq_strerror(zmq_errno()));

    if (group_launch(c, err)) {
        coord_stop(c);
        return MLA_ERR;
    }
    if (c->cfg.on_failure != COORD_ON_FAILURE_EXIT) {
        if (pthread_create(&c->sup_th, NULL, sup_main, c) != 0) MLA_PANIC("pthread_create failed");
        c->sup_started = 1;
    }
    *out = c;
    return MLA_OK;
}

const char *coord_endpoint(const coord *c) { return c->endpoint; }
uint32_t coord_n_vocab(const coord *c) { return c->n_vocab; }

void coord_kv_pool(const coord *c, coord_kv_info *out) {
    memset(out, 0, sizeof *out);
    out->block_size = c->ranks[0].kv_block_size;
    out->block_bytes = c->ranks[0].kv_block_bytes;
    for (int r = 0; r < c->cfg.world; r++) {
        out->rank_blocks[r] = c->ranks[r].kv_blocks;
        if (r == 0 || c->ranks[r].kv_blocks < out->n_blocks) out->n_blocks = c->ranks[r].kv_blocks;
    }
}
int coord_world(const coord *c) { return c->cfg.world; }
pid_t coord_worker_pid(const coord *c, int rank) {
    return rank >= 0 && rank < c->cfg.world ? c->ranks[rank].pid : 0;
}

int coord_healthy(coord *c, mla_err *err) {
    pthread_mutex_lock(&c->mu);
    int ok = c->state == ST_READY;
    if (!ok)
        mla_errf(err, "%s%s",
                 c->state == ST_FAILED ? c->fail_msg
                 : c->state == ST_STARTING ? (c->ever_ready ? "the worker group is restarting"
                                                            : "the workers are loading the model (see /health)")
                                           : "the worker group is stopped",
                 c->state == ST_FAILED && !c->gave_up && !c->no_restart &&
                         (c->cfg.on_failure == COORD_ON_FAILURE_RESTART ||
                          (c->cfg.on_failure == COORD_ON_FAILURE_STOP && failed_after_stall(c)))
                     ? " (restarting)" : "");
    pthread_mutex_unlock(&c->mu);
    return ok;
}

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

void coord_stop(coord *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->sup_started) {
        pthread_join(c->sup_th, NULL);
        c->sup_started = 0;
    }
    pthread_mutex_lock(&c->api_mu);
    group_teardown(c);
    pthread_mutex_unlock(&c->api_mu);
    if (c->api_io) zmq_close(c->api_io);
    if (c->api_user) zmq_close(c->api_user);
    if (c->router) zmq_close(c->router);
    if (c->zap) zmq_close(c->zap);
    if (c->zctx) zmq_ctx_term(c->zctx);
    if (c->ipc_path[0]) unlink(c->ipc_path);
    if (c->ipc_dir[0]) rmdir(c->ipc_dir);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->api_mu);
    for (size_t i = 0; c->worker_args && c->worker_args[i]; i++) free(c->worker_args[i]);
    free(c->worker_args);
    free(c->model_path);
    free(c->worker_exe);
    free(c->curve_dir);
    free(c->allowed);
    free(c);
}
