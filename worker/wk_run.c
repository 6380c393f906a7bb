/* wk_run (worker/wk_run.h): the worker process: its options, the I/O thread's traffic with the
 * coordinator (plans and bench requests down to the compute thread, results and heartbeats up),
 * and wk_run / wk_main. Registration is in wk_link.c, the compute thread in wk_step.c, the NCCL
 * bootstrap in wk_boot.c; wk_internal.h holds the state the two threads share. */
#include "wk_internal.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buildinfo.h"
#include "common/fdlink.h"
#include "common/loadprog.h"
#include "common/opts.h"
#include "common/steptrace.h"
#include "mla_log.h"
#include "mla_switch.h"
#include "zspin.h"

static atomic_int g_registered; /* the registration succeeded: wk_signals waits for the coordinator */

int64_t wk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- argument parsing ------------------------------------------------------------------- */

static const char wk_usage[] =
    "usage: mlaserve-worker --coord ENDPOINT --rank R --world T -m MODEL.gguf [options]\n"
    "One tensor-parallel rank: registers with the coordinator, loads its shard, runs the steps.\n"
    "`mlaserve serve|generate|bench` start their workers themselves; start one by hand for\n"
    "--workers-external (workers on other hosts). `mlaserve-worker --version` prints this build.\n";

/* the option table over cfg (strings point into argv) */
static size_t wk_specs(wk_config *cfg, int *proto, opt_spec *s) {
    const opt_spec t[] = {
        {.name = "--coord", .kind = OPT_STR, .arg = "ENDPOINT", .help = "the coordinator (tcp://HOST:PORT or ipc://PATH)",
         .dest = &cfg->coord_endpoint},
        {.name = "--rank", .kind = OPT_INT, .arg = "R", .help = "this worker's rank, 0..T-1", .dest = &cfg->rank, .lo = 0,
         .hi = WIRE_MAX_WORLD - 1},
        {.name = "--world", .kind = OPT_INT, .arg = "T", .help = "tensor-parallel degree (the coordinator's --tp)",
         .dest = &cfg->world, .lo = 1, .hi = WIRE_MAX_WORLD},
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH",
         .help = "the GGUF file (a split model: its first part), the coordinator's", .dest = &cfg->model_path},
        {.name = "--backend", .kind = OPT_STR, .arg = "cpu|cuda", .def = "cuda where a GPU is visible, else cpu",
         .help = "what this worker computes on", .dest = &cfg->backend},
        {.name = "--threads", .kind = OPT_INT, .arg = "N", .def = "1", .help = "CPU threads", .dest = &cfg->n_threads,
         .lo = 1, .hi = 1024},
        {.name = "--device", .kind = OPT_STR, .arg = "NAME", .def = "the backend's device",
         .help = "device name reported at registration", .dest = &cfg->device},
        {.name = "--curve-dir", .kind = OPT_STR, .arg = "DIR", .def = "none",
         .help = "CURVE keys (server.pub, client.key) from `mlaserve keygen`", .dest = &cfg->curve_dir},
        {.name = "--curve-client-key", .kind = OPT_STR, .arg = "FILE", .def = "DIR/client.key",
         .help = "another client key file", .dest = &cfg->curve_client_key},
        {.name = "--link-fd", .kind = OPT_INT, .arg = "FD", .def = "none",
         .help = "the local link the coordinator made (set by the coordinator)", .dest = &cfg->link_fd, .lo = 1,
         .hi = 1 << 20},
        {.name = "--protocol-version", .kind = OPT_INT, .arg = "V", .def = "this build's",
         .help = "protocol version to claim (tests of refusals)", .dest = proto, .lo = 1, .hi = 1 << 30},
        MLA_LOG_LEVEL_OPT_HELP("info", " (not given: the coordinator's, from registration on)"),
    };
    memcpy(s, t, sizeof t);
    return sizeof t / sizeof *t;
}

int wk_parse_args(int argc, char **argv, wk_config *cfg, mla_err *err) {
    const engine_ops *eng = cfg->engine;
    memset(cfg, 0, sizeof *cfg);
    cfg->engine = eng;
    cfg->rank = -1;
    cfg->world = -1;
    cfg->n_threads = 1;
    int proto = 0;
    opt_spec specs[16];
    const opt_table tab = {"options", specs, wk_specs(cfg, &proto, specs)};
    int help = 0;
    if (opts_parse(&tab, 1, argc, argv, 1, 0, NULL, 0, NULL, NULL, &help, err)) return MLA_ERR;
    if (help) return WK_HELP;
    cfg->protocol_version = (uint32_t)proto;
    if (!cfg->coord_endpoint || cfg->rank < 0 || cfg->world < 1 || !cfg->model_path)
        return mla_errf(err, "need --coord ENDPOINT --rank R --world T -m MODEL");
    if (cfg->rank >= cfg->world) return mla_errf(err, "--rank %d is not below --world %d", cfg->rank, cfg->world);
    if (cfg->curve_client_key && !cfg->curve_dir)
        return mla_errf(err, "--curve-client-key needs --curve-dir (for server.pub)");
    return MLA_OK;
}

/* ---- the I/O thread's traffic with the coordinator ------------------------------------------- */

typedef struct io_st {
    wk *w;
    void *dealer, *pair;
    fdlink *link;       /* the local link (--link-fd), NULL: the DEALER carries everything */
    int64_t last_rx;    /* when the coordinator was last heard from */
    uint64_t last_plan; /* the last step plan forwarded: what a result from the pair answers (steptrace) */
    int stop;           /* SHUTDOWN received */
} io_st;

/* one encoded frame to the coordinator: over the link when there is one, else the DEALER */
static void up_frame(io_st *io, const void *buf, size_t n) {
    mla_err e;
    if (io->link) {
        if (fdlink_send(io->link, buf, n, &e)) MLA_WARN("send to the coordinator: %s", e.msg);
    } else if (zmq_send(io->dealer, buf, n, 0) < 0) {
        MLA_WARN("send to the coordinator: %s", zmq_strerror(zmq_errno()));
    }
}

static void send_up(io_st *io, const wire_msg *m) {
    uint8_t *buf;
    size_t n;
    mla_err e;
    if (wire_encode(m, &buf, &n, &e)) {
        MLA_WARN("%s", e.msg);
        return;
    }
    up_frame(io, buf, n);
    free(buf);
}

/* Load progress (common/loadprog.h) while the compute thread loads: a LOAD_PROGRESS frame to the
 * coordinator once a second when it moved, a log line every 10 s and one at the end. */
typedef struct load_report {
    int64_t sent_at, logged_at;
    uint64_t sent_done;
} load_report;

static void report_load(io_st *io, int rank, int64_t t, load_report *lr) {
    loadprog_state st;
    loadprog_get(&st);
    if (!st.total) return; /* the load has not begun (self-check, collective setup) */
    if (t - lr->sent_at >= 1000 && (st.done != lr->sent_done || !lr->sent_at)) {
        wire_msg m = wk_control_msg(WIRE_CTL_LOAD_PROGRESS, rank, 0, 0, 0, NULL);
        m.u.ctl.load_done = st.done;
        m.u.ctl.load_total = st.total;
        send_up(io, &m);
        lr->sent_at = t;
        lr->sent_done = st.done;
    }
    if (!lr->logged_at) lr->logged_at = t;
    if (t - lr->logged_at >= 10000) {
        char d[160];
        loadprog_describe(&st, d, sizeof d);
        MLA_INFO("loading: %s", d);
        lr->logged_at = t;
    }
}

/* One frame from the coordinator (DEALER or link): plans, bench requests and FREE_SEQ go to the
 * compute thread in order; the NCCL id is handed to a load waiting for it; SHUTDOWN sets stop. */
static void handle_down(io_st *io, const void *data, size_t len) {
    wk *w = io->w;
    const wk_config *cfg = w->cfg;
    io->last_rx = wk_now_ms();
    wire_limits lim = {.n_vocab = atomic_load(&w->n_vocab), .world = (uint32_t)cfg->world,
                       .max_blocks = atomic_load(&w->kv_blocks)};
    wire_msg *m = mla_xcalloc(1, sizeof *m);
    mla_err e2;
    if (wire_decode(data, len, &lim, m, &e2)) {
        MLA_WARN("dropping a malformed frame from the coordinator: %s", e2.msg);
        free(m);
        return;
    }
    int forward = 0;
    if (m->kind == WIRE_STEP_PLAN) {
        io->last_plan = m->u.plan.step_id;
        steptrace_mark(io->last_plan, 'C');
    }
    if (m->kind == WIRE_STEP_PLAN || m->kind == WIRE_BENCH) forward = 1;
    else if (m->kind == WIRE_CONTROL) {
        if (m->u.ctl.kind == WIRE_CTL_SHUTDOWN) {
            MLA_INFO("shutdown requested by the coordinator");
            io->stop = 1;
        } else if (m->u.ctl.kind == WIRE_CTL_FREE_SEQ) {
            forward = 1;
        } else if (m->u.ctl.kind == WIRE_CTL_NCCL_ID) {
            /* wire_decode checked: exactly WIRE_MAX_NCCL_ID bytes, from rank 0 */
            pthread_mutex_lock(&w->id_mu);
            if (cfg->rank != 0 && !w->id_known) {
                memcpy(w->nccl_id, m->u.ctl.nccl_id, WIRE_MAX_NCCL_ID);
                w->id_known = 1;
                pthread_cond_broadcast(&w->id_cv);
            } else {
                MLA_WARN("dropping an unexpected NCCL id from the coordinator");
            }
            pthread_mutex_unlock(&w->id_mu);
        }
    }
    if (forward && zmq_send(io->pair, &m, sizeof m, 0) == (int)sizeof m) return;
    if (forward) MLA_WARN("inproc send: %s", zmq_strerror(zmq_errno()));
    wire_msg_free(m);
    free(m);
}

/* fdlink_pump's callback: one frame from the link; stop after SHUTDOWN */
static int link_down(void *ctx, const uint8_t *f, size_t n) {
    io_st *io = ctx;
    handle_down(io, f, n);
    return io->stop;
}

/* The reason a worker fails with, as a CONTROL_ERROR frame on its link l to the coordinator that
 * started it (the frame is small: the socket takes it at once) */
static void link_error(fdlink *l, const wk_config *cfg, const mla_err *why) {
    mla_err e;
    wire_msg m = wk_control_msg(WIRE_CTL_ERROR, cfg->rank, 1, 0, 0, why->msg);
    for (char *p = m.u.ctl.message; *p; p++) /* wire_decode refuses control characters */
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    uint8_t *buf;
    size_t n;
    if (wire_encode(&m, &buf, &n, &e) == MLA_OK) {
        if (fdlink_send(l, buf, n, &e) == MLA_OK)
            for (int k = 0; k < 100 && fdlink_pending(l); k++) {
                if (fdlink_flush(l, &e)) break;
                if (fdlink_pending(l)) usleep(1000);
            }
        free(buf);
    }
}

/* A worker the coordinator started on its host that fails before its registration (the model
 * file cannot be read, the registration refused, no connection) leaves the reason on its link,
 * which the coordinator reads when it sees the exit (coord_supervise): otherwise /health could
 * only say "exited with status 1". After the registration the coordinator reads the link itself. */
static void last_words(const wk_config *cfg, const mla_err *why) {
    if (cfg->link_fd <= 0) return;
    mla_err e;
    fdlink *l = fdlink_new(cfg->link_fd, WIRE_MAX_FRAME, &e);
    if (!l) return;
    link_error(l, cfg, why);
    fdlink_free(l);
}

int wk_run(const wk_config *cfg, mla_err *err) {
    char tag[32];
    snprintf(tag, sizeof tag, "worker %d", cfg->rank);
    mla_log_set_tag(tag);
    int rc = MLA_OK;
    wk w;
    memset(&w, 0, sizeof w);
    w.cfg = cfg;
    w.spin_us = zspin_default(cfg->engine ? cfg->engine->name : NULL, -1);
    wk_ahead_init(&w.ahead[0], false); /* dev: set once the engine is loaded */
    wk_ahead_init(&w.ahead[1], false);
    pthread_mutex_init(&w.id_mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* wk_boot_wait's deadline */
        pthread_cond_init(&w.id_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    w.zctx = zmq_ctx_new();
    void *dealer = zmq_socket(w.zctx, ZMQ_DEALER);
    int linger = 200;
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    int64_t maxmsg = (int64_t)WIRE_MAX_FRAME;
    zmq_setsockopt(dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    /* handshake failures (a refused CURVE key) are seen through a socket monitor during the
     * registration: fail fast with the reason instead of waiting for the timeout */
    void *mon = NULL;
    if (cfg->curve_dir && wk_setup_curve(cfg, dealer, err)) {
        last_words(cfg, err);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return MLA_ERR;
    }
    {
        char mon_ep[64];
        snprintf(mon_ep, sizeof mon_ep, "inproc://wk-mon-%p", (void *)&w);
        if (zmq_socket_monitor(dealer, mon_ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                                   ZMQ_EVENT_DISCONNECTED) == 0) {
            mon = zmq_socket(w.zctx, ZMQ_PAIR);
            zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
            if (zmq_connect(mon, mon_ep) != 0) {
                zmq_close(mon);
                mon = NULL;
            }
        }
    }
    if (!strncmp(cfg->coord_endpoint, "tcp://[", 7)) { /* an IPv6 address: the socket must be told */
        int on = 1;
        zmq_setsockopt(dealer, ZMQ_IPV6, &on, sizeof on);
    }
    if (zmq_connect(dealer, cfg->coord_endpoint) != 0) {
        rc = mla_errf(err, "cannot connect to %s: %s", cfg->coord_endpoint, zmq_strerror(zmq_errno()));
        last_words(cfg, err);
        if (mon) zmq_close(mon);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return rc;
    }
    wire_register_reply reply;
    rc = wk_do_register(cfg, dealer, mon, &reply, err);
    if (mon) {
        zmq_socket_monitor(dealer, NULL, 0);
        zmq_close(mon);
    }
    if (rc) {
        last_words(cfg, err);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return rc;
    }
    atomic_store(&g_registered, 1); /* a SIGTERM / SIGINT now waits for the coordinator (wk_signals) */
    /* the coordinator's flags (docs/switches.md); a --log-level of this worker's own wins */
    if (reply.wo.log_level && !mla_log_level_given()) mla_log_set_level((enum mla_log_level)(reply.wo.log_level - 1));
    MLA_INFO("registered with %s (rank %d of %d%s%s)", cfg->coord_endpoint, cfg->rank, cfg->world,
             cfg->curve_dir ? ", CURVE" : "", cfg->link_fd > 0 ? ", local link" : "");
    w.kv = reply.kv;
    w.wo = reply.wo;
    w.spin_us = zspin_default(cfg->engine ? cfg->engine->name : NULL, reply.wo.spin_us);
    if (cfg->engine)
        w.ahead_mode = wk_ahead_mode(cfg->engine->step_greedy != NULL, cfg->engine->queue && cfg->engine->wait_queued,
                                     reply.wo.step_ahead);
    /* the coordinator that started this worker talks over the link from its reply on */
    fdlink *link = NULL;
    if (cfg->link_fd > 0 && !(link = fdlink_new(cfg->link_fd, WIRE_MAX_FRAME, err))) {
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return mla_err_prefix(err, "--link-fd");
    }
    if (reply.coll_shm_name[0]) {
        if (coll_host_attach(&w.coll, reply.coll_shm_name, cfg->rank, cfg->world,
                             (int)reply.coll_timeout_ms, err)) {
            if (link) link_error(link, cfg, err);
            fdlink_free(link);
            zmq_close(dealer);
            zmq_ctx_term(w.zctx);
            return MLA_ERR;
        }
    } else if (cfg->world == 1) {
        w.coll = coll_single_new();
    } else {
        fdlink_free(link);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return mla_errf(err, "the coordinator gave no collective for world size %d", cfg->world);
    }

    void *pair = zmq_socket(w.zctx, ZMQ_PAIR);
    zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(w.pair_ep, sizeof w.pair_ep, "inproc://wk-compute-%p", (void *)&w);
    if (zmq_bind(pair, w.pair_ep) != 0) MLA_PANIC("inproc bind: %s", zmq_strerror(zmq_errno()));
    pthread_t th;
    if (pthread_create(&th, NULL, wk_compute_main, &w) != 0) MLA_PANIC("pthread_create failed");

    const int hb_ms = (int)reply.heartbeat_ms;
    const int hb_timeout = (int)reply.heartbeat_timeout_ms;
    io_st io = {&w, dealer, pair, link, wk_now_ms(), 0, 0};
    int64_t last_tx = 0;
    load_report load_rep = {0};
    int stop = 0;
    while (!stop) {
        int64_t t = wk_now_ms();
        if (t - last_tx >= hb_ms) {
            wire_msg hb = wk_control_msg(WIRE_CTL_HEARTBEAT, cfg->rank, 0, 0, 0, NULL);
            wire_worker_stats *ws = &hb.u.ctl.stats;
            hb.u.ctl.has_stats = true;
            ws->steps = atomic_load(&w.st_steps);
            ws->step_seconds = (double)atomic_load(&w.st_step_ns) / 1e9;
            coll_host_stats(&ws->allreduces, &ws->allreduce_seconds);
            ws->device_mem_free = atomic_load(&w.mem_free);
            ws->device_mem_total = atomic_load(&w.mem_total);
            ws->decode_steps = atomic_load(&w.st_dsteps);
            ws->decode_seconds = ws->decode_steps ? (double)atomic_load(&w.st_dns) / 1e9 : 0;
            send_up(&io, &hb);
            last_tx = t;
        }
        if (!atomic_load(&w.n_vocab) && !atomic_load(&w.compute_failed)) report_load(&io, cfg->rank, t, &load_rep);
        if (t - io.last_rx > hb_timeout) {
            rc = mla_errf(err, "the coordinator stopped answering (nothing for %lld ms); exiting",
                          (long long)(t - io.last_rx));
            coll_host_abort(w.coll, "a worker lost its coordinator");
            break;
        }
        zmq_pollitem_t items[3] = {{dealer, 0, ZMQ_POLLIN, 0}, {pair, 0, ZMQ_POLLIN, 0}, {NULL, -1, 0, 0}};
        if (link)
            items[2] = (zmq_pollitem_t){NULL, fdlink_fd(link), (short)(ZMQ_POLLIN | (fdlink_pending(link) ? ZMQ_POLLOUT : 0)),
                                        0};
        int prc = zspin_poll(items, link ? 3 : 2, hb_ms, w.spin_us);
        if (prc < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = mla_errf(err, "zmq poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            zmq_msg_t zm;
            zmq_msg_init(&zm);
            if (zmq_msg_recv(&zm, pair, 0) >= 0) {
                if (zmq_msg_size(&zm) == 1 && ((char *)zmq_msg_data(&zm))[0] == 'X') {
                    rc = mla_errf(err, "%s", w.compute_err);
                    stop = 1;
                } else {
                    steptrace_mark(io.last_plan, 'F'); /* the compute thread answers the plans in order */
                    up_frame(&io, zmq_msg_data(&zm), zmq_msg_size(&zm));
                }
            }
            zmq_msg_close(&zm);
        }
        if (stop) break;
        if (link && items[2].revents) {
            mla_err e2;
            if (fdlink_pump(link, (items[2].revents & ZMQ_POLLOUT) != 0, 64, link_down, &io, &e2)) {
                rc = mla_errf(err, "the coordinator's local link: %s; exiting", e2.msg);
                coll_host_abort(w.coll, "a worker lost its coordinator");
                break;
            }
        }
        if (items[0].revents & ZMQ_POLLIN) {
            zmq_msg_t zm;
            zmq_msg_init(&zm);
            if (zmq_msg_recv(&zm, dealer, 0) < 0) {
                zmq_msg_close(&zm);
                continue;
            }
            if (link) MLA_WARN("dropping a ZeroMQ frame from the coordinator (it talks over the local link)");
            else handle_down(&io, zmq_msg_data(&zm), zmq_msg_size(&zm));
            zmq_msg_close(&zm);
        }
        stop = io.stop;
    }

    /* stop the compute thread: it is idle unless a step is running; a step stuck in a collective
     * is released by the abort flag */
    if (rc != MLA_OK && w.coll) coll_host_abort(w.coll, "a worker is exiting");
    pthread_mutex_lock(&w.id_mu);
    w.id_quit = 1; /* a load waiting for the NCCL id gives up */
    pthread_cond_broadcast(&w.id_cv);
    pthread_mutex_unlock(&w.id_mu);
    wire_msg *quit = NULL;
    zmq_send(pair, &quit, sizeof quit, ZMQ_DONTWAIT);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    int joined = pthread_timedjoin_np(th, NULL, &ts) == 0;
    if (!joined) {
        MLA_WARN("the compute thread did not stop; leaving without cleanup");
        return rc;
    }
    /* what is still queued for the coordinator (an error report) gets up to a second */
    for (int i = 0; link && fdlink_pending(link) && i < 100; i++) {
        struct pollfd p = {fdlink_fd(link), POLLOUT, 0};
        mla_err e2;
        if (poll(&p, 1, 10) < 0 || ((p.revents & POLLOUT) && fdlink_flush(link, &e2))) break;
    }
    fdlink_free(link);
    zmq_close(pair);
    zmq_close(dealer);
    zmq_ctx_term(w.zctx);
    coll_free(w.coll);
    free(w.rows_buf);
    free(w.drow);
    free(w.gtok);
    free(w.skip);
    free(w.sids);
    free(w.dmask);
    free(w.rdrow);
    free(w.ndrow);
    free(w.nmods);
    free(w.rtok);
    free(w.stok);
    free(w.jobs);
    free(w.jrow);
    free(w.jpos);
    free(w.jmask);
    free(w.lhit);
    free(w.hit);
    free(w.ridx);
    wk_ahead_free(&w.ahead[0]);
    wk_ahead_free(&w.ahead[1]);
    pthread_cond_destroy(&w.id_cv);
    pthread_mutex_destroy(&w.id_mu);
    return rc;
}

/* SIGTERM and SIGINT (a job-wide `scancel`, Ctrl-C to the process group): a registered worker
 * stays until its coordinator stops it, so that the server's drain completes the requests in
 * flight (a worker also ends when it loses its coordinator); a second signal, or one before the
 * registration, ends it at once. The signals are blocked in every thread and taken by this one
 * (sigwait), so that no other thread's call is interrupted. */
static void *wk_signals(void *arg) {
    sigset_t *set = arg;
    int n = 0;
    for (;;) {
        int sig = 0;
        if (sigwait(set, &sig) != 0) continue;
        if (n++ == 0 && atomic_load(&g_registered)) {
            MLA_WARN("signal %d: staying until the coordinator stops this worker (it drains the server); a second "
                     "signal ends it now", sig);
            continue;
        }
        signal(sig, SIG_DFL);
        pthread_sigmask(SIG_UNBLOCK, set, NULL);
        raise(sig);
        _exit(128 + sig);
    }
    return NULL;
}

int wk_main(int argc, char **argv, wk_pick_engine pick) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        buildinfo_print(stdout, "mlaserve-worker");
        return 0;
    }
    wk_config cfg = {0};
    mla_err err;
    int prc = wk_parse_args(argc, argv, &cfg, &err);
    if (prc == WK_HELP) {
        int proto = 0;
        opt_spec specs[16];
        const opt_table tab = {"options", specs, wk_specs(&cfg, &proto, specs)};
        opts_help(stdout, wk_usage, &tab, 1);
        return 0;
    }
    if (prc) {
        fprintf(stderr, "%s: %s (--help lists the options)\n", argv[0], err.msg);
        return 2;
    }
    char swerr[sizeof err.msg];
    if (mla_switch_check(swerr, sizeof swerr)) {
        fprintf(stderr, "%s: %s\n", argv[0], swerr);
        return 2;
    }
    cfg.engine = pick(cfg.backend, &err);
    if (!cfg.engine) {
        fprintf(stderr, "%s: %s\n", argv[0], err.msg);
        return 2;
    }
    if (!cfg.device) cfg.device = cfg.engine->name;
    static sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_t sth;
    if (pthread_sigmask(SIG_BLOCK, &sigs, NULL) == 0 && pthread_create(&sth, NULL, wk_signals, &sigs) == 0)
        pthread_detach(sth);
    else
        pthread_sigmask(SIG_UNBLOCK, &sigs, NULL); /* no signal thread: the default action */
    int rc = wk_run(&cfg, &err);
    if (rc == MLA_OK) return 0;
    mla_log_set_tag("worker");
    fprintf(stderr, "mlaserve-worker (rank %d): %s\n", cfg.rank, err.msg);
    return rc == WK_REFUSED ? 3 : 1;
}
