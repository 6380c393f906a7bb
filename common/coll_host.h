/* coll_host: the shared-memory collective (common/coll.h) for ranks that live on one host.
 *
 * One POSIX shared-memory segment per group. The owner (the coordinator, or a test) creates it
 * with coll_host_seg_create() under a unique name and hands that name to the ranks, which attach
 * with coll_host_attach(). The segment holds a header (barrier words, an abort flag and message)
 * and two sets of T slots of `chunk_bytes` each. Every operation moves data chunk by chunk: each
 * rank writes its chunk into its slot of the current set, all ranks meet at a barrier, then every
 * rank reads what it needs. Sets alternate, so one barrier per chunk suffices (a set is written
 * again only after the next barrier, which every rank reaches after it finished reading).
 *
 * All-reduce: every rank sums slots 0..T-1 in that fixed order, so every rank gets the same bits.
 *
 * Failure: a barrier wait that exceeds the timeout, or a set abort flag (by the owner through
 * coll_host_seg_abort(), or by any rank that timed out), makes the operation return MLA_ERR with a
 * message. After that the group is dead: every later operation fails at once.
 *
 * Ownership: coll_host_seg_create() returns a segment owned by the caller; coll_host_seg_free()
 * unmaps it and unlinks the name. coll_host_attach() returns a coll released with coll_free(),
 * which unmaps (never unlinks). */
#ifndef COLL_HOST_H
#define COLL_HOST_H

#include <stddef.h>

#include <stdint.h>

#include "coll.h"
#include "mla_err.h"

#define COLL_HOST_DEFAULT_CHUNK_BYTES ((size_t)1 << 20)
#define COLL_HOST_DEFAULT_TIMEOUT_MS 30000
#define COLL_HOST_MAX_WORLD 64
#define COLL_HOST_NAME_MAX 64

typedef struct coll_host_seg coll_host_seg;

/* Writes a fresh name "/mla-coll-<pid>-<counter>-<random>" into buf (at least COLL_HOST_NAME_MAX). */
void coll_host_make_name(char *buf, size_t n);

/* Creates (exclusively) and initialises the segment `name` for `world` ranks. chunk_bytes 0 means
 * the default; it is rounded up to a multiple of 64. */
int coll_host_seg_create(coll_host_seg **out, const char *name, int world, size_t chunk_bytes,
                         mla_err *err);
const char *coll_host_seg_name(const coll_host_seg *s);
/* Sets the abort flag with a reason (the first reason wins) and wakes every waiting rank. */
void coll_host_seg_abort(coll_host_seg *s, const char *why);
/* Removes the name (the mapping stays valid): call it once every rank has attached, so that
 * nothing is left in /dev/shm even if the owner is killed later. */
void coll_host_seg_unlink(coll_host_seg *s);
/* Unmaps and unlinks (if not done yet). NULL is fine. */
void coll_host_seg_free(coll_host_seg *s);

/* Attaches rank `rank` of `world` to the segment `name`. timeout_ms <= 0 means the default
 * (30 s; the coordinator sends its --coll-timeout-ms). */
int coll_host_attach(coll **out, const char *name, int rank, int world, int timeout_ms,
                     mla_err *err);
/* Sets the abort flag of the segment a rank is attached to (coll made by coll_host_attach). */
void coll_host_abort(coll *c, const char *why);
/* The all-reduces of this process on host collectives so far, and their total time (waiting for
 * the other ranks included). Thread-safe. */
void coll_host_stats(uint64_t *n_allreduce, double *seconds);

#endif
