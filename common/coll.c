#include "coll.h"

#include <stdlib.h>
#include <string.h>

static int single_allreduce(coll *c, float *buf, size_t n, mla_err *err) {
    (void)c, (void)buf, (void)n, (void)err;
    return MLA_OK;
}

static int single_allgather(coll *c, const float *in, float *out, size_t n, mla_err *err) {
    (void)c, (void)err;
    if (out != in) memmove(out, in, n * sizeof *in);
    return MLA_OK;
}

static int single_broadcast(coll *c, void *buf, size_t nbytes, int root, mla_err *err) {
    (void)c, (void)buf, (void)nbytes, (void)err;
    MLA_ASSERT(root == 0);
    return MLA_OK;
}

static void single_destroy(coll *c) { (void)c; }

static const coll_ops k_single_ops = {single_allreduce, single_allgather, single_broadcast,
                                      single_destroy};

coll *coll_single_new(void) {
    coll *c = mla_xcalloc(1, sizeof *c);
    c->ops = &k_single_ops;
    c->rank = 0;
    c->world = 1;
    return c;
}

void coll_free(coll *c) {
    if (!c) return;
    c->ops->destroy(c);
    free(c);
}
