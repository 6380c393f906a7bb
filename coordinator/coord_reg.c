/* coord_reg: who may join a worker group (coordinator/coord.h): the registration of each worker
 * (version, model, world and rank checked; the NCCL id relayed), the group's readiness, and the
 * CURVE security of the control plane (keys, the ZAP handler). Runs on the I/O thread. */
#include "coord_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mla_log.h"

int coord_find_rank(coord *c, const void *ident, size_t n) {
    for (int r = 0; r < c->cfg.world; r++)
        if (c->ranks[r].registered && c->ranks[r].ident_len == n && !memcmp(c->ranks[r].ident, ident, n))
            return r;
    return -1;
}

static void refuse(coord *c, const void *ident, size_t ilen, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refuse(coord *c, const void *ident, size_t ilen, int rank, const char *fmt, ...) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER_REPLY;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.u.reply.reason, sizeof m.u.reply.reason, fmt, ap);
    va_end(ap);
    MLA_WARN("refusing worker (rank %d): %s", rank, m.u.reply.reason);
    if (rank >= 0 && rank < c->cfg.world && !c->ranks[rank].refusal[0])
        snprintf(c->ranks[rank].refusal, sizeof c->ranks[rank].refusal, "%s", m.u.reply.reason);
    coord_send_frame_to_ident(c, ident, ilen, &m);
}

/* Relays the NCCL unique id published by rank 0 to rank r (a Control NCCL_ID frame, rank 0). */
void coord_send_nccl_id(coord *c, int r) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = WIRE_CTL_NCCL_ID;
    m.u.ctl.rank = 0;
    memcpy(m.u.ctl.nccl_id, c->nccl_id, WIRE_MAX_NCCL_ID);
    m.u.ctl.nccl_id_len = WIRE_MAX_NCCL_ID;
    uint8_t *buf;
    size_t n;
    mla_err err;
    if (wire_encode(&m, &buf, &n, &err)) MLA_PANIC("%s", err.msg);
    coord_send_to_rank(c, r, buf, n);
    free(buf);
}

void coord_handle_register(coord *c, const void *ident, size_t ilen, const wire_register *rg) {
    int r = (int)rg->rank;
    int st;
    pthread_mutex_lock(&c->mu);
    st = c->state;
    pthread_mutex_unlock(&c->mu);
    if (rg->protocol_version != WIRE_VERSION)
        return refuse(c, ident, ilen, r, "protocol version %u, the coordinator speaks version %u",
                      rg->protocol_version, WIRE_VERSION);
    if ((int)rg->world != c->cfg.world)
        return refuse(c, ident, ilen, r, "world size %u, the coordinator runs world size %d",
                      rg->world, c->cfg.world);
    if (rg->model_hash != c->cfg.model_hash)
        return refuse(c, ident, ilen, r,
                      "model hash %016" PRIx64 " differs from the coordinator's %016" PRIx64
                      " (a different model file?)",
                      rg->model_hash, c->cfg.model_hash);
    if (st != ST_STARTING)
        return refuse(c, ident, ilen, r, "the group is not accepting workers (%s)",
                      st == ST_READY ? "already complete" : "it failed or stopped");
    rank_st *rs = &c->ranks[r];
    if (rs->registered)
        return refuse(c, ident, ilen, r, "rank %d is already registered (pid %d)", r, (int)rs->reg_pid);
    if (!c->cfg.external && rs->pid != (pid_t)rg->pid)
        return refuse(c, ident, ilen, r, "rank %d belongs to the local worker pid %d, not pid %d", r,
                      (int)rs->pid, (int)rg->pid);
    if (ilen > sizeof rs->ident) return refuse(c, ident, ilen, r, "routing id too long");
    memcpy(rs->ident, ident, ilen);
    rs->ident_len = ilen;
    rs->registered = 1;
    rs->reg_pid = rg->pid;
    rs->last_rx = coord_now_ms();
    c->start_deadline = rs->last_rx + c->cfg.start_timeout_ms; /* progress: the timeout starts again */
    pthread_mutex_lock(&c->mu);
    snprintf(rs->device, sizeof rs->device, "%s", rg->device);
    pthread_mutex_unlock(&c->mu);
    if (!strncmp(rg->device, "cuda", 4) && !c->cfg.backend && !c->cfg.spin_us_given)
        c->spin_us = zspin_default("cuda", -1); /* the workers chose CUDA themselves */
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER_REPLY;
    m.u.reply.ok = true;
    if (c->seg) snprintf(m.u.reply.coll_shm_name, sizeof m.u.reply.coll_shm_name, "%s", coll_host_seg_name(c->seg));
    m.u.reply.heartbeat_ms = (uint32_t)c->cfg.heartbeat_ms;
    m.u.reply.heartbeat_timeout_ms = (uint32_t)c->cfg.heartbeat_timeout_ms;
    m.u.reply.coll_timeout_ms = (uint32_t)c->cfg.coll_timeout_ms;
    m.u.reply.kv = c->cfg.kv;
    m.u.reply.kv.local_group = !c->cfg.external;
    m.u.reply.wo = (wire_worker_opts){.nccl_id_timeout_ms = (uint32_t)c->cfg.nccl_id_timeout_ms,
                                      .spin_us = c->cfg.spin_us_given ? c->cfg.spin_us : -1,
                                      .step_ahead = (uint32_t)c->cfg.step_ahead,
                                      .nccl = (uint32_t)c->cfg.nccl,
                                      .cuda_precision = (uint32_t)c->cfg.cuda_precision,
                                      .allreduce = (uint32_t)c->cfg.allreduce,
                                      .log_level = mla_log_level_given() ? 1u + (uint32_t)mla_log_level() : 0};
    coord_send_frame_to_ident(c, ident, ilen, &m);
    rs->link_on = rs->link != NULL; /* from here on everything goes over the link */
    MLA_INFO("worker %d registered (pid %d, host %s, device %s%s)", r, (int)rg->pid, rg->host, rg->device,
             rs->link_on ? ", local link" : "");
    /* rank 0 published its NCCL id before this rank registered: it follows the reply */
    if (c->nccl_id_known && r != 0) coord_send_nccl_id(c, r);
}

void coord_check_ready(coord *c) {
    for (int r = 0; r < c->cfg.world; r++)
        if (!c->ranks[r].loaded) return;
    coll_host_seg_unlink(c->seg); /* every rank has attached (LOADED comes after the attach) */
    pthread_mutex_lock(&c->mu);
    if (c->state == ST_STARTING) {
        c->state = ST_READY;
        c->ever_ready = 1;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    MLA_INFO("worker group ready: %d ranks, vocabulary %u, steps of up to %u tokens", c->cfg.world, c->n_vocab,
             c->cfg.kv.max_step_tokens);
    for (int r = 0; r < c->cfg.world; r++)
        MLA_INFO("cache pool of rank %d: %u blocks of %u positions (%.0f positions, %.2f GiB)", r, c->ranks[r].kv_blocks,
                 c->ranks[r].kv_block_size, (double)c->ranks[r].kv_blocks * c->ranks[r].kv_block_size,
                 (double)c->ranks[r].kv_blocks * (double)c->ranks[r].kv_block_bytes / 1073741824.0);
}

/* One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism,
 * credentials. CURVE clients are admitted when their public key is in authorized_keys. */
void coord_handle_zap(coord *c) {
    char parts[7][256];
    size_t len[7];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->zap, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        more = zmq_msg_more(&m);
        if (n < 7) {
            len[n] = zmq_msg_size(&m) < sizeof parts[n] - 1 ? zmq_msg_size(&m) : sizeof parts[n] - 1;
            memcpy(parts[n], zmq_msg_data(&m), len[n]);
            parts[n][len[n]] = '\0';
        }
        n++;
        zmq_msg_close(&m);
    }
    const char *status = "400", *text = "malformed ZAP request";
    if (n >= 7 && len[5] == 5 && !memcmp(parts[5], "CURVE", 5) && len[6] == 32) {
        int ok = 0;
        for (int k = 0; k < c->n_allowed && !ok; k++) ok = !memcmp(c->allowed[k], parts[6], 32);
        if (ok) {
            status = "200";
            text = "OK";
        } else {
            text = "client key not authorized";
            char z[41] = "?";
            zmq_z85_encode(z, (const uint8_t *)parts[6], 32);
            unsigned k = c->zap_refusals++;
            if (k < 5 || k % 100 == 0)
                MLA_WARN("refusing a control-plane connection from %s: its CURVE key %s is not in authorized_keys "
                         "(%u refusals so far)", parts[3], z, k + 1);
        }
    } else if (n >= 6) {
        text = "mechanism not allowed";
        MLA_WARN("refusing a control-plane connection from %s: mechanism %s (CURVE required)", parts[3], parts[5]);
    }
    const char *rid = n >= 2 ? parts[1] : "";
    size_t rlen = n >= 2 ? len[1] : 0;
    zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(c->zap, rid, rlen, ZMQ_SNDMORE);
    zmq_send(c->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(c->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, 0);
}

/* ---- security ----------------------------------------------------------------------------- */

int coord_endpoint_bindable(const char *ep, char *out, size_t n, int *ipv6, mla_err *err) {
    *ipv6 = 0;
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) {
        if ((size_t)snprintf(out, n, "%s", ep) >= n) return mla_errf(err, "the endpoint %s is too long", ep);
        return MLA_OK;
    }
    if (strncmp(ep, "tcp://", 6))
        return mla_errf(err, "the control endpoint %s: not tcp://HOST:PORT, ipc://PATH or inproc://NAME", ep);
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h) return mla_errf(err, "the control endpoint %s: no HOST:PORT after tcp://", ep);
    const char *port = colon + 1;
    char *end = NULL;
    const long pv = strtol(port, &end, 10);
    if (strcmp(port, "*") && (!isdigit((unsigned char)port[0]) || *end || pv < 1 || pv > 65535))
        return mla_errf(err, "the control endpoint %s: port '%s' is not 1..65535 (or * for any)", ep, port);
    /* ZeroMQ binds an address or an interface name: localhost is 127.0.0.1; a bracketed host
     * is IPv6, which the socket must be told */
    const size_t hl = (size_t)(colon - h);
    int k;
    if (hl == 9 && !strncmp(h, "localhost", 9)) k = snprintf(out, n, "tcp://127.0.0.1:%s", port);
    else {
        *ipv6 = h[0] == '[';
        k = snprintf(out, n, "%s", ep);
    }
    if (k < 0 || (size_t)k >= n) return mla_errf(err, "the endpoint %s is too long", ep);
    return MLA_OK;
}

int coord_endpoint_is_local(const char *ep) {
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) return 1;
    if (strncmp(ep, "tcp://", 6)) return 0;
    const char *h = ep + 6;
    const char *semi = strchr(h, ';'); /* tcp://src;dst: judge the destination */
    if (semi) h = semi + 1;
    if (!strncmp(h, "127.", 4)) return 1;
    if (!strncmp(h, "localhost:", 10)) return 1;
    if (!strncmp(h, "[::1]:", 6)) return 1;
    return 0;
}

/* Loads server.key and authorized_keys from the curve folder, binds the ZAP handler and makes the
 * ROUTER a CURVE server. */
int coord_setup_curve(coord *c, mla_err *err) {
    if (!zmq_has("curve"))
        return mla_errf(err, "--curve-dir: this libzmq was built without CURVE support (needs libsodium)");
    char path[PATH_MAX + 32], secret[41];
    /* as ssh: a folder or list of keys others may change, a secret others may read, is refused */
    if (curve_check_mode(c->curve_dir, 022, err)) return mla_err_prefix(err, "--curve-dir");
    snprintf(path, sizeof path, "%s/server.key", c->curve_dir);
    if (curve_check_mode(path, 077, err) || curve_read_z85_key(path, secret, err)) return MLA_ERR;
    snprintf(path, sizeof path, "%s/authorized_keys", c->curve_dir);
    if (curve_check_mode(path, 022, err)) return MLA_ERR;
    FILE *f = fopen(path, "r");
    if (!f) return mla_errf(err, "cannot read %s: %s (write it with `mlaserve keygen`)", path, strerror(errno));
    char line[512];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *p = line;
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p || (p[0] == '#' && (!p[1] || isspace((unsigned char)p[1])))) continue; /* Z85 has '#' */
        size_t k = 0;
        while (p[k] && !isspace((unsigned char)p[k])) k++;
        char z[41];
        uint8_t bin[32];
        if (k == 40) {
            memcpy(z, p, 40);
            z[40] = '\0';
        }
        if (k != 40 || !zmq_z85_decode(bin, z)) {
            fclose(f);
            return mla_errf(err, "%s:%d: not a Z85 public key", path, ln);
        }
        c->allowed = mla_xrealloc(c->allowed, (size_t)(c->n_allowed + 1) * sizeof *c->allowed);
        memcpy(c->allowed[c->n_allowed++], bin, 32);
    }
    fclose(f);
    if (c->n_allowed == 0) return mla_errf(err, "%s lists no client key: no worker could join", path);
    c->zap = zmq_socket(c->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
        return mla_errf(err, "cannot bind the ZAP handler: %s", zmq_strerror(zmq_errno()));
    int one = 1;
    if (zmq_setsockopt(c->router, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(c->router, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(c->router, ZMQ_ZAP_DOMAIN, "mlaserve", 8))
        return mla_errf(err, "CURVE setup: %s", zmq_strerror(zmq_errno()));
    memset(secret, 0, sizeof secret);
    MLA_INFO("control plane: CURVE on, %d authorized client key(s) from %s", c->n_allowed, path);
    return MLA_OK;
}
