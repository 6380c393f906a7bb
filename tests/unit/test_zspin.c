/* zspin (proto/zspin.h): the spin length from --spin-us and the backend, and zspin_poll's
 * answers (no timing is asserted): nothing pending after a spin and a zero timeout, a message
 * already pending, a message sent by another thread during the spin, a message sent after the
 * spin while the poll blocks. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

#include "mla_test.h"
#include "zspin.h"

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

typedef struct {
    void *sock;
    long delay_us;
} sender;

static void *send_later(void *arg) {
    sender *s = arg;
    sleep_us(s->delay_us);
    zmq_send(s->sock, "m", 1, 0);
    return NULL;
}

static int drain(void *sock) {
    char b[4];
    return zmq_recv(sock, b, sizeof b, ZMQ_DONTWAIT);
}

int main(void) {
    /* the spin length */
    /* the spin length: --spin-us when given (>= 0), else the backend's */
    CHECK(zspin_default("cuda", -1) == 2000);
    CHECK(zspin_default("cpu", -1) == 0);
    CHECK(zspin_default(NULL, -1) == 0);
    CHECK(zspin_default("cuda", 0) == 0);
    CHECK(zspin_default("cpu", 500) == 500);

    /* the poll */
    void *ctx = zmq_ctx_new();
    void *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    REQUIRE(zmq_bind(a, "inproc://zspin-test") == 0 && zmq_connect(b, "inproc://zspin-test") == 0);
    zmq_pollitem_t it = {a, 0, ZMQ_POLLIN, 0};
    CHECK(zspin_poll(&it, 1, 0, 0) == 0);    /* nothing, no spin */
    CHECK(zspin_poll(&it, 1, 0, 2000) == 0); /* nothing after 2 ms of spinning */
    CHECK(!(it.revents & ZMQ_POLLIN));
    zmq_send(b, "m", 1, 0);
    it.revents = 0;
    CHECK(zspin_poll(&it, 1, 0, 2000) == 1 && (it.revents & ZMQ_POLLIN)); /* already pending */
    CHECK(drain(a) == 1);
    /* sent during the spin window (100 us into a 1 s spin) */
    sender s = {b, 100};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, send_later, &s) == 0);
    it.revents = 0;
    CHECK(zspin_poll(&it, 1, -1, 1000000) == 1 && (it.revents & ZMQ_POLLIN));
    pthread_join(th, NULL);
    CHECK(drain(a) == 1);
    /* sent after a short spin: the blocking poll takes it */
    s.delay_us = 20000;
    REQUIRE(pthread_create(&th, NULL, send_later, &s) == 0);
    it.revents = 0;
    CHECK(zspin_poll(&it, 1, -1, 10) == 1 && (it.revents & ZMQ_POLLIN));
    pthread_join(th, NULL);
    CHECK(drain(a) == 1);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    return mla_test_finish();
}
