/* wk_ahead: the worker's step ahead (used by worker/wk_step.c's compute thread).
 *
 * After a step whose every row was a one-token decode that sampled a token (taken on the device:
 * greedily, or sampled there where the engine can (engine_ops.dev_sample: temperature, top_k,
 * top_p, min_p, a grammar's mask, logit_bias); or sampled on rank 0 of the host: penalties,
 * logprobs, and everything but greedy where the engine cannot), the
 * next step is known before the coordinator sends it: the same sequences, the tokens just taken,
 * the positions one further. The compute thread runs that step (or queues
 * it in the engine: engine.h queue) while the result travels to the coordinator and the next
 * plan comes back, so that the device does not wait for the round trip. A step built before its
 * tokens are known (wk_ahead_build with NULL) is queued behind the one that takes them.
 *
 * A host-sampled row of the step ahead (a "host row") is not sampled ahead: the step keeps its
 * logits row, and when the next plan asks for it, the worker samples that row from those logits
 * exactly as it samples a row the engine just ran (the plan's sampling settings, the sequence's
 * history, the grammar state after the plan's token, the seed of that position): its token does
 * not depend on whether a step ran ahead. Rows that return logits stay out.
 *
 * When the next plan arrives, each of its rows that asks for exactly what was run ahead (the
 * same sequence, one token, that token at that position, taken on the device or on the host as
 * it was run, no logits) takes its token or its logits row from the step ahead; the other rows
 * form a residual plan that the engine runs as usual. A sequence run ahead but then not
 * continued (finished, freed, sent with a different token or more tokens) needs nothing: the
 * engines rewind a sequence whose plan starts below what its cache holds (worker/engine.h), and
 * free_seq forgets it. The coordinator marks the rows whose token ends their request by its
 * length (wire_seq.last): a plan of such rows only has no step ahead, which would hold the next
 * request's prompt behind a step no plan takes.
 *
 * Every rank takes the same decision from the same plan and the same tokens (the device's: the
 * argmax of logits every rank holds in full; the host's: rank 0 broadcasts them on the worker's
 * collective first, worker/wk_step.c), so the collectives inside the step ahead still pair up.
 * A step ahead with host rows is run (engine step_greedy), never queued: queue takes no logits.
 *
 * Ownership: a wk_ahead owns the step it built (its rows, tokens and positions, its host rows'
 * logits: valid until the next wk_ahead_logits) and the residual plan's row array; the residual's token and position arrays point into the plan it was cut
 * from, which must outlive its use. --step-ahead (wk_ahead_mode): off, sync run after the
 * step, else queued where the engine can. */
#ifndef WK_AHEAD_H
#define WK_AHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

typedef struct wk_ahead {
    wire_step_plan plan; /* the step run ahead (n_seqs 0: none); rows point into tok/pos */
    int32_t *tok, *pos;  /* its input token and position, one a row */
    int32_t *out;        /* the token each of its rows took; -1: none (the step failed); WK_AHEAD_LOGITS */
    bool *host;          /* row i is sampled on the host: its logits are kept (lrow[i]) */
    float **lrow;        /* the logits row of each row (wk_ahead_logits) */
    float *logits;       /* their buffer */
    size_t logits_cap;   /* floats */
    uint32_t cap, n_host;
    wire_seq *rest; /* the residual plan's rows (wk_ahead_match) */
    uint32_t rest_cap;
    uint64_t rows_run, rows_used, host_used; /* rows run ahead; of those, rows a plan took; host rows of those */
    bool dev; /* the engine samples on the device (engine_ops.dev_sample): wk_ahead_device_row */
} wk_ahead;

void wk_ahead_init(wk_ahead *a, bool dev);
void wk_ahead_free(wk_ahead *a);

/* How the worker takes the step ahead, from the coordinator's --step-ahead (setting: WIRE_AHEAD_*):
 * off not at all, sync run after the step (step_greedy), queue (the default) queued in the engine
 * where it has queue / wait_queued; OFF for an engine without step_greedy, SYNC for one without
 * queue. */
typedef enum { WK_AHEAD_OFF, WK_AHEAD_SYNC, WK_AHEAD_QUEUE } wk_ahead_mode_t;
wk_ahead_mode_t wk_ahead_mode(bool step_greedy, bool queue, uint32_t setting);

/* The row of a plan whose token the engine may take itself (engine_ops.step_greedy): sampled, no
 * penalties, no logprobs, no logits returned; greedy and unconstrained unless dev (the engine
 * samples: engine_ops.dev_sample). */
bool wk_ahead_device_row(const wire_seq *s, bool dev);

/* The row of a plan that may run ahead: one token at a known position, a token sampled (on the
 * device or on the host), no logits returned. */
bool wk_ahead_row(const wire_seq *s);

/* Whether the step after plan p could run ahead with host rows: every row a wk_ahead_row, one or
 * more of them sampled on the host (not a wk_ahead_device_row), not every row `last`. Then rank 0
 * tells the other ranks its tokens first. */
bool wk_ahead_wants_host(const wire_step_plan *p, bool dev);

/* out[i] of a host row that ran: its logits are in lrow[i] (wk_ahead_match: hit[i]) */
#define WK_AHEAD_LOGITS (-2)

/* Builds the step that follows plan p, whose row i took token tok[i] (on the device or sampled
 * on the host; -1: it did not; tok NULL: not known yet, wk_ahead_set_tokens gives them): returns
 * false (and holds no step) unless every row of p is a wk_ahead_row with a token, and (with tok
 * NULL, or host false) a wk_ahead_device_row, and one or more of them not `last` (a plan of rows
 * that all end their requests is followed by none of them: the device would only delay the next
 * prompt). A row that is `last` beside others runs ahead with them, unused. The rows keep p's
 * sampling settings, but not its constraint setup (p did it). Replaces any step held before. */
bool wk_ahead_build(wk_ahead *a, const wire_step_plan *p, const int32_t *tok, bool host);

/* The logits rows the step held writes (n_vocab floats each, owned by a, valid until the next
 * call): rows[i] := lrow[i] (the engine takes the token of a row that is not host[i] itself). */
void wk_ahead_logits(wk_ahead *a, uint32_t n_vocab, float **rows);
void wk_ahead_set_tokens(wk_ahead *a, const int32_t *tok);

/* Whether plan p asks for exactly the step held, row for row in its order (the rows' tokens
 * taken or not yet): then a step built from p can take its tokens on the device. */
bool wk_ahead_covers(const wk_ahead *a, const wire_step_plan *p);

/* The step ahead has run: its row i took out[i] (out NULL: it failed, nothing is kept); a host
 * row's logits are in its lrow. */
void wk_ahead_done(wk_ahead *a, const int32_t *out);

/* Forgets the rows of sequence id (freed, or its cache refilled), or every row. */
void wk_ahead_drop(wk_ahead *a, uint64_t id);
void wk_ahead_clear(wk_ahead *a);

/* Matches plan p against the step ahead: hit[i] = the token row i takes from it, WK_AHEAD_LOGITS
 * (a host row: lhit[i] = its logits row, one of a's until the next wk_ahead_logits), or -1; the
 * rows with -1 go, in order, into *rest (rest_idx[k] = their index in p; rest_idx holds
 * p->n_seqs). Every row of the step ahead is used at most once; the step ahead is then cleared.
 * Returns the number of rows hit. */
uint32_t wk_ahead_match(wk_ahead *a, const wire_step_plan *p, int32_t *hit, float **lhit, wire_step_plan *rest,
                        uint32_t *rest_idx);

#endif
