/* wk_internal: the state a worker's I/O and compute threads share, and the functions the
 * worker's files (wk_run.c, wk_link.c, wk_step.c, wk_boot.c) call across. Not for other modules:
 * they use worker/wk_run.h. */
#ifndef WK_INTERNAL_H
#define WK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "coll_host.h"
#include "engine.h"
#include "wire.h"
#include "wk_ahead.h"
#include "wk_run.h"
#include "wk_sample.h"

#define WK_REFUSED (-3)
#define WK_HELP 1 /* wk_parse_args: --help was asked for */

/* ---- shared state between the two threads ------------------------------------------------ */

typedef struct wk {
    const wk_config *cfg;
    void *zctx;
    char pair_ep[64];
    coll *coll;
    _Atomic uint32_t n_vocab;
    _Atomic int compute_failed;
    char compute_err[sizeof(((mla_err *)0)->msg)];
    /* the NCCL id relayed by the coordinator (Control NCCL_ID), for engine_boot.wait_id: set by
     * the I/O thread, waited for by the compute thread; id_quit: the I/O thread is leaving */
    pthread_mutex_t id_mu;
    pthread_cond_t id_cv;
    uint8_t nccl_id[WIRE_MAX_NCCL_ID];
    int id_known, id_quit;
    /* the compute thread's logits rows, kept from step to step (a fresh half-megabyte row per
     * sequence and step cost page faults), and its per-sequence device rows and tokens */
    float *rows_buf;
    size_t rows_cap;
    engine_drow *drow; /* how each row of the plan takes its token (engine.h) */
    int32_t *gtok;
    bool dev;          /* the engine samples on the device (engine_ops.dev_sample), on every rank */
    bool dev_agreed;   /* the ranks have agreed on dev (at the first plan) */
    bool *skip;        /* rows wk_constrain_prepare leaves alone (the device rows) */
    uint64_t *sids;    /* scratch: a plan's sequence ids, sorted (has_twice) */
    uint8_t *dmask;    /* copies of the device rows' masks for an engine call (n_vocab each) */
    size_t dmask_cap;
    /* the step ahead (worker/wk_ahead.h): ahead[cur] is the one held, run or (queued) in the
     * engine; the other is the one queued behind it (chained) while a plan is matched. Its
     * scratch: a plan's rows it answered (hit; lhit: a host row's logits there), the indices of
     * the others (ridx), their device rows and tokens (rdrow, rtok), and the tokens of the
     * plan just answered (stok: rank 0's result; the other ranks get it by broadcast) */
    wk_ahead ahead[2];
    wk_ahead_mode_t ahead_mode;
    int cur;
    bool queued, chained, later; /* later: the chained step waits for queue_mods */
    engine_drow *rdrow, *ndrow; /* the residual's rows, the step ahead's (run_ahead) or the chained step's */
    sample_mod *nmods;
    int32_t *rtok, *hit, *stok;
    float **lhit;
    uint32_t *ridx;
    uint32_t flags_cap;
    /* rank 0's host sampling (worker/wk_sample.h): its samplers, a step's jobs, the plan row of
     * each, and copies of their masks */
    wk_sample *samp;
    wk_sample_job *jobs;
    uint32_t *jrow;
    uint32_t *jpos; /* a scored job's row position (wire_seq_result.plp index); UINT32_MAX: sampled */
    size_t jobs_cap;
    uint8_t *jmask;
    size_t jmask_cap;
    wire_worker_opts wo; /* the coordinator's settings (RegisterReply) */
    long spin_us; /* zspin_default(the engine): how long both threads poll before they sleep */
    wire_kv_opts kv;  /* the cache pool settings from the coordinator's reply */
    _Atomic uint32_t kv_blocks; /* the pool's blocks once loaded: what block ids are checked against */
    /* for the heartbeat's stats (written by the compute thread, read by the I/O thread) */
    _Atomic uint64_t st_steps, st_step_ns, mem_free, mem_total;
    _Atomic uint64_t st_dsteps, st_dns; /* engine_ops.decode_time's steps and nanoseconds */
    int64_t mem_at; /* compute thread: ms of the last mem_info */
} wk;

/* the engine_boot context of a worker (wk_boot.c): its state and the compute thread's pair socket */
typedef struct wk_boot {
    wk *w;
    void *pair; /* the compute thread's end of the inproc pair */
} wk_boot;


/* wk_run.c */
int64_t wk_now_ms(void); /* CLOCK_MONOTONIC in ms */

/* wk_link.c: registration with the coordinator (I/O thread) */
int wk_setup_curve(const wk_config *cfg, void *dealer, mla_err *err);
/* Register, wait for the reply; WK_REFUSED with the reason when refused. */
int wk_do_register(const wk_config *cfg, void *dealer, void *mon, wire_register_reply *reply, mla_err *err);

/* wk_step.c: the compute thread, and the control frames both threads send */
void *wk_compute_main(void *arg); /* the compute thread (arg: the wk) */
int wk_send_msg(void *sock, const wire_msg *m, mla_err *err);
wire_msg wk_control_msg(wire_control_kind kind, int rank, int32_t status, uint32_t n_vocab, uint64_t step_id,
                        const char *message);

/* wk_boot.c: engine_boot's hooks (ctx: a wk_boot) */
int wk_boot_publish(void *ctx, const uint8_t *id, size_t len, mla_err *err);
int wk_boot_wait(void *ctx, uint8_t *id, size_t len, mla_err *err);

#endif
