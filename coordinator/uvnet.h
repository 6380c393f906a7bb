/* uvnet: TCP plumbing shared by the HTTP server (http_server.c) and the gRPC API server
 * (grpc_server.c) on the libuv loop. No ownership: the caller owns the handles and buffers. */
#ifndef UVNET_H
#define UVNET_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "common/mla_err.h"

/* Binds an initialised listener to host (IPv4 or IPv6 literal; NULL: 127.0.0.1) and port (0: any
 * free port) and listens; *bound_port (may be NULL) gets the port actually bound. MLA_ERR names
 * the address and the reason. */
int uvnet_listen(uv_tcp_t *listener, const char *host, int port, uv_connection_cb on_connection,
                 int *bound_port, mla_err *err);

/* Whether uvnet_listen takes host as an address: an IPv4 or IPv6 literal (no brackets), or
 * localhost (127.0.0.1). */
bool uvnet_host_ok(const char *host);

/* "host:port" into out, an IPv6 address in brackets as URLs write it ("[::1]:8000"). */
void uvnet_addr_text(char *out, size_t n, const char *host, int port);

/* The address of a connected peer as uvnet_addr_text writes it, or "?" when unknown. */
void uvnet_peer_name(uv_tcp_t *tcp, char *out, size_t n);

#endif
