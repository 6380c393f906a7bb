/* wk_link: a worker's registration with the coordinator (worker/wk_run.h): the DEALER's CURVE
 * keys, the socket monitor's handshake failures, and the Register / RegisterReply exchange. */
#include "wk_internal.h"
#include "curve.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mla_log.h"
#include "zspin.h"

/* ---- I/O thread --------------------------------------------------------------------------- */

/* Makes the DEALER a CURVE client with the keys from cfg. */
int wk_setup_curve(const wk_config *cfg, void *dealer, mla_err *err) {
    if (!zmq_has("curve")) return mla_errf(err, "--curve-dir: this libzmq was built without CURVE support");
    char path[PATH_MAX + 32], server_pub[41], secret[41], pub[41];
    snprintf(path, sizeof path, "%s/server.pub", cfg->curve_dir);
    if (curve_read_z85_key(path, server_pub, err)) return MLA_ERR;
    if (cfg->curve_client_key) snprintf(path, sizeof path, "%s", cfg->curve_client_key);
    else snprintf(path, sizeof path, "%s/client.key", cfg->curve_dir);
    if (curve_check_mode(path, 077, err) || curve_read_z85_key(path, secret, err)) return MLA_ERR;
    if (zmq_curve_public(pub, secret) != 0) return mla_errf(err, "%s: cannot derive the public key", path);
    if (zmq_setsockopt(dealer, ZMQ_CURVE_SERVERKEY, server_pub, 40) ||
        zmq_setsockopt(dealer, ZMQ_CURVE_PUBLICKEY, pub, 40) || zmq_setsockopt(dealer, ZMQ_CURVE_SECRETKEY, secret, 40))
        return mla_errf(err, "CURVE setup: %s", zmq_strerror(zmq_errno()));
    memset(secret, 0, sizeof secret);
    return MLA_OK;
}

/* A handshake failure reported by the socket monitor: MLA_OK when none (or one that may pass),
 * WK_REFUSED when the coordinator refused our key, MLA_ERR on repeated protocol failures. */
static int check_monitor(void *mon, int *n_proto, mla_err *err) {
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    zmq_msg_init(&b);
    int rc = MLA_OK;
    if (zmq_msg_recv(&a, mon, ZMQ_DONTWAIT) < 0) goto out;
    if (zmq_msg_more(&a)) zmq_msg_recv(&b, mon, 0);
    if (zmq_msg_size(&a) < 6) goto out;
    uint16_t ev;
    uint32_t val;
    memcpy(&ev, zmq_msg_data(&a), 2);
    memcpy(&val, (const uint8_t *)zmq_msg_data(&a) + 2, 4);
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        mla_errf(err, "the coordinator refused this worker's CURVE key (ZAP status %u): is its public key in the "
                      "coordinator's authorized_keys?", val);
        rc = WK_REFUSED;
    } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        *n_proto = -1000000; /* connected: later drops are the heartbeat's business */
    } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        /* libzmq does not reconnect after a protocol error (a mechanism mismatch, a CURVE message
         * that does not decrypt): waiting would only run into the registration timeout */
        mla_errf(err, "the security handshake with the coordinator failed: %s (ZMTP protocol error 0x%x)",
                 val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                     ? "one side uses CURVE and the other does not"
                     : "wrong server.pub, or one side uses CURVE and the other does not",
                 val);
        rc = WK_REFUSED;
    } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ev == ZMQ_EVENT_DISCONNECTED) {
        /* the peer closed the connection during the handshake (a CURVE server dropping a plain
         * client, or the other way round): libzmq reconnects, so count the attempts */
        if (ev != ZMQ_EVENT_DISCONNECTED) MLA_WARN("handshake with the coordinator failed (event 0x%x, %u)", ev, val);
        if (++*n_proto >= 3) {
            mla_errf(err, "the security handshake with the coordinator failed %d times (wrong server.pub, or one side "
                          "uses CURVE and the other does not)", *n_proto);
            rc = WK_REFUSED;
        }
    }
out:
    zmq_msg_close(&a);
    zmq_msg_close(&b);
    return rc;
}

/* Sends the encoded Register (buf, n) and waits for the reply, watching the monitor, until
 * deadline. The send does not block: when a handshake fails (a refused key, a mechanism
 * mismatch) before the message left, libzmq drops the connection's pipe, and a blocking send on
 * a DEALER without a pipe would wait for ever, past the deadline and the monitor's report. */
static int register_exchange(const wk_config *cfg, void *dealer, void *mon, const uint8_t *buf, size_t n,
                             int64_t deadline, wire_register_reply *reply, mla_err *err) {
    int n_proto = 0;
    bool sent = false;
    const int64_t t0 = wk_now_ms();
    int64_t note = t0 + 10000; /* a line every 10 s while nothing answers */
    for (;;) {
        if (wk_now_ms() >= note) {
            MLA_WARN("no answer from the coordinator at %s after %lld s (giving up after %lld s)", cfg->coord_endpoint,
                     (long long)((wk_now_ms() - t0) / 1000), (long long)((deadline - t0) / 1000));
            note += 10000;
        }
        if (!sent) {
            if (zmq_send(dealer, buf, n, ZMQ_DONTWAIT) >= 0) sent = true;
            else if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
                return mla_errf(err, "zmq send: %s", zmq_strerror(zmq_errno()));
        }
        int64_t left = deadline - wk_now_ms();
        if (left <= 0)
            return mla_errf(err, sent ? "no answer from the coordinator at %s to the registration"
                                      : "no connection to the coordinator at %s to send the registration over",
                            cfg->coord_endpoint);
        const int64_t to_note = note - wk_now_ms();
        /* unsent: wait for room to send (a pipe), else for the reply */
        zmq_pollitem_t it[2] = {{dealer, 0, (short)(sent ? ZMQ_POLLIN : ZMQ_POLLOUT), 0}, {mon, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(it, mon ? 2 : 1, (long)(to_note > 0 && to_note < left ? to_note : left > 0 ? left : 1));
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return mla_errf(err, "zmq poll: %s", zmq_strerror(zmq_errno()));
        }
        if (rc == 0) continue;
        if (mon && (it[1].revents & ZMQ_POLLIN)) {
            int mrc = check_monitor(mon, &n_proto, err);
            if (mrc) return mrc;
        }
        if (!sent || !(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t zm;
        zmq_msg_init(&zm);
        if (zmq_msg_recv(&zm, dealer, 0) < 0) {
            zmq_msg_close(&zm);
            continue;
        }
        wire_msg in;
        mla_err e2;
        int drc = wire_decode(zmq_msg_data(&zm), zmq_msg_size(&zm), NULL, &in, &e2);
        zmq_msg_close(&zm);
        if (drc) {
            MLA_WARN("dropping a malformed frame from the coordinator: %s", e2.msg);
            continue;
        }
        if (in.kind != WIRE_REGISTER_REPLY) {
            wire_msg_free(&in);
            continue;
        }
        *reply = in.u.reply;
        if (!reply->ok) {
            mla_errf(err, "registration refused by the coordinator: %s", reply->reason);
            return WK_REFUSED;
        }
        return MLA_OK;
    }
}

int wk_do_register(const wk_config *cfg, void *dealer, void *mon, wire_register_reply *reply, mla_err *err) {
    uint64_t hash = 0;
    if (cfg->engine->model_hash(cfg->model_path, &hash, err))
        return mla_err_prefix(err, "model %s", cfg->model_path);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER;
    m.u.reg.rank = (uint32_t)cfg->rank;
    m.u.reg.world = (uint32_t)cfg->world;
    m.u.reg.protocol_version = cfg->protocol_version ? cfg->protocol_version : WIRE_VERSION;
    m.u.reg.model_hash = hash;
    m.u.reg.pid = (int32_t)getpid();
    if (gethostname(m.u.reg.host, sizeof m.u.reg.host - 1) != 0) strcpy(m.u.reg.host, "?");
    for (char *p = m.u.reg.host; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
    snprintf(m.u.reg.device, sizeof m.u.reg.device, "%s", cfg->device ? cfg->device : "cpu");
    uint8_t *buf;
    size_t n;
    if (wire_encode(&m, &buf, &n, err)) return MLA_ERR;
    const int timeout_ms = cfg->register_timeout_ms > 0 ? cfg->register_timeout_ms : 60000;
    int64_t deadline = wk_now_ms() + timeout_ms;
    MLA_DEBUG("registering with the coordinator at %s as rank %d of %d (up to %d s)", cfg->coord_endpoint, cfg->rank,
              cfg->world, timeout_ms / 1000);
    int rc = register_exchange(cfg, dealer, mon, buf, n, deadline, reply, err);
    free(buf);
    return rc;
}
