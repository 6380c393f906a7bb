/* http_req: incremental HTTP/1.1 request parsing (http-parser) with limits, no I/O.
 *
 * Fed raw bytes, it collects one request at a time: method, path, query, the headers the server
 * needs, the body. Limits: URL length (414), header bytes and count (431), body size (413, also
 * decided from Content-Length before the body arrives); malformed input gives 400. Used by
 * http_server and by the fuzz target (tests/fuzz/fuzz_http.c).
 *
 * Ownership: the caller owns the struct (init/free); request strings point into it and stay
 * valid until http_req_next or http_req_free. */
#ifndef HTTP_REQ_H
#define HTTP_REQ_H

#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct http_limits {
    size_t max_url;          /* bytes, 414 beyond */
    size_t max_header_bytes; /* all header names + values, 431 beyond */
    int max_headers;         /* 431 beyond */
    size_t max_body;         /* 413 beyond */
} http_limits;

/* Defaults: url 8 KiB, headers 16 KiB / 64, body 4 MiB. */
void http_limits_default(http_limits *l);

enum http_req_state {
    HTTP_REQ_MORE = 0,   /* needs more bytes */
    HTTP_REQ_DONE = 1,   /* a complete request is in .req */
    HTTP_REQ_ERROR = 2,  /* bad request: .err_status (400/413/414/431/505) and .err_msg */
};

typedef struct http_request {
    const char *method;        /* "GET", "POST", ... */
    int method_id;             /* enum http_method */
    const char *path;          /* without the query, percent-encoding kept */
    const char *query;         /* after '?', "" when none */
    const char *authorization; /* NULL when absent */
    const char *content_type;  /* NULL when absent */
    const char *origin;        /* Origin (CORS), NULL when absent */
    const char *ac_request_headers; /* Access-Control-Request-Headers (a preflight), NULL when absent */
    const char *body;          /* NUL-terminated (the NUL is not counted) */
    size_t body_len;
    bool keep_alive;
    bool expect_continue;
    int http_major, http_minor;
} http_request;

/* What is known of a request once its headers are complete (http_req_head). */
typedef struct http_head {
    const char *method;        /* "GET", "POST", ... */
    int method_id;             /* enum http_method */
    const char *url;           /* path and query as sent */
    const char *authorization; /* NULL when absent */
    const char *origin;        /* NULL when absent */
} http_head;

typedef struct http_req {
    http_parser parser;
    http_parser_settings settings;
    http_limits lim;
    enum http_req_state state;
    int err_status;
    char err_msg[160];
    bool started;        /* some bytes of the current request were seen */
    bool headers_done;
    http_request req;
    /* storage */
    char *url;
    size_t url_len, url_cap;
    char *path_buf;      /* path\0query\0 */
    char *hname, *hval;  /* current header */
    size_t hname_len, hval_len, hname_cap, hval_cap;
    bool in_value;
    const char *feed;    /* the bytes of the current http_req_feed */
    size_t fed;          /* bytes consumed by the feeds before it */
    size_t val_end;      /* where the current value's last piece ended, counted as fed */
    bool te_other;       /* a Transfer-Encoding other than chunked alone was given */
    bool expect_other;   /* an Expect other than 100-continue */
    bool ce_other;       /* a Content-Encoding other than identity */
    int n_host;          /* Host header fields seen */
    int n_te, n_auth, n_xkey; /* Transfer-Encoding, Authorization, x-api-key header fields seen */
    size_t header_bytes;
    int n_headers;
    char *auth, *ctype, *origin, *acrh;
    char *xkey; /* an x-api-key's key as "Bearer <key>" until the head ends (then auth where it had none) */
    char *body;
    size_t body_len, body_cap;
} http_req;

void http_req_init(http_req *p, const http_limits *lim);
void http_req_free(http_req *p);
/* Feeds bytes; returns how many were consumed (stops right after a complete request, so the
 * rest belongs to the next one). Check p->state afterwards. */
size_t http_req_feed(http_req *p, const char *data, size_t len);
/* The current request's method, URL and Authorization header (valid once headers_done, until
 * the next feed, http_req_next or http_req_free). */
void http_req_head(const http_req *p, http_head *h);
/* Forgets the current request and gets ready for the next on the same connection. */
void http_req_next(http_req *p);

#endif
