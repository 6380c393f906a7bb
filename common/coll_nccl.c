/* coll_nccl: see coll_nccl.h. */
#include "coll_nccl.h"

#ifdef MLA_HAVE_NCCL
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_log.h"

/* ---- libnccl.so.2 at run time ---------------------------------------------------------------- */

static struct {
    int state; /* 0 not tried, 1 loaded, -1 failed */
    char why[256];
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort_)(ncclComm_t);
    const char *(*errstr)(ncclResult_t);
    ncclResult_t (*allreduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*allgather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*bcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} L;
static pthread_once_t L_once = PTHREAD_ONCE_INIT;

static void L_load(void) {
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    void *h = NULL;
    for (size_t i = 0; i < 2 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *d = dlerror();
        snprintf(L.why, sizeof L.why, "cannot load libnccl.so.2: %s", d ? d : "?");
        L.state = -1;
        return;
    }
#define SYM(f, n)                                                                    \
    do {                                                                             \
        *(void **)&L.f = dlsym(h, n);                                                \
        if (!L.f) {                                                                  \
            snprintf(L.why, sizeof L.why, "libnccl.so.2 has no %s", n);              \
            L.state = -1;                                                            \
            return;                                                                  \
        }                                                                            \
    } while (0)
    SYM(get_id, "ncclGetUniqueId");
    SYM(init_rank, "ncclCommInitRank");
    SYM(destroy, "ncclCommDestroy");
    SYM(abort_, "ncclCommAbort");
    SYM(errstr, "ncclGetErrorString");
    SYM(allreduce, "ncclAllReduce");
    SYM(allgather, "ncclAllGather");
    SYM(bcast, "ncclBroadcast");
#undef SYM
    L.state = 1;
}

static int L_need(mla_err *err) {
    pthread_once(&L_once, L_load);
    return L.state == 1 ? MLA_OK : mla_errf(err, "NCCL: %s", L.why);
}

bool coll_nccl_available(void) {
    pthread_once(&L_once, L_load);
    return L.state == 1;
}

#define NC(call, what)                                                                          \
    do {                                                                                        \
        ncclResult_t r_ = (call);                                                               \
        if (r_ != ncclSuccess) return mla_errf(err, "NCCL %s: %s", what, L.errstr(r_));         \
    } while (0)
#define CUE(call, what)                                                                         \
    do {                                                                                        \
        cudaError_t c_ = (call);                                                                \
        if (c_ != cudaSuccess) return mla_errf(err, "NCCL %s: %s", what, cudaGetErrorString(c_)); \
    } while (0)

/* ---- the collective ------------------------------------------------------------------------- */

typedef struct nccl_impl {
    ncclComm_t comm;
    int device;
    cudaStream_t ks;      /* communication stream (ours) */
    cudaStream_t cs;      /* compute stream (the caller's), NULL: synchronous */
    cudaEvent_t ev_in, ev_out;
} nccl_impl;

static int pre(nccl_impl *p, mla_err *err) {
    if (p->cs) {
        CUE(cudaEventRecord(p->ev_in, p->cs), "event record");
        CUE(cudaStreamWaitEvent(p->ks, p->ev_in, 0), "stream wait");
    } else {
        CUE(cudaDeviceSynchronize(), "device sync");
    }
    return MLA_OK;
}

static int post(nccl_impl *p, mla_err *err) {
    if (p->cs) {
        CUE(cudaEventRecord(p->ev_out, p->ks), "event record");
        CUE(cudaStreamWaitEvent(p->cs, p->ev_out, 0), "stream wait");
    } else {
        CUE(cudaStreamSynchronize(p->ks), "stream sync");
    }
    return MLA_OK;
}

static int n_allreduce(coll *c, float *buf, size_t n, mla_err *err) {
    nccl_impl *p = c->impl;
    if (pre(p, err)) return MLA_ERR;
    NC(L.allreduce(buf, buf, n, ncclFloat32, ncclSum, p->comm, p->ks), "all-reduce");
    return post(p, err);
}

static int n_allgather(coll *c, const float *in, float *out, size_t n, mla_err *err) {
    nccl_impl *p = c->impl;
    if (pre(p, err)) return MLA_ERR;
    NC(L.allgather(in, out, n, ncclFloat32, p->comm, p->ks), "all-gather");
    return post(p, err);
}

static int n_broadcast(coll *c, void *buf, size_t nbytes, int root, mla_err *err) {
    nccl_impl *p = c->impl;
    if (pre(p, err)) return MLA_ERR;
    NC(L.bcast(buf, buf, nbytes, ncclUint8, root, p->comm, p->ks), "broadcast");
    return post(p, err);
}

static void n_destroy(coll *c) {
    nccl_impl *p = c->impl;
    if (!p) return;
    cudaSetDevice(p->device);
    cudaStreamSynchronize(p->ks);
    if (p->comm) L.destroy(p->comm);
    cudaEventDestroy(p->ev_in);
    cudaEventDestroy(p->ev_out);
    cudaStreamDestroy(p->ks);
    free(p);
    c->impl = NULL;
}

static const coll_ops nccl_ops = {n_allreduce, n_allgather, n_broadcast, n_destroy};

int coll_nccl_make_id(unsigned char id[COLL_NCCL_ID_BYTES], mla_err *err) {
    if (L_need(err)) return MLA_ERR;
    ncclUniqueId u;
    NC(L.get_id(&u), "unique id");
    memcpy(id, u.internal, COLL_NCCL_ID_BYTES);
    return MLA_OK;
}

int coll_nccl_new(coll **out, const unsigned char id[COLL_NCCL_ID_BYTES], int rank, int world, int device,
                  mla_err *err) {
    *out = NULL;
    if (L_need(err)) return MLA_ERR;
    if (world < 1 || rank < 0 || rank >= world) return mla_errf(err, "NCCL: rank %d outside world %d", rank, world);
    CUE(cudaSetDevice(device), "set device");
    nccl_impl *p = mla_xcalloc(1, sizeof *p);
    p->device = device;
    cudaError_t ce = cudaStreamCreateWithFlags(&p->ks, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&p->ev_in, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&p->ev_out, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(p);
        return mla_errf(err, "NCCL: stream/event creation: %s", cudaGetErrorString(ce));
    }
    ncclUniqueId u;
    memcpy(u.internal, id, COLL_NCCL_ID_BYTES);
    ncclResult_t r = L.init_rank(&p->comm, world, u, rank);
    if (r != ncclSuccess) {
        cudaEventDestroy(p->ev_in);
        cudaEventDestroy(p->ev_out);
        cudaStreamDestroy(p->ks);
        free(p);
        return mla_errf(err, "NCCL: joining a communicator of %d ranks as rank %d: %s", world, rank, L.errstr(r));
    }
    coll *c = mla_xcalloc(1, sizeof *c);
    c->ops = &nccl_ops;
    c->rank = rank;
    c->world = world;
    c->impl = p;
    *out = c;
    MLA_INFO("NCCL communicator: rank %d of %d on device %d", rank, world, device);
    return MLA_OK;
}

void coll_nccl_set_stream(coll *c, void *cuda_stream) {
    MLA_ASSERT(c && c->ops == &nccl_ops);
    ((nccl_impl *)c->impl)->cs = (cudaStream_t)cuda_stream;
}

/* value of element i on rank r in the self-test (exact in float32: small integers / 4) */
static float st_val(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 101) - 50) * 0.25f; }

int coll_nccl_selftest(coll *c, mla_err *err) {
    MLA_ASSERT(c && c->ops == &nccl_ops);
    nccl_impl *p = c->impl;
    const size_t n = 4099; /* odd: no size is a multiple of anything convenient */
    const int W = c->world;
    float *h = mla_xmalloc(n * (size_t)W * sizeof *h), *d = NULL, *dg = NULL;
    int rc = MLA_ERR;
    const char *bad = NULL;
    cudaStream_t saved = p->cs;
    p->cs = NULL; /* synchronous here */
    if (cudaSetDevice(p->device) != cudaSuccess || cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess ||
        cudaMalloc((void **)&dg, n * (size_t)W * sizeof *dg) != cudaSuccess) {
        mla_errf(err, "NCCL self-check: device allocation failed");
        goto out;
    }
    /* all-reduce */
    for (size_t i = 0; i < n; i++) h[i] = st_val(c->rank, i);
    if (cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess) goto cuda_fail;
    if (n_allreduce(c, d, n, err)) goto out;
    if (cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
    for (size_t i = 0; i < n && !bad; i++) {
        float want = 0;
        for (int r = 0; r < W; r++) want += st_val(r, i);
        if (h[i] != want) bad = "all-reduce";
    }
    /* all-gather (input: this rank's values) */
    for (size_t i = 0; i < n; i++) h[i] = st_val(c->rank, i);
    if (cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess) goto cuda_fail;
    if (cudaMemset(dg, 0xff, n * (size_t)W * sizeof *dg) != cudaSuccess) goto cuda_fail; /* poison: NaN */
    if (n_allgather(c, d, dg, n, err)) goto out;
    if (cudaMemcpy(h, dg, n * (size_t)W * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
    for (int r = 0; r < W && !bad; r++)
        for (size_t i = 0; i < n && !bad; i++)
            if (h[(size_t)r * n + i] != st_val(r, i)) bad = "all-gather";
    /* broadcast from the last rank */
    for (size_t i = 0; i < n; i++) h[i] = st_val(c->rank, i) + 1000.0f;
    if (cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess) goto cuda_fail;
    if (n_broadcast(c, d, n * sizeof *d, W - 1, err)) goto out;
    if (cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) goto cuda_fail;
    for (size_t i = 0; i < n && !bad; i++)
        if (h[i] != st_val(W - 1, i) + 1000.0f) bad = "broadcast";
    if (bad) mla_errf(err, "NCCL self-check: %s gave a wrong value (world %d)", bad, W);
    else rc = MLA_OK;
    goto out;
cuda_fail:
    mla_errf(err, "NCCL self-check: a CUDA copy failed: %s", cudaGetErrorString(cudaGetLastError()));
out:
    p->cs = saved;
    if (d) cudaFree(d);
    if (dg) cudaFree(dg);
    free(h);
    return rc;
}

#else /* built without NCCL */

bool coll_nccl_available(void) { return false; }
int coll_nccl_make_id(unsigned char id[COLL_NCCL_ID_BYTES], mla_err *err) {
    (void)id;
    return mla_errf(err, "this build has no NCCL support (CUDA off or nccl.h not found)");
}
int coll_nccl_new(coll **out, const unsigned char id[COLL_NCCL_ID_BYTES], int rank, int world, int device,
                  mla_err *err) {
    (void)id, (void)rank, (void)world, (void)device;
    *out = NULL;
    return mla_errf(err, "this build has no NCCL support (CUDA off or nccl.h not found)");
}
void coll_nccl_set_stream(coll *c, void *cuda_stream) { (void)c, (void)cuda_stream; }
int coll_nccl_selftest(coll *c, mla_err *err) {
    (void)c;
    return mla_errf(err, "this build has no NCCL support");
}

#endif
