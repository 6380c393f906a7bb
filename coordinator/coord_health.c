/* coord_health: the health of a worker group (coordinator/coord.h): worker exits and heartbeat
 * timeouts found by the I/O thread (coord_supervise), and the supervisor thread that applies the
 * restart policy after a failure. */
#include "coord_internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "mla_log.h"

static void describe_exit(char *buf, size_t n, int ws) {
    if (WIFEXITED(ws)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(ws));
    else if (WIFSIGNALED(ws)) snprintf(buf, n, "was killed by signal %d", WTERMSIG(ws));
    else snprintf(buf, n, "stopped (wait status %d)", ws);
}

/* What a local worker that failed before registering left on its link (worker/wk_run.c
 * last_words: a CONTROL_ERROR frame): its message into out, else "" */
static void last_words(coord *c, int r, char *out, size_t cap) {
    out[0] = '\0';
    rank_st *rs = &c->ranks[r];
    if (!rs->link || rs->registered) return;
    for (int k = 0; k < 8; k++) {
        uint8_t *f;
        size_t n;
        mla_err e;
        if (fdlink_recv(rs->link, &f, &n, &e) != 1) break;
        wire_limits lim = {.world = (uint32_t)c->cfg.world};
        wire_msg m;
        if (wire_decode(f, n, &lim, &m, &e) == MLA_OK) {
            if (m.kind == WIRE_CONTROL && m.u.ctl.kind == WIRE_CTL_ERROR && m.u.ctl.rank == (uint32_t)r)
                snprintf(out, cap, "%s", m.u.ctl.message);
            wire_msg_free(&m);
        }
        free(f);
    }
}

void coord_supervise(coord *c, int64_t t) {
    /* local children: waitpid, so that a death is seen within one poll tick */
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (!rs->pid || rs->exited) continue;
        int ws;
        pid_t p = waitpid(rs->pid, &ws, WNOHANG);
        if (p == rs->pid) {
            rs->exited = 1;
            rs->wstatus = ws;
            char how[64], words[WIRE_MAX_STR];
            describe_exit(how, sizeof how, ws);
            last_words(c, r, words, sizeof words);
            if (rs->refusal[0])
                coord_group_fail(c, "worker %d (pid %d) %s: registration refused: %s", r, (int)rs->pid, how, rs->refusal);
            else if (words[0])
                coord_group_fail(c, "worker %d (pid %d) %s: %s", r, (int)rs->pid, how, words);
            else
                coord_group_fail(c, "worker %d (pid %d) %s", r, (int)rs->pid, how);
        }
    }
    pthread_mutex_lock(&c->mu);
    int st = c->state;
    pthread_mutex_unlock(&c->mu);
    if (st != ST_STARTING && st != ST_READY) return;
    if (c->inflight && atomic_load(&c->abandon)) { /* coord_abandon_step: written before the flag */
        coord_group_fail(c, "%s", c->abandon_msg);
        return;
    }
    if (c->inflight && c->cfg.step_timeout_ms > 0 && t - c->inflight_since > c->cfg.step_timeout_ms) {
        coord_group_fail(c, "%s %" PRIu64 " did not finish within %d ms (a worker hangs or is too slow; see --step-timeout-ms)",
                   c->inflight_bench ? "bench request" : "step", c->inflight_step, c->cfg.step_timeout_ms);
        return;
    }
    for (int r = 0; r < c->cfg.world; r++) {
        rank_st *rs = &c->ranks[r];
        if (rs->registered && t - rs->last_rx > c->cfg.heartbeat_timeout_ms)
            coord_group_fail(c, "worker %d (pid %d) stopped answering: no message for %lld ms", r,
                       (int)rs->reg_pid, (long long)(t - rs->last_rx));
    }
    if (st == ST_STARTING && t > c->start_deadline) {
        char missing[512] = "";
        size_t off = 0;
        for (int r = 0; r < c->cfg.world && off < sizeof missing - 16; r++)
            if (!c->ranks[r].loaded)
                off += (size_t)snprintf(missing + off, sizeof missing - off, " %d%s", r,
                                        c->ranks[r].registered ? "(loading)" : "");
        coord_group_fail(c, "workers made no start-up progress (registration, load progress) for %d ms "
                      "(--start-timeout-ms); missing ranks:%s%s%s",
                   c->cfg.start_timeout_ms, missing, c->ranks[0].refusal[0] ? "; last refusal: " : "",
                   c->ranks[0].refusal);
    }
}

/* ---- restart policy ---------------------------------------------------------------------- */

/* Whether the failure came right after the coordinator itself stood still (the workers then
 * exit on the missed heartbeat through no fault of theirs). Under mu. */
int coord_failed_after_stall(coord *c) {
    int64_t st = atomic_load(&c->stall_at);
    int64_t win = 2 * (int64_t)c->cfg.heartbeat_timeout_ms + 2000;
    return st > 0 && c->fail_at - st < win && st - c->fail_at < win;
}

/* n restarts in a row used up --max-restarts: the group is given up (c->mu held). true then. */
static bool spent(coord *c, int n) {
    if (n < c->cfg.max_restarts) return false;
    c->gave_up = 1;
    MLA_ERROR("worker group: %d restarts in a row without a successful step; giving up (%s)", n, c->fail_msg);
    pthread_cond_broadcast(&c->cv);
    return true;
}

/* The supervisor thread (policies RESTART and STOP): waits for a failure, backs off, restarts
 * the group; under STOP only a failure that followed a stall of the coordinator itself is
 * restarted. Gives up after max_restarts restarts without a successful step in between. */
void *coord_sup_main(void *arg) {
    coord *c = arg;
    mla_log_set_tag("coord");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->quit && (c->state != ST_FAILED || c->gave_up || c->no_restart)) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        int n = atomic_load(&c->consecutive_restarts);
        /* no restart left: said at once (/health does not announce one that will not come) */
        if ((c->cfg.on_failure == COORD_ON_FAILURE_RESTART || coord_failed_after_stall(c)) && spent(c, n)) continue;
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
        if (c->cfg.on_failure != COORD_ON_FAILURE_RESTART && !coord_failed_after_stall(c)) {
            c->no_restart = 1; /* STOP: a worker's own failure stays (coord_failed_for_good) */
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        if (spent(c, n)) continue; /* a stall noted during the back-off made it one to restart */
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
