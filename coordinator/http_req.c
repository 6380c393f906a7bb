/* http_req: see http_req.h. */
#include "coordinator/http_req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/mla_err.h"

void http_limits_default(http_limits *l) {
    l->max_url = 8192;
    l->max_header_bytes = 16384;
    l->max_headers = 64;
    l->max_body = 4u << 20;
}

static int fail(http_req *p, int status, const char *msg) {
    if (p->state != HTTP_REQ_ERROR) {
        p->state = HTTP_REQ_ERROR;
        p->err_status = status;
        snprintf(p->err_msg, sizeof(p->err_msg), "%s", msg);
    }
    return -1; /* stops http-parser */
}

static bool append(char **buf, size_t *len, size_t *cap, const char *at, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n + 1) nc *= 2;
        *buf = mla_xrealloc(*buf, nc);
        *cap = nc;
    }
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

static http_req *of(http_parser *hp) { return (http_req *)hp->data; }

static int on_message_begin(http_parser *hp) {
    of(hp)->started = true;
    return 0;
}

static int on_url(http_parser *hp, const char *at, size_t n) {
    http_req *p = of(hp);
    p->started = true;
    if (p->url_len + n > p->lim.max_url) { /* its first max_url bytes kept: the path names the error's form */
        append(&p->url, &p->url_len, &p->url_cap, at, p->lim.max_url - p->url_len);
        return fail(p, 414, "the request URL is too long");
    }
    append(&p->url, &p->url_len, &p->url_cap, at, n);
    return 0;
}

static void finish_header(http_req *p) {
    if (!p->hname_len) return;
    /* whitespace around a field value is not part of it (RFC 9110 5.5); the parser drops the leading */
    while (p->hval_len && (p->hval[p->hval_len - 1] == ' ' || p->hval[p->hval_len - 1] == '\t'))
        p->hval[--p->hval_len] = 0;
    if (!strcasecmp(p->hname, "authorization")) {
        p->n_auth++;
        free(p->auth);
        p->auth = mla_xstrdup(p->hval ? p->hval : "");
    } else if (!strcasecmp(p->hname, "x-api-key")) { /* Anthropic's clients send the key so: a bearer key */
        p->n_xkey++;
        free(p->xkey);
        const char *v = p->hval ? p->hval : "";
        const size_t n = strlen(v) + sizeof "Bearer ";
        p->xkey = mla_xmalloc(n);
        snprintf(p->xkey, n, "Bearer %s", v);
    } else if (!strcasecmp(p->hname, "content-type")) {
        free(p->ctype);
        p->ctype = mla_xstrdup(p->hval ? p->hval : "");
    } else if (!strcasecmp(p->hname, "origin")) {
        free(p->origin);
        p->origin = mla_xstrdup(p->hval ? p->hval : "");
    } else if (!strcasecmp(p->hname, "access-control-request-headers")) {
        free(p->acrh);
        p->acrh = mla_xstrdup(p->hval ? p->hval : "");
    } else if (!strcasecmp(p->hname, "host")) {
        p->n_host++;
    } else if (!strcasecmp(p->hname, "expect")) {
        if (p->hval && !strcasecmp(p->hval, "100-continue")) p->req.expect_continue = true;
        else p->expect_other = true;
    } else if (!strcasecmp(p->hname, "content-encoding")) {
        /* a compressed body would be read as JSON */
        if (p->hval && *p->hval && strcasecmp(p->hval, "identity")) p->ce_other = true;
    } else if (!strcasecmp(p->hname, "transfer-encoding")) {
        /* the parser decodes chunked and would take the body of "gzip, chunked" as it is */
        if (!p->hval || strcasecmp(p->hval, "chunked")) p->te_other = true;
        p->n_te++;
    }
    p->hname_len = p->hval_len = 0;
    if (p->hname) p->hname[0] = 0;
    if (p->hval) p->hval[0] = 0;
}

/* a token character (RFC 9110 5.6.2), what a field name is made of */
static bool is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int on_header_field(http_parser *hp, const char *at, size_t n) {
    http_req *p = of(hp);
    /* the parser lets a space through before the colon ("Content-Length : 5") and would honour
     * it: a request a proxy may frame otherwise (RFC 9112 5.1: refuse it) */
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)at[i]))
            return fail(p, 400, "a header field name holds a character outside RFC 9110's tokens");
    if (p->in_value) {
        finish_header(p);
        p->in_value = false;
    }
    if (p->hname_len == 0 && ++p->n_headers > p->lim.max_headers)
        return fail(p, 431, "too many request header fields");
    p->header_bytes += n;
    if (p->header_bytes > p->lim.max_header_bytes) return fail(p, 431, "the request header fields are too large");
    append(&p->hname, &p->hname_len, &p->hname_cap, at, n);
    return 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t n) {
    http_req *p = of(hp);
    /* obs-fold (RFC 9112 5.2: refuse it or read it as a space): a value continued on a line that
     * starts with a space or a tab, which the parser hands on as a further piece of the value. A
     * piece that only a feed's end split off starts at the byte after the piece before it (in the
     * stream); one after a fold starts past the line break. */
    const size_t pos = p->fed + (size_t)(at - p->feed);
    if (p->in_value && pos != p->val_end)
        return fail(p, 400, "a header field value continued on the next line (obs-fold, RFC 9112 5.2)");
    p->val_end = pos + n;
    p->in_value = true;
    p->header_bytes += n;
    if (p->header_bytes > p->lim.max_header_bytes) return fail(p, 431, "the request header fields are too large");
    append(&p->hval, &p->hval_len, &p->hval_cap, at, n);
    return 0;
}

static int on_headers_complete(http_parser *hp) {
    http_req *p = of(hp);
    if (p->in_value) {
        finish_header(p);
        p->in_value = false;
    }
    if (hp->http_major != 1) return fail(p, 505, "only HTTP/1.x is supported");
    if (p->te_other) return fail(p, 501, "Transfer-Encoding: only chunked is supported (no gzip, deflate or compress)");
    /* chunked twice is not a framing (RFC 9112 6.1): a proxy may read the body otherwise */
    if (p->n_te > 1) return fail(p, 400, "more than one Transfer-Encoding header field");
    /* two credentials: which one counts would be the server's guess */
    if (p->n_auth > 1) return fail(p, 400, "more than one Authorization header field");
    if (p->n_xkey > 1) return fail(p, 400, "more than one x-api-key header field");
    /* an x-api-key is the bearer key where no Authorization names one; both may name the same */
    if (p->xkey && p->auth && (strncasecmp(p->auth, "Bearer ", 7) || strcmp(p->auth + 7, p->xkey + 7)))
        return fail(p, 400, "Authorization and x-api-key name different keys");
    if (p->xkey && !p->auth) {
        p->auth = p->xkey;
        p->xkey = NULL;
    }
    /* RFC 9110 10.1.1: an expectation other than 100-continue may be refused with 417 */
    if (p->expect_other) return fail(p, 417, "Expect: only 100-continue is supported");
    if (p->ce_other)
        return fail(p, 415, "Content-Encoding: request bodies are read as they are (no gzip, deflate or br)");
    /* RFC 9112 3.2: an HTTP/1.1 request without a Host field, or any with several, is a 400 */
    if (p->n_host > 1) return fail(p, 400, "more than one Host header field");
    if (hp->http_minor >= 1 && p->n_host == 0) return fail(p, 400, "an HTTP/1.1 request needs a Host header field");
    /* a POST without either carries no body (RFC 9112 6.3): its bytes would be read as the next
     * request */
    if (hp->method == HTTP_POST && !(hp->flags & (F_CONTENTLENGTH | F_CHUNKED)))
        return fail(p, 411, "a POST needs a Content-Length header or chunked Transfer-Encoding");
    /* content_length is ULLONG_MAX when absent */
    if ((hp->flags & F_CONTENTLENGTH) && hp->content_length > p->lim.max_body) {
        char m[160];
        snprintf(m, sizeof(m), "the request body is larger than %zu bytes", p->lim.max_body);
        return fail(p, 413, m);
    }
    p->headers_done = true;
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t n) {
    http_req *p = of(hp);
    if (p->body_len + n > p->lim.max_body) {
        char m[160];
        snprintf(m, sizeof(m), "the request body is larger than %zu bytes", p->lim.max_body);
        return fail(p, 413, m);
    }
    append(&p->body, &p->body_len, &p->body_cap, at, n);
    return 0;
}

static int on_message_complete(http_parser *hp) {
    http_req *p = of(hp);
    /* split the URL into path and query */
    const char *u = p->url ? p->url : "";
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    free(p->path_buf);
    p->path_buf = NULL;
    const char *path = u, *query = "";
    size_t path_len = strlen(u), query_len = 0;
    if (*u && http_parser_parse_url(u, strlen(u), hp->method == HTTP_CONNECT, &pu) == 0) {
        if (pu.field_set & (1 << UF_PATH)) {
            path = u + pu.field_data[UF_PATH].off;
            path_len = pu.field_data[UF_PATH].len;
        } else {
            path = "/";
            path_len = 1;
        }
        if (pu.field_set & (1 << UF_QUERY)) {
            query = u + pu.field_data[UF_QUERY].off;
            query_len = pu.field_data[UF_QUERY].len;
        }
    } else if (*u) {
        return fail(p, 400, "malformed request URL");
    }
    p->path_buf = mla_xmalloc(path_len + query_len + 2);
    memcpy(p->path_buf, path, path_len);
    p->path_buf[path_len] = 0;
    memcpy(p->path_buf + path_len + 1, query, query_len);
    p->path_buf[path_len + 1 + query_len] = 0;
    p->req.method = http_method_str((enum http_method)hp->method);
    p->req.method_id = hp->method;
    p->req.path = p->path_buf;
    p->req.query = p->path_buf + path_len + 1;
    p->req.authorization = p->auth;
    p->req.content_type = p->ctype;
    p->req.origin = p->origin;
    p->req.ac_request_headers = p->acrh;
    if (!p->body) append(&p->body, &p->body_len, &p->body_cap, "", 0);
    p->req.body = p->body;
    p->req.body_len = p->body_len;
    p->req.keep_alive = http_should_keep_alive(hp) != 0;
    p->req.http_major = hp->http_major;
    p->req.http_minor = hp->http_minor;
    p->state = HTTP_REQ_DONE;
    http_parser_pause(hp, 1);
    return 0;
}

void http_req_init(http_req *p, const http_limits *lim) {
    memset(p, 0, sizeof(*p));
    if (lim)
        p->lim = *lim;
    else
        http_limits_default(&p->lim);
    http_parser_settings_init(&p->settings);
    p->settings.on_message_begin = on_message_begin;
    p->settings.on_url = on_url;
    p->settings.on_header_field = on_header_field;
    p->settings.on_header_value = on_header_value;
    p->settings.on_headers_complete = on_headers_complete;
    p->settings.on_body = on_body;
    p->settings.on_message_complete = on_message_complete;
    http_parser_init(&p->parser, HTTP_REQUEST);
    p->parser.data = p;
}

void http_req_head(const http_req *p, http_head *h) {
    h->method = http_method_str((enum http_method)p->parser.method);
    h->method_id = p->parser.method;
    h->url = p->url ? p->url : "";
    h->authorization = p->auth;
    h->origin = p->origin;
}

void http_req_next(http_req *p) {
    p->state = HTTP_REQ_MORE;
    p->err_status = 0;
    p->err_msg[0] = 0;
    p->started = p->headers_done = false;
    memset(&p->req, 0, sizeof(p->req));
    p->url_len = p->hname_len = p->hval_len = p->body_len = 0;
    if (p->url) p->url[0] = 0;
    p->in_value = false;
    p->te_other = p->expect_other = p->ce_other = false;
    p->n_host = p->n_te = p->n_auth = p->n_xkey = 0;
    p->header_bytes = 0;
    p->n_headers = 0;
    free(p->auth);
    free(p->xkey);
    free(p->ctype);
    free(p->origin);
    free(p->acrh);
    p->auth = p->xkey = p->ctype = p->origin = p->acrh = NULL;
    if (p->body) p->body[0] = 0;
    http_parser_init(&p->parser, HTTP_REQUEST);
    p->parser.data = p;
}

void http_req_free(http_req *p) {
    free(p->url);
    free(p->path_buf);
    free(p->hname);
    free(p->hval);
    free(p->auth);
    free(p->xkey);
    free(p->ctype);
    free(p->origin);
    free(p->acrh);
    free(p->body);
    memset(p, 0, sizeof(*p));
}

size_t http_req_feed(http_req *p, const char *data, size_t len) {
    if (p->state != HTTP_REQ_MORE || len == 0) return 0;
    p->feed = data;
    size_t n = http_parser_execute(&p->parser, &p->settings, data, len);
    p->fed += n;
    enum http_errno e = HTTP_PARSER_ERRNO(&p->parser);
    if (p->state == HTTP_REQ_DONE) {
        http_parser_pause(&p->parser, 0);
        return n;
    }
    if (p->state == HTTP_REQ_ERROR) return n;
    if (e != HPE_OK) {
        char m[160];
        /* the parser counts a chunk's size where it counts Content-Length, and names that header
         * when a chunk size overflows (in the body: past the headers, no header is read) */
        const bool chunk = e == HPE_INVALID_CONTENT_LENGTH && p->headers_done && (p->parser.flags & F_CHUNKED);
        /* and gives one description for a character that is no digit and a number past 2^64 */
        snprintf(m, sizeof(m), "malformed HTTP request: %s",
                 chunk                                 ? "a chunk size past what a body may be"
                 : e == HPE_INVALID_CONTENT_LENGTH ? "Content-Length is not a decimal number of bytes (a character "
                                                     "that is no digit, or a number past 2^64)"
                                                   : http_errno_description(e));
        fail(p, 400, m);
        return n;
    }
    if (n < len) fail(p, 400, "malformed HTTP request");
    return n;
}
