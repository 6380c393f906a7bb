#include "uvnet.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

static int sockaddr_port(const struct sockaddr_storage *sa) {
    return sa->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)sa)->sin6_port)
                                     : ntohs(((const struct sockaddr_in *)sa)->sin_port);
}

/* the address host names: NULL and localhost (the name every user types) are IPv4 loopback */
static const char *host_literal(const char *host) {
    return !host || !strcmp(host, "localhost") ? "127.0.0.1" : host;
}

/* host (a literal) and port as a socket address; MLA_ERR when host is no address */
static int host_addr(const char *host, int port, struct sockaddr_storage *sa) {
    return uv_ip4_addr(host, port, (struct sockaddr_in *)sa) == 0 || uv_ip6_addr(host, port, (struct sockaddr_in6 *)sa) == 0
               ? MLA_OK
               : MLA_ERR;
}

bool uvnet_host_ok(const char *host) {
    struct sockaddr_storage sa;
    return host_addr(host_literal(host), 0, &sa) == MLA_OK;
}

void uvnet_addr_text(char *out, size_t n, const char *host, int port) {
    const bool v6 = strchr(host, ':') != NULL;
    snprintf(out, n, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

int uvnet_listen(uv_tcp_t *listener, const char *host, int port, uv_connection_cb on_connection,
                 int *bound_port, mla_err *err) {
    struct sockaddr_storage sa;
    host = host_literal(host);
    if (port < 0 || port > 65535) return mla_errf(err, "port %d is out of range", port);
    if (host_addr(host, port, &sa)) return mla_errf(err, "'%s' is not an IPv4 or IPv6 address", host);
    int rc = uv_tcp_bind(listener, (const struct sockaddr *)&sa, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)listener, 511, on_connection);
    if (rc < 0) return mla_errf(err, "cannot listen on %s:%d: %s", host, port, uv_strerror(rc));
    if (bound_port) {
        struct sockaddr_storage got;
        int len = sizeof got;
        *bound_port = uv_tcp_getsockname(listener, (struct sockaddr *)&got, &len) == 0 ? sockaddr_port(&got) : port;
    }
    return MLA_OK;
}

void uvnet_peer_name(uv_tcp_t *tcp, char *out, size_t n) {
    struct sockaddr_storage sa;
    int salen = sizeof sa;
    snprintf(out, n, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&sa, &salen) != 0) return;
    char ip[48] = "?";
    if (sa.ss_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)&sa, ip, sizeof ip);
    else if (sa.ss_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)&sa, ip, sizeof ip);
    uvnet_addr_text(out, n, ip, sockaddr_port(&sa));
}
