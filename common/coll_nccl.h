/* coll_nccl: the collective (common/coll.h) through NCCL, one rank per GPU. Buffers passed to its
 * operations are DEVICE pointers. Each operation runs on a dedicated communication stream; it
 * first waits (event) for the work already queued on the compute stream attached with
 * coll_nccl_set_stream(), and the compute stream then waits (event) for the collective, so the
 * call returns without a host synchronisation and later work on the compute stream sees the
 * result. Without a compute stream attached, every operation synchronises the device first and
 * its own stream last (blocking in the host sense).
 *
 * libnccl.so.2 is loaded at run time (dlopen) on the first use, so that binaries built with NCCL
 * support start on machines without it (the CPU backend, the host collective).
 * Built only when CUDA is on and nccl.h was found (MLA_HAVE_NCCL); otherwise every function
 * fails with a message.
 *
 * The unique id: one rank (rank 0) makes it with coll_nccl_make_id() and hands it to the others
 * (through the coordinator: engine_boot in worker/engine.h, Control NCCL_ID in docs/ctrl.md), then
 * every rank calls coll_nccl_new().
 * Ownership: coll_nccl_new() returns a coll released with coll_free() (destroys the communicator,
 * the stream and the events); the attached compute stream stays the caller's. */
#ifndef COLL_NCCL_H
#define COLL_NCCL_H

#include <stdbool.h>

#include "coll.h"
#include "mla_err.h"

#define COLL_NCCL_ID_BYTES 128

/* true when libnccl.so.2 can be loaded (and this build has NCCL support) */
bool coll_nccl_available(void);
/* a fresh unique id (ncclGetUniqueId) */
int coll_nccl_make_id(unsigned char id[COLL_NCCL_ID_BYTES], mla_err *err);
/* joins the communicator of `world` ranks named by id as `rank`, on CUDA device `device` */
int coll_nccl_new(coll **out, const unsigned char id[COLL_NCCL_ID_BYTES], int rank, int world, int device,
                  mla_err *err);
/* orders the operations with this cudaStream_t (NULL: device-synchronous operations) */
void coll_nccl_set_stream(coll *c, void *cuda_stream);
/* known-answer check of all-reduce, all-gather and broadcast on device buffers (every rank calls
 * it; collective); names the operation that gave a wrong value */
int coll_nccl_selftest(coll *c, mla_err *err);

#endif
