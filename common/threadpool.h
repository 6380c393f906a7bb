/* threadpool: a small fixed pool of worker threads for data-parallel CPU loops.
 *
 * threadpool_run(p, n, fn, ctx) calls fn(ctx, i) for every i in [0, n) spread over the pool's
 * threads and the calling thread, and returns when all calls are done. Tasks are taken from a
 * shared counter, so fn must not depend on which thread runs it. Not reentrant: one run at a
 * time per pool (fn must not call threadpool_run on the same pool).
 *
 * Ownership: threadpool_new returns a pool owned by the caller, released with threadpool_free
 * (joins the threads). A NULL pool runs everything on the calling thread. */
#ifndef THREADPOOL_H
#define THREADPOOL_H

#include <stdint.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *ctx, int64_t i);

/* n_threads <= 1: no extra threads. */
threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *p);
int threadpool_size(const threadpool *p);
void threadpool_run(threadpool *p, int64_t n, threadpool_fn fn, void *ctx);

#endif
