/* coord_internal: the state of a worker group shared by the coordinator's files (coord.c,
 * coord_io.c, coord_reg.c, coord_health.c, coord_step.c, coord_opts.c). Not for other modules:
 * they use coordinator/coord.h. */
#ifndef COORD_INTERNAL_H
#define COORD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "coll_host.h"
#include "common/fdlink.h"
#include "coord.h"
#include "proto/curve.h"
#include "proto/zspin.h"

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
    /* sends to it failing (a worker that left): warned about once until one goes through again
     * (coord_send_to_rank; the heartbeat would otherwise warn every tick) */
    int send_failing;
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
    /* the kernel configuration its engine chose (LOADED; CUDA workers; under mu) */
    int has_backend;
    wire_backend_cfg backend;
} rank_st;

struct coord {
    coord_config cfg;
    char *model_path, *worker_exe, *curve_dir;
    char **worker_args;
    char endpoint[512];
    char ipc_path[256];
    char ipc_dir[128]; /* the private folder (mode 0700) holding ipc_path when we made it */
    int clean_sock, clean_dir; /* their sig_clean entries (-1: none) */
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
    /* coord_abandon_step: set once (the message first, under mu), read by the I/O thread */
    _Atomic int abandon;
    char abandon_msg[256];
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


/* coord_io.c: the I/O thread and what the other files send through it */
int64_t coord_now_ms(void); /* CLOCK_MONOTONIC in ms */
void *coord_io_main(void *arg); /* the I/O thread (arg: the coord) */
/* The group failed: remember why (first reason wins), release the ranks blocked in the
 * collective, fail the in-flight step, tell the survivors to shut down. I/O thread. */
void coord_group_fail(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void coord_send_frame_to_ident(coord *c, const void *ident, size_t ilen, const wire_msg *m);
void coord_send_to_rank(coord *c, int r, const void *buf, size_t n);

/* coord_reg.c: registration and CURVE (I/O thread, but coord_setup_curve: coord_start) */
int coord_find_rank(coord *c, const void *ident, size_t n); /* the rank of a peer; -1: none */
int coord_setup_curve(coord *c, mla_err *err);
void coord_check_ready(coord *c); /* every rank loaded: the group is ready */
void coord_handle_register(coord *c, const void *ident, size_t ilen, const wire_register *rg);
void coord_handle_zap(coord *c); /* one ZAP request */
void coord_send_nccl_id(coord *c, int r);

/* coord_health.c: exits, heartbeats and the restart policy */
int coord_failed_after_stall(coord *c);
void *coord_sup_main(void *arg); /* the supervisor thread (arg: the coord) */
void coord_supervise(coord *c, int64_t t); /* I/O thread: reaps exits, checks heartbeats */

#endif
