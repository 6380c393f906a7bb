/* wk_boot: the engine_boot hooks (worker/engine.h) of a worker: the NCCL unique id published by
 * rank 0 and relayed by the coordinator to the other ranks. */
#include "wk_internal.h"

#include <stdlib.h>
#include <string.h>

#include "zspin.h"

/* ---- engine_boot (worker/engine.h): the NCCL id through the coordinator ---------------------- */

int wk_boot_publish(void *ctx, const uint8_t *id, size_t len, mla_err *err) {
    wk_boot *b = ctx;
    if (len != WIRE_MAX_NCCL_ID) return mla_errf(err, "an NCCL id of %zu bytes (need %u)", len, (unsigned)WIRE_MAX_NCCL_ID);
    if (b->w->cfg->rank != 0) return mla_errf(err, "rank %d cannot publish the NCCL id (rank 0 does)", b->w->cfg->rank);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = WIRE_CTL_NCCL_ID;
    m.u.ctl.rank = 0;
    memcpy(m.u.ctl.nccl_id, id, len);
    m.u.ctl.nccl_id_len = (uint32_t)len;
    return wk_send_msg(b->pair, &m, err); /* the I/O thread forwards it to the coordinator */
}

int wk_boot_wait(void *ctx, uint8_t *id, size_t len, mla_err *err) {
    wk *w = ((wk_boot *)ctx)->w;
    if (len != WIRE_MAX_NCCL_ID) return mla_errf(err, "an NCCL id of %zu bytes (need %u)", len, (unsigned)WIRE_MAX_NCCL_ID);
    long timeout_ms = w->wo.nccl_id_timeout_ms ? (long)w->wo.nccl_id_timeout_ms : 120000; /* --nccl-id-timeout-ms */
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&w->id_mu);
    while (!w->id_known && !w->id_quit && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->id_cv, &w->id_mu, &dl);
    int known = w->id_known, quit = w->id_quit;
    if (known) memcpy(id, w->nccl_id, len);
    pthread_mutex_unlock(&w->id_mu);
    if (known) return MLA_OK;
    if (quit) return mla_errf(err, "the worker is stopping while it waits for rank 0's NCCL id");
    return mla_errf(err, "no NCCL id from rank 0 through the coordinator within %ld ms (rank 0 not started, "
                         "failed, or not using NCCL? the coordinator's --nccl-id-timeout-ms sets the wait)", timeout_ms);
}
