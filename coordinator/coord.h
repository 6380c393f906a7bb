/* coord: the coordinator's side of the worker group, as a library (used by `mlaserve generate /
 * logits --tp N`, later by the scheduler and the HTTP server).
 *
 * coord_start() binds a ZeroMQ ROUTER socket (tcp:// or ipc://), creates the host collective
 * segment, and either starts `world` local worker processes (posix_spawn of mlaserve-worker,
 * supervised with waitpid) or waits for external ones. Every worker registers (protocol version,
 * model hash, world size and rank are checked; a mismatch is refused with the reason), attaches
 * the collective, loads its shard and reports LOADED; then the group is ready.
 *
 * A background I/O thread owns the socket: it sends each StepPlan to every rank (one DEALER per
 * worker on the ROUTER), returns rank 0's StepResult, exchanges heartbeats, and supervises. A
 * worker that exits (waitpid) or stops answering (heartbeat timeout) fails the group: the
 * collective is aborted (so the other ranks are released), the in-flight step fails with a
 * message naming the worker, the remaining workers are told to shut down, and every later call
 * fails with the same message. Policy: stop (a group is never half-alive); the owner may then
 * call coord_restart().
 *
 * Ownership: coord_start() returns a coord owned by the caller; coord_stop() shuts the workers
 * down (SHUTDOWN, then SIGKILL after a grace period), reaps every child and frees everything.
 * Results from coord_step() are owned by the caller: coord_result_free(). */
#ifndef COORD_H
#define COORD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mla_err.h"
#include "common/gguf.h"
#include "common/model_config.h"
#include "common/opts.h"
#include "wire.h"

typedef struct coord coord;

typedef struct coord_config {
    const char *endpoint;      /* bind address; NULL: a fresh ipc:// path under /tmp */
    int world;                 /* tensor-parallel degree */
    const char *model_path;
    uint64_t model_hash;       /* what workers must report (gguf_index_hash) */
    int external;              /* 1: do not spawn, wait for external workers */
    const char *worker_exe;    /* NULL: mlaserve-worker next to this program */
    const char *const *worker_args; /* extra arguments for every spawned worker, NULL-terminated */
    int n_threads;             /* --threads for spawned workers (0: 1) */
    const char *backend;       /* --backend for spawned workers ("cpu"/"cuda"; NULL: theirs, cuda where a GPU is) */
    int heartbeat_ms;          /* 0: 100 */
    int heartbeat_timeout_ms;  /* 0: 5000 */
    int coll_timeout_ms;       /* 0: 30000 */
    /* Worker settings handed over at registration (RegisterReply, wire_worker_opts): zeros take
     * the defaults. spin_us counts only with spin_us_given (else the backend's default, as
     * zspin_default). */
    int nccl_id_timeout_ms;    /* 0: 120000 */
    int spin_us, spin_us_given;
    int step_ahead;            /* WIRE_AHEAD_*: queue, off, sync */
    int nccl;                  /* WIRE_NCCL_*: auto, off, on (required) */
    int cuda_precision;        /* WIRE_PREC_*: split, bf16, exact */
    int allreduce;             /* WIRE_AR_*: nccl, oneshot */
    size_t coll_chunk_bytes;   /* 0: default */
    int start_timeout_ms;      /* registration + load; 0: 120000 */
    /* Per-step timeout: a step in flight longer than this fails the group ("a worker hangs").
     * 0: 600000; < 0: off. */
    int step_timeout_ms;
    /* Security of the control plane (see the note below). curve_dir: a folder written by
     * `mlaserve keygen` with server.key and authorized_keys (and client.key, handed to spawned
     * workers); NULL: no CURVE. insecure: allow a non-loopback tcp:// bind without CURVE. */
    const char *curve_dir;
    int insecure;
    /* What a group failure leads to: COORD_ON_FAILURE_STOP (the group stays failed; the owner
     * may call coord_restart; but a failure right after the coordinator process itself stood
     * still longer than half the heartbeat timeout, when the workers exit on the missed
     * heartbeat, is restarted as under RESTART), COORD_ON_FAILURE_RESTART (a supervisor thread restarts the group,
     * at most max_restarts times in a row without a step succeeding in between, 0: 5), or
     * COORD_ON_FAILURE_EXIT (as STOP; the owner is expected to exit: see coord_policy). */
    int on_failure;
    int max_restarts;
    /* The cache pool every worker takes at load (RegisterReply, worker/engine.h engine_opts):
     * zeros take the defaults (gpu_memory_utilization 0.90, steps of 512 tokens, 32 sequences,
     * the model's context; a CPU worker's kv_memory_bytes 0: its default of 1 GiB). */
    wire_kv_opts kv;
    /* 1: coord_start returns once the workers are started, without waiting for them to load
     * (`serve` answers /health meanwhile); coord_phase says when the group is ready or failed. */
    int no_wait;
} coord_config;

enum { COORD_ON_FAILURE_STOP = 0, COORD_ON_FAILURE_RESTART = 1, COORD_ON_FAILURE_EXIT = 2 };

/* Control-plane security. With curve_dir the ROUTER is a ZeroMQ CURVE server (traffic
 * authenticated and encrypted, libsodium-backed libzmq) and a ZAP handler admits only clients
 * whose public key is listed in authorized_keys (refusals are logged with the peer address).
 * Without keys only ipc://, inproc:// and loopback tcp:// (127.*, localhost, [::1]) endpoints
 * may be bound, unless insecure is set. */

/* The control-plane options as an opts table (common/opts.h) writing into cfg:
 *   --coord EP, --workers-external, --curve-dir DIR, --insecure-control-plane,
 *   --heartbeat-timeout-ms N, --step-timeout-ms N, --start-timeout-ms N,
 *   --on-worker-failure stop|restart|exit, --max-restarts N, --backend cpu|cuda,
 *   --gpu-memory-utilization F, --kv-memory BYTES, and the worker settings handed over at
 *   registration: --coll-timeout-ms N, --nccl-id-timeout-ms N, --spin-us N,
 *   --step-ahead queue|off|sync, --nccl auto|off|on, --cuda-precision split|bf16|exact
 * Fills specs[0..COORD_N_OPTS); string values will point into argv. */
#define COORD_N_OPTS 19
void coord_opt_specs(coord_config *cfg, opt_spec *specs);

/* What every command that starts a worker group takes (`mlaserve generate`, `logits
 * --processes`, `bench`, `serve`): the model, the tensor-parallel degree, threads per worker, the
 * worker program, and the control-plane options above. Strings point into argv. */
typedef struct coord_group_opts {
    const char *model;
    int tp, threads;
    const char *worker_exe;
    coord_config cc;
} coord_group_opts;

/* -m/--model PATH, --tp N, --threads N, --worker-exe PATH into o (tp and threads default to 1
 * when 0 on entry). Fills specs[0..COORD_GROUP_N_OPTS). */
#define COORD_GROUP_N_OPTS 4
void coord_group_opt_specs(coord_group_opts *o, opt_spec *specs);

/* Checks that the open model g (the file o->model) can be served by o->tp ranks
 * (coord_check_model) and starts the group: o->tp local workers (or external ones), as
 * coord_start. MLA_ERR with the reason, prefixed by the model path or "starting N workers". */
int coord_group_start(const coord_group_opts *o, const gguf_ctx *g, coord **c, mla_err *err);

/* 1 when the endpoint may be bound without CURVE (ipc://, inproc://, tcp on loopback). */
int coord_endpoint_is_local(const char *endpoint);
/* The endpoint as ZeroMQ binds it into out (n bytes): ipc:// and inproc:// as given; tcp://HOST:PORT
 * with PORT 1..65535 or *, localhost as 127.0.0.1, *ipv6 set for a bracketed host. MLA_ERR with the
 * reason for another transport or a bad port. */
int coord_endpoint_bindable(const char *endpoint, char *out, size_t n, int *ipv6, mla_err *err);

/* Checks, before any worker starts, that the model can be served with `world` ranks: its
 * config and tensor shapes, and a valid tensor-parallel plan (the one the workers will load,
 * common/shard_plan.h). MLA_ERR with the reason (heads not divisible, no block-aligned
 * layout, a bad tensor) otherwise. cfg_out (may be NULL) receives the model config. */
int coord_check_model(const gguf_ctx *g, int world, mla_config *cfg_out, mla_err *err);

int coord_start(coord **out, const coord_config *cfg, mla_err *err);

const char *coord_endpoint(const coord *c);
uint32_t coord_n_vocab(const coord *c);
/* The cache pools the ranks took (LOADED): n_blocks is the smallest rank's, the one block tables
 * may use; block_size positions a block on every rank (checked equal); block_bytes rank 0's. */
typedef struct coord_kv_info {
    uint32_t n_blocks, block_size;
    uint64_t block_bytes;
    uint32_t rank_blocks[WIRE_MAX_WORLD];
} coord_kv_info;
void coord_kv_pool(const coord *c, coord_kv_info *out);
int coord_world(const coord *c);
/* What starting a group of `world` workers does, for messages: "starting 2 workers" or "waiting
 * for 1 external worker"; writes at most n bytes (n > 0) to buf and returns buf. */
const char *coord_start_what(char *buf, size_t n, int world, int external);
/* pid of a local worker (0 for external workers or before it started) */
pid_t coord_worker_pid(const coord *c, int rank);

/* Runs one step on every worker; blocks until rank 0's result or a failure. On MLA_OK *out holds
 * the result (out->ok is true). */
int coord_step(coord *c, const wire_step_plan *plan, wire_step_result *out, mla_err *err);
void coord_result_free(wire_step_result *r);

/* Forgets sequences on every worker. */
int coord_free_seqs(coord *c, const uint64_t *ids, uint32_t n, mla_err *err);

/* `mlaserve bench` (Bench frames, answered by every rank; the step timeout and the group's
 * failure handling apply as to a step). coord_bench_fill makes each of the n sequences (created
 * if new) hold n_past positions of zero latent cache on every rank (engine bench_fill), so that
 * their next step runs at position n_past. coord_bench_coll has every rank time iters all-reduces
 * of n_floats floats on its model's collective; *sec_per_op is the slowest rank's mean per
 * all-reduce. A rank that cannot (an engine without the hook, a context too small) answers with
 * an error, returned as "worker R: <reason>" (the lowest such rank); the group stays usable. */
int coord_bench_fill(coord *c, const uint64_t *ids, uint32_t n, uint32_t n_past, uint32_t cover, mla_err *err);

/* Block tables for commands that run their own plans (generate, logits, bench) instead of the
 * scheduler: the slot-th of n_slots sequences of up to `positions` positions takes the contiguous
 * pool blocks [slot * k, (slot + 1) * k), k = coord_table_len(c, positions), written to ids (room
 * for k) with *n = k. MLA_ERR naming the numbers when the smallest rank's pool cannot hold n_slots
 * such sequences. coord_bench_fill's sequence i takes slot i of n with `cover` (>= n_past)
 * positions, for the decode steps that follow. */
int coord_slot_table(const coord *c, uint32_t slot, uint32_t n_slots, uint32_t positions, uint32_t *ids, uint32_t *n,
                     mla_err *err);
uint32_t coord_table_len(const coord *c, uint32_t positions);
int coord_bench_coll(coord *c, size_t n_floats, int iters, double *sec_per_op, mla_err *err);

/* 1 while the group is ready; 0 once it failed or while it restarts (the reason goes to err
 * when not NULL). */
int coord_healthy(coord *c, mla_err *err);
/* The on_failure policy in force, and the number of restarts so far. */
int coord_policy(const coord *c);
int coord_restarts(coord *c);
/* 1 when the group failed for good: failed with policy EXIT, failed with policy STOP (not
 * after a stall of the coordinator itself, which is restarted), or restarting gave up. */
int coord_failed_for_good(coord *c);
/* 1 when restarting the group was given up (max_restarts in a row without a good step). */
int coord_gave_up(coord *c);
/* For a shutdown that will not wait for a step that may hang (the end of a drain): the step in
 * flight, or the next one, fails at once with the message why (copied), which fails the group
 * without a restart. The caller waiting in coord_step gets the error within a poll tick (10 ms)
 * instead of after step_timeout_ms. Any thread. */
void coord_abandon_step(coord *c, const char *why);

/* Where the group is: loading (the first start), ready, failed during the first start, failed
 * later, or restarting. */
enum { COORD_PHASE_LOADING, COORD_PHASE_READY, COORD_PHASE_START_FAILED, COORD_PHASE_FAILED, COORD_PHASE_RESTARTING };
int coord_phase(coord *c);

/* One worker as the coordinator sees it: registration, load progress (bytes of the model file,
 * worker-reported; load_seconds from its first to its last progress report), the seconds since
 * its last message (-1: not registered), and its last heartbeat's stats. */
typedef struct coord_worker_info {
    int registered, loaded;
    char device[WIRE_MAX_STR];
    uint64_t load_done, load_total;
    double load_seconds;
    double heartbeat_age;
    int has_stats;
    wire_worker_stats stats;
    int has_backend; /* a CUDA worker's kernel configuration (from its loaded frame) */
    wire_backend_cfg backend;
} coord_worker_info;
/* Fills info[0..min(world, cap)) and returns that count. Thread-safe. */
int coord_workers(coord *c, coord_worker_info *info, int cap);

/* Restart policy: tears the group down (as coord_stop does, keeping the socket) and starts a
 * fresh one (new workers, new collective; every sequence's cache is gone). Local workers are
 * spawned again; external ones must register again. */
int coord_restart(coord *c, mla_err *err);

void coord_stop(coord *c);

#endif
