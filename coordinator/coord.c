/* coord (coordinator/coord.h): starting, supervising and stopping a worker group: the local
 * worker processes (spawn, reap), the group's launch and teardown, coord_start / coord_stop and
 * the state the other threads read. The I/O thread is in coord_io.c, registration and CURVE in
 * coord_reg.c, heartbeats and the restart policy in coord_health.c, the caller's step and bench
 * requests in coord_step.c, the options in coord_opts.c; coord_internal.h holds the shared state. */
#include "coord_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/shard_plan.h"
#include "common/sig_clean.h"
#include "mla_log.h"
#include "mla_switch.h"

extern char **environ;

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
    /* the workers' environment: this process's without the API key, which they never need */
    size_t ne = 0, m = 0;
    while (environ[ne]) ne++;
    char **env = mla_xmalloc((ne + 1) * sizeof *env);
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "MLASERVE_API_KEY=", 17)) env[m++] = environ[i];
    env[m] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, c->worker_exe, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    free(argv);
    if (sv[1] >= 0) close(sv[1]);
    if (rc != 0) {
        if (sv[0] >= 0) close(sv[0]);
        return mla_errf(err, "cannot start worker %d (%s%s): %s", r, c->worker_exe,
                        strchr(c->worker_exe, '/') ? ""
                                                  : ": not beside mlaserve nor in ../worker/, looked up in PATH; "
                                                    "--worker-exe gives its path",
                        strerror(rc));
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
    c->no_restart = atomic_load(&c->abandon); /* a group started during a shutdown stays down */
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
        char what[64];
        MLA_INFO("%s on %s", coord_start_what(what, sizeof what, c->cfg.world, 1), c->endpoint);
    }
    c->start_deadline = coord_now_ms() + c->cfg.start_timeout_ms;
    if (pthread_create(&c->th, NULL, coord_io_main, c) != 0) MLA_PANIC("pthread_create failed");
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
    int64_t deadline = coord_now_ms() + 3000;
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (!rs->pid || rs->exited) continue;
        int ws;
        for (;;) {
            pid_t p = waitpid(rs->pid, &ws, WNOHANG);
            if (p == rs->pid || (p < 0 && errno == ECHILD)) break;
            if (coord_now_ms() > deadline) {
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
    const int64_t t = coord_now_ms();
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
        w->has_backend = rs->has_backend;
        w->backend = rs->backend;
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

void coord_abandon_step(coord *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->abandon)) {
        snprintf(c->abandon_msg, sizeof c->abandon_msg, "%s", why);
        c->no_restart = 1; /* a shutdown: the supervisor leaves the failure as it is */
        atomic_store(&c->abandon, 1);
    }
    pthread_mutex_unlock(&c->mu);
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
    if (cfg_in->external && cfg_in->worker_exe)
        return mla_errf(err, "--worker-exe names the program of the workers the server starts; with "
                             "--workers-external it starts none");
    const wire_kv_opts *kv = &cfg_in->kv;
    if (kv->gpu_memory_utilization < 0 || kv->gpu_memory_utilization > 1 || kv->max_step_tokens > WIRE_MAX_STEP_TOKENS ||
        kv->max_context > WIRE_MAX_CTX || kv->max_seqs > WIRE_MAX_SEQS)
        return mla_errf(err, "cache pool settings out of range: --gpu-memory-utilization %g (0, 1], steps of %u tokens "
                             "(at most %u), context %u (at most %u), %u sequences (at most %u)",
                        kv->gpu_memory_utilization, kv->max_step_tokens, WIRE_MAX_STEP_TOKENS, kv->max_context,
                        WIRE_MAX_CTX, kv->max_seqs, WIRE_MAX_SEQS);
    if (cfg_in->step_ahead < 0 || cfg_in->step_ahead > WIRE_AHEAD_SYNC || cfg_in->nccl < 0 ||
        cfg_in->nccl > WIRE_NCCL_REQUIRED || cfg_in->cuda_precision < 0 || cfg_in->cuda_precision > WIRE_PREC_EXACT ||
        cfg_in->allreduce < 0 || cfg_in->allreduce > WIRE_AR_ONESHOT ||
        cfg_in->nccl_id_timeout_ms < 0 || cfg_in->nccl_id_timeout_ms > 3600000 ||
        (cfg_in->spin_us_given && (cfg_in->spin_us < 0 || cfg_in->spin_us > 1000000)))
        return mla_errf(err, "worker settings out of range: --step-ahead %d, --nccl %d, --cuda-precision %d, "
                             "--allreduce %d, --nccl-id-timeout-ms %d, --spin-us %d",
                        cfg_in->step_ahead, cfg_in->nccl, cfg_in->cuda_precision, cfg_in->allreduce,
                        cfg_in->nccl_id_timeout_ms, cfg_in->spin_us);
    coord *c = mla_xcalloc(1, sizeof *c);
    c->cfg = *cfg_in;
    c->clean_sock = c->clean_dir = -1;
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
    char bind_ep[sizeof c->endpoint];
    int ipv6 = 0;
    if (cfg_in->endpoint && coord_endpoint_bindable(cfg_in->endpoint, bind_ep, sizeof bind_ep, &ipv6, err)) {
        coord_stop(c);
        return MLA_ERR;
    }
    if (ipv6) zmq_setsockopt(c->router, ZMQ_IPV6, &one, sizeof one);
    if (c->curve_dir) {
        if (coord_setup_curve(c, err)) {
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
        snprintf(c->endpoint, sizeof c->endpoint, "%s", bind_ep);
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
    /* a command ended by a signal removes them too (common/sig_clean.h) */
    if (c->ipc_path[0]) c->clean_sock = sig_clean_file(c->ipc_path);
    if (c->ipc_dir[0]) c->clean_dir = sig_clean_dir(c->ipc_dir);

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
        if (pthread_create(&c->sup_th, NULL, coord_sup_main, c) != 0) MLA_PANIC("pthread_create failed");
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
const char *coord_start_what(char *buf, size_t n, int world, int external) {
    snprintf(buf, n, "%s %d %sworker%s", external ? "waiting for" : "starting", world, external ? "external " : "",
             world == 1 ? "" : "s");
    return buf;
}
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
                         atomic_load(&c->consecutive_restarts) < c->cfg.max_restarts &&
                         (c->cfg.on_failure == COORD_ON_FAILURE_RESTART ||
                          (c->cfg.on_failure == COORD_ON_FAILURE_STOP && coord_failed_after_stall(c)))
                     ? " (restarting)" : "");
    pthread_mutex_unlock(&c->mu);
    return ok;
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
    sig_clean_forget(c->clean_sock); /* after: a signal in between finds them gone */
    sig_clean_forget(c->clean_dir);
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
