/* wk_run: the worker process's runtime, shared by mlaserve-worker and test workers.
 *
 * Two threads. The I/O thread (the caller of wk_run) owns the ZeroMQ DEALER socket connected to
 * the coordinator, and the local link when the coordinator started this worker (link_fd: every
 * frame after the registration reply goes over it; docs/ctrl.md): it registers, answers and
 * sends heartbeats, validates every frame
 * (proto/wire.h) and passes plans to the compute thread over an inproc pair. The compute thread
 * attaches nothing itself: it loads the engine on the collective the I/O thread attached, runs
 * each StepPlan, samples on rank 0 (worker/sample.h) and hands the StepResult back. Bench frames
 * (`mlaserve bench`) take the same path, in order with the plans: the engine's bench_fill /
 * bench_coll run and every rank answers with a BenchResult (an error when the hook is NULL). Heartbeats
 * therefore continue while a long step runs.
 *
 * The worker exits (wk_run returns) on SHUTDOWN (MLA_OK), on a refused registration (MLA_ERR,
 * "registration refused: <reason>"), when the coordinator stops answering for the heartbeat
 * timeout (MLA_ERR), or on a fatal engine error (MLA_ERR). */
#ifndef WK_RUN_H
#define WK_RUN_H

#include <stdint.h>

#include "engine.h"
#include "mla_err.h"

typedef struct wk_config {
    const char *coord_endpoint; /* tcp://host:port or ipc://path */
    int rank, world;
    const char *model_path;
    int n_threads;
    const char *device;          /* reported at registration; wk_main: the engine's name */
    const char *backend;         /* --backend as given (NULL: none); wk_main hands it to its pick function */
    const engine_ops *engine;
    uint32_t protocol_version;   /* 0: WIRE_VERSION (tests set others to check refusals) */
    int register_timeout_ms;     /* 0: 60000 */
    /* CURVE (coordinator/coord.h): curve_dir holds server.pub and client.key (written by
     * `mlaserve keygen`); curve_client_key names another client key file. NULL: no CURVE. */
    const char *curve_dir;
    const char *curve_client_key;
    /* > 0: the descriptor of the local link (common/fdlink.h) the coordinator made when it
     * started this worker; every frame after the registration reply goes over it both ways.
     * 0: the DEALER carries everything. */
    int link_fd;
} wk_config;

/* Fault injection for tests: $MLA_WORKER_STEP_DELAY_MS makes the compute thread sleep that long
 * before every step (so that a test can act while a generation is in flight). */

/* Parses "--coord E --rank R --world T -m MODEL [--backend B] [--threads N] [--device D]
 * [--curve-dir DIR] [--curve-client-key FILE] [--link-fd FD] [--log-level L]" (and, for tests,
 * "--protocol-version V") with common/opts.h (`--opt value` or `--opt=value`). MLA_ERR with a
 * message naming the problem; 1 when --help was asked for. */
int wk_parse_args(int argc, char **argv, wk_config *cfg, mla_err *err);

int wk_run(const wk_config *cfg, mla_err *err);

/* Picks the engine for --backend (NULL: not given); NULL with err when there is none such. */
typedef const engine_ops *(*wk_pick_engine)(const char *backend, mla_err *err);

/* The usual main(): parse (--help, --version), pick the engine, run, print the error; exit
 * status 0 (clean), 2 (bad usage), 3 (registration refused, CURVE key refused included) or 1
 * (other failure). */
int wk_main(int argc, char **argv, wk_pick_engine pick);

#endif
