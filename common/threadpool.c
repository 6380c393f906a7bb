#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "mla_err.h"

struct threadpool {
    int n;                 /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;          /* incremented per run */
    int busy;              /* workers still inside the current run */
    bool quit;
    /* current run */
    threadpool_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next;
};

static void drain(threadpool *p) {
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks) break;
        p->fn(p->ctx, i);
    }
}

static void *worker(void *arg) {
    threadpool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->cv_go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

threadpool *threadpool_new(int n_threads) {
    threadpool *p = mla_xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_go, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->next, 0);
    p->th = mla_xcalloc((size_t)p->n, sizeof *p->th);
    for (int i = 1; i < p->n; i++)
        if (pthread_create(&p->th[i], NULL, worker, p)) MLA_PANIC("pthread_create failed");
    return p;
}

void threadpool_free(threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_go);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p);
}

int threadpool_size(const threadpool *p) { return p ? p->n : 1; }

void threadpool_run(threadpool *p, int64_t n, threadpool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
