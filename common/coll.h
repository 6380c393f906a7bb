/* coll: the collective interface every worker uses between tensor-parallel ranks.
 * Implementations: coll_single (world size 1, no-ops; coll.c), the shared-memory host
 * collective for ranks on one host (coll_host.c), and NCCL on GPUs (worker CUDA backend).
 *
 * Ownership: a coll object is created by its implementation's init function and released with
 * coll_free(); buffers passed to the operations belong to the caller. All operations are
 * blocking and must be called by every rank in the same order (as with NCCL).
 * Errors (a peer that died or timed out) return MLA_ERR with a message. */
#ifndef COLL_H
#define COLL_H

#include <stddef.h>

#include "mla_err.h"

typedef struct coll coll;

typedef struct coll_ops {
    /* buf[0..n) := sum over ranks of buf[0..n) (float32). Every rank receives the same bits. */
    int (*allreduce_sum_f32)(coll *c, float *buf, size_t n, mla_err *err);
    /* out[r*n .. (r+1)*n) := in of rank r, for every r (float32). */
    int (*allgather_f32)(coll *c, const float *in, float *out, size_t n, mla_err *err);
    /* buf of rank `root` copied to every rank (bytes). */
    int (*broadcast)(coll *c, void *buf, size_t nbytes, int root, mla_err *err);
    void (*destroy)(coll *c);
} coll_ops;

struct coll {
    const coll_ops *ops;
    int rank;
    int world;
    void *impl; /* implementation state */
};

/* World size 1: every operation is the identity. Never fails. */
coll *coll_single_new(void);
void coll_free(coll *c);

static inline int coll_allreduce_sum_f32(coll *c, float *buf, size_t n, mla_err *err) {
    return c->ops->allreduce_sum_f32(c, buf, n, err);
}
static inline int coll_allgather_f32(coll *c, const float *in, float *out, size_t n, mla_err *err) {
    return c->ops->allgather_f32(c, in, out, n, err);
}
static inline int coll_broadcast(coll *c, void *buf, size_t nbytes, int root, mla_err *err) {
    return c->ops->broadcast(c, buf, nbytes, root, err);
}

#endif
