/* chat_jinja: see chat_jinja.h. Errors unwind with longjmp; every allocation of a parse or of a
 * render lives in an arena that is freed as a whole, so unwinding leaks nothing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_jinja.h"

/* ------------------------------------------------------------------------------------------ */
/* Limits (the input is untrusted: templates from files, messages from clients)               */
/* ------------------------------------------------------------------------------------------ */
#define J_MAX_ARENA ((size_t)256 << 20)
#define J_MAX_OUT ((size_t)64 << 20)
#define J_MAX_STEPS 20000000L
#define J_MAX_DEPTH 200
#define J_MAX_RANGE 1000000

/* ------------------------------------------------------------------------------------------ */
/* Arena                                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef struct achunk {
    struct achunk *next;
    size_t used, cap;
    max_align_t data[];
} achunk;

typedef struct arena {
    achunk *head;
    size_t total;
} arena;

typedef struct jerr_ctx {
    jmp_buf jb;
    mla_err *err;
    int status;
} jerr_ctx;

_Noreturn static void jfail(jerr_ctx *e, int status, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void jfail(jerr_ctx *e, int status, int line, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) mla_errf(e->err, "chat template line %d: %s", line, msg);
    else mla_errf(e->err, "chat template: %s", msg);
    e->status = status;
    longjmp(e->jb, 1);
}

static void *ar_alloc(arena *a, jerr_ctx *e, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ((size_t)1 << 16) ? n : ((size_t)1 << 16);
        if (a->total + cap > J_MAX_ARENA) jfail(e, JINJA_E_LIMIT, 0, "the template needs more than %zu MiB", J_MAX_ARENA >> 20);
        achunk *c = malloc(sizeof *c + cap);
        if (!c) jfail(e, JINJA_E_LIMIT, 0, "out of memory");
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void ar_free(arena *a) {
    achunk *c = a->head;
    while (c) {
        achunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_MACRO, JV_FUNC } jvt;

typedef struct jstr {
    size_t len;
    char s[]; /* NUL-terminated */
} jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct node node;

typedef struct jv {
    jvt t;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        const node *m;
        int fn;
    } u;
} jv;

struct jlist {
    size_t n, cap;
    jv *v;
    bool tuple; /* prints as a Python tuple */
};
struct jdict {
    size_t n, cap;
    jstr **k;
    jv *v;
};

static const jv JUNDEF = {JV_UNDEF, {0}};
static const jv JNONE = {JV_NONE, {0}};

/* ------------------------------------------------------------------------------------------ */
/* AST                                                                                        */
/* ------------------------------------------------------------------------------------------ */
enum nk {
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BODY,
    E_LIT, E_VAR, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT,
    E_AND, E_OR, E_BIN, E_COND, E_LIST, E_DICT,
};

struct node {
    enum nk k;
    int line;
    int op;
    bool neg;
    jstr *s;          /* text, name, attribute */
    jv lit;
    node *a, *b, *c;  /* operands; slice: a obj, b start, c stop; d step */
    node *d;
    node **l;         /* body / args / items / keys */
    size_t n;
    node **l2;        /* else body / kwarg values / dict values / macro defaults */
    size_t n2;
    jstr **names;     /* kwarg names / for targets / set targets / macro params */
    size_t nn;
};

/* ------------------------------------------------------------------------------------------ */
/* Lexer                                                                                      */
/* ------------------------------------------------------------------------------------------ */
enum tk { T_TEXT, T_BEXPR, T_EEXPR, T_BSTMT, T_ESTMT, T_NAME, T_INT, T_FLOAT, T_STR, T_OP, T_EOF };

typedef struct token {
    enum tk k;
    int line;
    const char *p; /* source position (T_TEXT: text start) */
    size_t len;
    jstr *s;        /* decoded string literal / name / op */
    int64_t i;
    double f;
} token;

struct jinja_tmpl {
    arena ar;
    node **body;
    size_t n;
};

typedef struct lexer {
    const char *src;
    size_t len;
    arena *ar;
    jerr_ctx *e;
    token *t;
    size_t n, cap;
    const char *lpos; /* line_of() cache: the line number at lpos */
    int lline;
} lexer;

static jstr *mkstr(arena *a, jerr_ctx *e, const char *s, size_t n) {
    jstr *r = ar_alloc(a, e, sizeof *r + n + 1);
    r->len = n;
    if (n) memcpy(r->s, s, n);
    r->s[n] = 0;
    return r;
}

static token *lx_push(lexer *lx, enum tk k, int line, const char *p, size_t len) {
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        token *nt = ar_alloc(lx->ar, lx->e, nc * sizeof *nt);
        if (lx->n) memcpy(nt, lx->t, lx->n * sizeof *nt);
        lx->t = nt;
        lx->cap = nc;
    }
    token *t = &lx->t[lx->n++];
    memset(t, 0, sizeof *t);
    t->k = k;
    t->line = line;
    t->p = p;
    t->len = len;
    return t;
}

static int line_of(lexer *lx, const char *p) {
    if (!lx->lpos || p < lx->lpos) {
        lx->lpos = lx->src;
        lx->lline = 1;
    }
    for (const char *q = lx->lpos; q < p; q++) lx->lline += *q == '\n';
    lx->lpos = p;
    return lx->lline;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_id0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_id(char c) { return is_id0(c) || (c >= '0' && c <= '9'); }

static void utf8_append(char *buf, size_t *o, uint32_t cp) {
    if (cp < 0x80) buf[(*o)++] = (char)cp;
    else if (cp < 0x800) {
        buf[(*o)++] = (char)(0xC0 | (cp >> 6));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        buf[(*o)++] = (char)(0xE0 | (cp >> 12));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        buf[(*o)++] = (char)(0xF0 | (cp >> 18));
        buf[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        buf[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Lexes the inside of a {{ }} or {% %} tag from *pp; stops after the closing delimiter.
 * Returns whether the closing had a '-' (strip following whitespace) in *strip_after. */
static void lx_tag(lexer *lx, const char **pp, bool stmt, bool *strip_after, bool *keep_after) {
    const char *p = *pp, *end = lx->src + lx->len;
    const char close0 = stmt ? '%' : '}';
    *strip_after = *keep_after = false;
    for (;;) {
        while (p < end && is_ws(*p)) p++;
        if (p >= end) jfail(lx->e, JINJA_E_SYNTAX, line_of(lx, p), "unclosed %s tag", stmt ? "{%" : "{{");
        if ((*p == '-' || *p == '+') && p + 2 < end + 0 && p[1] == close0 && p[2] == '}') {
            *strip_after = *p == '-';
            *keep_after = *p == '+';
            *pp = p + 3;
            return;
        }
        if (*p == close0 && p + 1 < end && p[1] == '}') {
            *pp = p + 2;
            return;
        }
        int line = line_of(lx, p);
        if (is_id0(*p)) {
            const char *s = p;
            while (p < end && is_id(*p)) p++;
            token *t = lx_push(lx, T_NAME, line, s, (size_t)(p - s));
            t->s = mkstr(lx->ar, lx->e, s, (size_t)(p - s));
        } else if (*p >= '0' && *p <= '9') {
            const char *s = p;
            bool fl = false;
            while (p < end && ((*p >= '0' && *p <= '9') || *p == '_')) p++;
            if (p + 1 < end && *p == '.' && p[1] >= '0' && p[1] <= '9') {
                fl = true;
                p++;
                while (p < end && *p >= '0' && *p <= '9') p++;
            }
            if (p < end && (*p == 'e' || *p == 'E')) {
                const char *q = p + 1;
                if (q < end && (*q == '+' || *q == '-')) q++;
                if (q < end && *q >= '0' && *q <= '9') {
                    fl = true;
                    p = q;
                    while (p < end && *p >= '0' && *p <= '9') p++;
                }
            }
            char buf[64];
            size_t bl = 0;
            for (const char *q = s; q < p && bl < sizeof buf - 1; q++)
                if (*q != '_') buf[bl++] = *q;
            buf[bl] = 0;
            token *t = lx_push(lx, fl ? T_FLOAT : T_INT, line, s, (size_t)(p - s));
            if (fl) t->f = strtod(buf, NULL);
            else {
                unsigned long long v = strtoull(buf, NULL, 10);
                t->i = v > INT64_MAX ? INT64_MAX : (int64_t)v;
            }
        } else if (*p == '\'' || *p == '"') {
            char q = *p++;
            const char *s = p;
            size_t cap = 0;
            while (s + cap < end && s[cap] != q) cap += (s[cap] == '\\' && s + cap + 1 < end) ? 2 : 1;
            if (s + cap >= end) jfail(lx->e, JINJA_E_SYNTAX, line, "unterminated string literal");
            char *buf = ar_alloc(lx->ar, lx->e, cap + 1);
            size_t o = 0;
            while (p < s + cap) {
                if (*p != '\\') {
                    buf[o++] = *p++;
                    continue;
                }
                p++;
                char c = *p++;
                switch (c) {
                case 'n': buf[o++] = '\n'; break;
                case 't': buf[o++] = '\t'; break;
                case 'r': buf[o++] = '\r'; break;
                case '0': buf[o++] = '\0'; break;
                case 'a': buf[o++] = '\a'; break;
                case 'b': buf[o++] = '\b'; break;
                case 'f': buf[o++] = '\f'; break;
                case 'v': buf[o++] = '\v'; break;
                case '\\': buf[o++] = '\\'; break;
                case '\'': buf[o++] = '\''; break;
                case '"': buf[o++] = '"'; break;
                case '\n': break;
                case 'x': case 'u': case 'U': {
                    int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
                    uint32_t cp = 0;
                    bool ok = p + nd <= s + cap;
                    for (int k = 0; ok && k < nd; k++) {
                        int h = hexval(p[k]);
                        if (h < 0) ok = false;
                        else cp = cp * 16 + (uint32_t)h;
                    }
                    if (!ok || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000) || (size_t)nd > 4 + o + cap)
                        jfail(lx->e, JINJA_E_SYNTAX, line, "bad \\%c escape in a string literal", c);
                    p += nd;
                    /* nd hex digits take >= the bytes of their UTF-8 except \x (2 digits, up to 2 bytes) */
                    utf8_append(buf, &o, cp);
                    break;
                }
                default: /* Python keeps unknown escapes as they are */
                    buf[o++] = '\\';
                    buf[o++] = c;
                }
            }
            p++; /* closing quote */
            token *t = lx_push(lx, T_STR, line, s - 1, (size_t)(p - s + 1));
            t->s = mkstr(lx->ar, lx->e, buf, o);
        } else {
            static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**", NULL};
            size_t l = 0;
            for (int k = 0; ops2[k]; k++)
                if (p + 1 < end && p[0] == ops2[k][0] && p[1] == ops2[k][1]) l = 2;
            if (!l) {
                if (!strchr("+-*/%~<>=()[]{}.,:|", *p) || *p == 0)
                    jfail(lx->e, JINJA_E_SYNTAX, line, "unexpected character '%c' in a tag", *p);
                l = 1;
            }
            token *t = lx_push(lx, T_OP, line, p, l);
            t->s = mkstr(lx->ar, lx->e, p, l);
            p += l;
        }
    }
}

/* Splits the template into text and tag tokens, applying whitespace control the way jinja2's
 * lexer does with HF's environment (trim_blocks, lstrip_blocks): `{%-`/`-%}` strip all
 * whitespace on that side; a block or comment tag eats one newline after it (trim_blocks, not
 * with `+%}`); spaces and tabs between the start of a line and a block or comment tag go
 * (lstrip_blocks, not with `{%+`). */
static void lex(lexer *lx) {
    const char *p = lx->src, *end = lx->src + lx->len;
    const char *text = p;
    bool line_starting = true;
    while (p < end) {
        const char *o = memchr(p, '{', (size_t)(end - p));
        while (o && o + 1 < end && o[1] != '{' && o[1] != '%' && o[1] != '#')
            o = memchr(o + 1, '{', (size_t)(end - o - 1));
        if (!o || o + 1 >= end) break;
        char kind = o[1];
        const char *after = o + 2;
        bool lminus = after < end && *after == '-', lplus = after < end && *after == '+';
        const char *te = o;
        if (lminus) {
            while (te > text && is_ws(te[-1])) te--;
        } else if (!lplus && kind != '{') {
            const char *nl = te;
            while (nl > text && nl[-1] != '\n') nl--;
            bool has_nl = nl > text;
            bool blank = true;
            for (const char *q = nl; q < te; q++)
                if (*q != ' ' && *q != '\t') blank = false;
            if ((has_nl || line_starting) && blank) te = nl;
        }
        if (te > text) lx_push(lx, T_TEXT, line_of(lx, text), text, (size_t)(te - text));
        if (lminus || lplus) after++;
        bool sa = false, ka = false;
        if (kind == '#') {
            const char *c = after;
            for (;;) {
                c = memchr(c, '#', (size_t)(end - c));
                if (!c || c + 1 >= end) jfail(lx->e, JINJA_E_SYNTAX, line_of(lx, o), "unclosed comment");
                if (c[1] == '}') break;
                c++;
            }
            sa = c > after && c[-1] == '-';
            ka = c > after && c[-1] == '+';
            p = c + 2;
        } else if (kind == '{') {
            lx_push(lx, T_BEXPR, line_of(lx, o), o, 2);
            p = after;
            lx_tag(lx, &p, false, &sa, &ka);
            lx_push(lx, T_EEXPR, line_of(lx, p), p, 0);
        } else {
            size_t first = lx->n;
            lx_push(lx, T_BSTMT, line_of(lx, o), o, 2);
            p = after;
            lx_tag(lx, &p, true, &sa, &ka);
            lx_push(lx, T_ESTMT, line_of(lx, p), p, 0);
            /* {% raw %}: everything up to {% endraw %} is text */
            if (lx->n - first == 3 && lx->t[first + 1].k == T_NAME && !strcmp(lx->t[first + 1].s->s, "raw")) {
                lx->n = first;
                const char *q = p, *rs = p, *re = NULL, *after_end = NULL;
                bool esa = false, eka = false;
                while ((q = memchr(q, '{', (size_t)(end - q))) && q + 1 < end) {
                    if (q[1] == '%') {
                        const char *r = q + 2;
                        bool m = r < end && *r == '-';
                        if (m || (r < end && *r == '+')) r++;
                        while (r < end && is_ws(*r)) r++;
                        if ((size_t)(end - r) >= 6 && !memcmp(r, "endraw", 6)) {
                            r += 6;
                            while (r < end && is_ws(*r)) r++;
                            if (r < end && (*r == '-' || *r == '+')) {
                                esa = *r == '-';
                                eka = *r == '+';
                                r++;
                            }
                            if (r + 1 < end && r[0] == '%' && r[1] == '}') {
                                re = q;
                                if (m)
                                    while (re > rs && is_ws(re[-1])) re--;
                                after_end = r + 2;
                                break;
                            }
                        }
                    }
                    q++;
                }
                if (!re) jfail(lx->e, JINJA_E_SYNTAX, line_of(lx, o), "{%% raw %%} without {%% endraw %%}");
                if (sa)
                    while (rs < re && is_ws(*rs)) rs++;
                else if (!ka && rs < re && *rs == '\n')
                    rs++;
                if (re > rs) lx_push(lx, T_TEXT, line_of(lx, rs), rs, (size_t)(re - rs));
                p = after_end;
                sa = esa;
                ka = eka;
            }
        }
        /* what the tag's end consumes after it */
        line_starting = false;
        if (sa) {
            while (p < end && is_ws(*p)) {
                line_starting = *p == '\n';
                p++;
            }
        } else if (!ka && kind != '{' && p < end && *p == '\n') {
            p++;
            line_starting = true;
        }
        text = p;
    }
    if (end > text) lx_push(lx, T_TEXT, line_of(lx, text), text, (size_t)(end - text));
    lx_push(lx, T_EOF, line_of(lx, end), end, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Parser                                                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef struct parser {
    token *t;
    size_t n, i;
    arena *ar;
    jerr_ctx *e;
    int depth;
} parser;

static token *pk(parser *ps) { return &ps->t[ps->i]; }
static bool is_op(const token *t, const char *op) { return t->k == T_OP && !strcmp(t->s->s, op); }
static bool is_name(const token *t, const char *nm) { return t->k == T_NAME && !strcmp(t->s->s, nm); }

static node *nnew(parser *ps, enum nk k, int line) {
    node *n = ar_alloc(ps->ar, ps->e, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = line;
    return n;
}

static void expect_op(parser *ps, const char *op) {
    token *t = pk(ps);
    if (!is_op(t, op))
        jfail(ps->e, JINJA_E_SYNTAX, t->line, "expected '%s', found '%.*s'", op, (int)(t->len > 40 ? 40 : t->len), t->p);
    ps->i++;
}

static jstr *expect_name(parser *ps) {
    token *t = pk(ps);
    if (t->k != T_NAME) jfail(ps->e, JINJA_E_SYNTAX, t->line, "expected a name, found '%.*s'", (int)(t->len > 40 ? 40 : t->len), t->p);
    ps->i++;
    return t->s;
}

/* growable node arrays in the arena */
typedef struct nvec {
    node **v;
    size_t n, cap;
} nvec;
static void nv_push(parser *ps, nvec *v, node *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        node **nn = ar_alloc(ps->ar, ps->e, nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}
typedef struct svec {
    jstr **v;
    size_t n, cap;
} svec;
static void sv_push(parser *ps, svec *v, jstr *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        jstr **nn = ar_alloc(ps->ar, ps->e, nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static node *p_expr(parser *ps);
static node *p_or(parser *ps);
static node *p_unary(parser *ps, bool with_filter);

static void enter(parser *ps) {
    if (++ps->depth > J_MAX_DEPTH) jfail(ps->e, JINJA_E_LIMIT, pk(ps)->line, "expressions nested too deeply");
}

/* ( args ) with keyword arguments; the '(' is current */
static void p_args(parser *ps, node *call) {
    expect_op(ps, "(");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    while (!is_op(pk(ps), ")")) {
        if (pk(ps)->k == T_NAME && is_op(&ps->t[ps->i + 1], "=")) {
            sv_push(ps, &kwn, pk(ps)->s);
            ps->i += 2;
            nv_push(ps, &kwv, p_expr(ps));
        } else {
            if (kwn.n) jfail(ps->e, JINJA_E_SYNTAX, pk(ps)->line, "positional argument after a keyword argument");
            nv_push(ps, &args, p_expr(ps));
        }
        if (!is_op(pk(ps), ",")) break;
        ps->i++;
    }
    expect_op(ps, ")");
    call->l = args.v;
    call->n = args.n;
    call->l2 = kwv.v;
    call->n2 = kwv.n;
    call->names = kwn.v;
    call->nn = kwn.n;
}

static node *p_primary(parser *ps) {
    token *t = pk(ps);
    node *n;
    switch (t->k) {
    case T_NAME:
        ps->i++;
        if (!strcmp(t->s->s, "true") || !strcmp(t->s->s, "True")) {
            n = nnew(ps, E_LIT, t->line);
            n->lit.t = JV_BOOL;
            n->lit.u.b = true;
        } else if (!strcmp(t->s->s, "false") || !strcmp(t->s->s, "False")) {
            n = nnew(ps, E_LIT, t->line);
            n->lit.t = JV_BOOL;
        } else if (!strcmp(t->s->s, "none") || !strcmp(t->s->s, "None")) {
            n = nnew(ps, E_LIT, t->line);
            n->lit.t = JV_NONE;
        } else {
            n = nnew(ps, E_VAR, t->line);
            n->s = t->s;
        }
        return n;
    case T_INT:
        ps->i++;
        n = nnew(ps, E_LIT, t->line);
        n->lit.t = JV_INT;
        n->lit.u.i = t->i;
        return n;
    case T_FLOAT:
        ps->i++;
        n = nnew(ps, E_LIT, t->line);
        n->lit.t = JV_FLOAT;
        n->lit.u.f = t->f;
        return n;
    case T_STR: {
        /* adjacent string literals concatenate */
        jstr *s = t->s;
        ps->i++;
        while (pk(ps)->k == T_STR) {
            jstr *s2 = pk(ps)->s;
            jstr *c = ar_alloc(ps->ar, ps->e, sizeof *c + s->len + s2->len + 1);
            c->len = s->len + s2->len;
            memcpy(c->s, s->s, s->len);
            memcpy(c->s + s->len, s2->s, s2->len + 1);
            s = c;
            ps->i++;
        }
        n = nnew(ps, E_LIT, t->line);
        n->lit.t = JV_STR;
        n->lit.u.s = s;
        return n;
    }
    case T_OP:
        if (is_op(t, "(")) {
            ps->i++;
            if (is_op(pk(ps), ")")) { /* empty tuple */
                ps->i++;
                node *e = nnew(ps, E_LIST, t->line);
                e->op = 1;
                return e;
            }
            node *x = p_expr(ps);
            if (is_op(pk(ps), ",")) { /* tuple: a list for our purposes */
                nvec it = {0};
                nv_push(ps, &it, x);
                while (is_op(pk(ps), ",")) {
                    ps->i++;
                    if (is_op(pk(ps), ")")) break;
                    nv_push(ps, &it, p_expr(ps));
                }
                x = nnew(ps, E_LIST, t->line);
                x->l = it.v;
                x->n = it.n;
                x->op = 1; /* tuple */
            }
            expect_op(ps, ")");
            return x;
        }
        if (is_op(t, "[")) {
            ps->i++;
            nvec it = {0};
            while (!is_op(pk(ps), "]")) {
                nv_push(ps, &it, p_expr(ps));
                if (!is_op(pk(ps), ",")) break;
                ps->i++;
            }
            expect_op(ps, "]");
            n = nnew(ps, E_LIST, t->line);
            n->l = it.v;
            n->n = it.n;
            return n;
        }
        if (is_op(t, "{")) {
            ps->i++;
            nvec ks = {0}, vs = {0};
            while (!is_op(pk(ps), "}")) {
                nv_push(ps, &ks, p_expr(ps));
                expect_op(ps, ":");
                nv_push(ps, &vs, p_expr(ps));
                if (!is_op(pk(ps), ",")) break;
                ps->i++;
            }
            expect_op(ps, "}");
            n = nnew(ps, E_DICT, t->line);
            n->l = ks.v;
            n->n = ks.n;
            n->l2 = vs.v;
            n->n2 = vs.n;
            return n;
        }
        break;
    default:
        break;
    }
    jfail(ps->e, JINJA_E_SYNTAX, t->line, "unexpected '%.*s' in an expression", (int)(t->len > 40 ? 40 : t->len), t->p);
}

static node *p_postfix(parser *ps, node *n) {
    for (;;) {
        token *t = pk(ps);
        if (is_op(t, ".")) {
            ps->i++;
            token *a = pk(ps);
            node *x = nnew(ps, E_ATTR, a->line);
            x->a = n;
            if (a->k == T_NAME) x->s = a->s;
            else if (a->k == T_INT) { /* x.0 is x[0] */
                x->k = E_ITEM;
                x->b = nnew(ps, E_LIT, a->line);
                x->b->lit.t = JV_INT;
                x->b->lit.u.i = a->i;
            } else
                jfail(ps->e, JINJA_E_SYNTAX, a->line, "expected an attribute name after '.'");
            ps->i++;
            n = x;
        } else if (is_op(t, "[")) {
            ps->i++;
            node *start = NULL, *stop = NULL, *step = NULL;
            bool slice = false;
            if (!is_op(pk(ps), ":")) start = p_expr(ps);
            if (is_op(pk(ps), ":")) {
                slice = true;
                ps->i++;
                if (!is_op(pk(ps), "]") && !is_op(pk(ps), ":")) stop = p_expr(ps);
                if (is_op(pk(ps), ":")) {
                    ps->i++;
                    if (!is_op(pk(ps), "]")) step = p_expr(ps);
                }
            }
            expect_op(ps, "]");
            node *x = nnew(ps, slice ? E_SLICE : E_ITEM, t->line);
            x->a = n;
            x->b = start;
            x->c = stop;
            x->d = step;
            n = x;
        } else if (is_op(t, "(")) {
            node *x = nnew(ps, E_CALL, t->line);
            x->a = n;
            p_args(ps, x);
            n = x;
        } else
            return n;
    }
}

static node *p_filters(parser *ps, node *n) {
    for (;;) {
        token *t = pk(ps);
        if (is_op(t, "|")) {
            ps->i++;
            node *x = nnew(ps, E_FILTER, pk(ps)->line);
            x->s = expect_name(ps);
            while (is_op(pk(ps), ".")) { /* dotted filter names: not supported, but parse */
                ps->i++;
                expect_name(ps);
            }
            x->a = n;
            if (is_op(pk(ps), "(")) p_args(ps, x);
            n = x;
        } else if (is_name(t, "is")) {
            ps->i++;
            node *x = nnew(ps, E_TEST, t->line);
            if (is_name(pk(ps), "not")) {
                x->neg = true;
                ps->i++;
            }
            token *nm = pk(ps);
            if (nm->k == T_NAME) x->s = nm->s;
            else if (is_op(nm, "==") || is_op(nm, "!=") || is_op(nm, "<") || is_op(nm, ">") || is_op(nm, "<=") || is_op(nm, ">="))
                x->s = nm->s;
            else
                jfail(ps->e, JINJA_E_SYNTAX, nm->line, "expected a test name after 'is'");
            ps->i++;
            x->a = n;
            if (is_op(pk(ps), "(")) p_args(ps, x);
            else {
                /* a test takes one argument without parentheses: `is divisibleby 3`, `is sameas none` */
                token *q = pk(ps);
                bool arg = (q->k == T_NAME && !is_name(q, "and") && !is_name(q, "or") && !is_name(q, "else") &&
                            !is_name(q, "if") && !is_name(q, "is") && !is_name(q, "in") && !is_name(q, "not")) ||
                           q->k == T_INT || q->k == T_FLOAT || q->k == T_STR;
                if (arg) {
                    x->l = ar_alloc(ps->ar, ps->e, sizeof *x->l);
                    x->l[0] = p_unary(ps, false);
                    x->n = 1;
                }
            }
            n = x;
        } else if (is_op(t, "(")) {
            node *x = nnew(ps, E_CALL, t->line);
            x->a = n;
            p_args(ps, x);
            n = x;
        } else
            return n;
    }
}

static node *p_unary(parser *ps, bool with_filter) {
    token *t = pk(ps);
    node *n;
    enter(ps);
    if (is_op(t, "-") || is_op(t, "+")) {
        ps->i++;
        n = nnew(ps, is_op(t, "-") ? E_NEG : E_POS, t->line);
        n->a = p_unary(ps, false);
    } else {
        n = p_primary(ps);
    }
    n = p_postfix(ps, n);
    if (with_filter) n = p_filters(ps, n);
    ps->depth--;
    return n;
}

static node *mkbin(parser *ps, int op, node *a, node *b, int line) {
    node *n = nnew(ps, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *ps) {
    node *a = p_unary(ps, true);
    while (is_op(pk(ps), "**")) {
        int line = pk(ps)->line;
        ps->i++;
        a = mkbin(ps, 'P', a, p_unary(ps, true), line);
    }
    return a;
}

static node *p_mul(parser *ps) {
    node *a = p_pow(ps);
    for (;;) {
        token *t = pk(ps);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (!op) return a;
        ps->i++;
        a = mkbin(ps, op, a, p_pow(ps), t->line);
    }
}

static node *p_concat(parser *ps) {
    node *a = p_mul(ps);
    while (is_op(pk(ps), "~")) {
        int line = pk(ps)->line;
        ps->i++;
        a = mkbin(ps, '~', a, p_mul(ps), line);
    }
    return a;
}

static node *p_add(parser *ps) {
    node *a = p_concat(ps);
    for (;;) {
        token *t = pk(ps);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return a;
        ps->i++;
        a = mkbin(ps, op, a, p_concat(ps), t->line);
    }
}

static node *p_compare(parser *ps) {
    node *a = p_add(ps);
    for (;;) {
        token *t = pk(ps);
        int op = 0;
        if (is_op(t, "==")) op = '=';
        else if (is_op(t, "!=")) op = '!';
        else if (is_op(t, "<")) op = '<';
        else if (is_op(t, "<=")) op = 'l';
        else if (is_op(t, ">")) op = '>';
        else if (is_op(t, ">=")) op = 'g';
        else if (is_name(t, "in")) op = 'i';
        else if (is_name(t, "not") && is_name(&ps->t[ps->i + 1], "in")) {
            op = 'n';
            ps->i++;
        }
        if (!op) return a;
        ps->i++;
        /* a < b < c chains are rare in templates; evaluate pairwise left to right */
        a = mkbin(ps, op, a, p_add(ps), t->line);
    }
}

static node *p_not(parser *ps) {
    token *t = pk(ps);
    if (is_name(t, "not")) {
        ps->i++;
        enter(ps);
        node *n = nnew(ps, E_NOT, t->line);
        n->a = p_not(ps);
        ps->depth--;
        return n;
    }
    return p_compare(ps);
}

static node *p_and(parser *ps) {
    node *a = p_not(ps);
    while (is_name(pk(ps), "and")) {
        node *n = nnew(ps, E_AND, pk(ps)->line);
        ps->i++;
        n->a = a;
        n->b = p_not(ps);
        a = n;
    }
    return a;
}

static node *p_or(parser *ps) {
    node *a = p_and(ps);
    while (is_name(pk(ps), "or")) {
        node *n = nnew(ps, E_OR, pk(ps)->line);
        ps->i++;
        n->a = a;
        n->b = p_and(ps);
        a = n;
    }
    return a;
}

static node *p_expr(parser *ps) {
    enter(ps);
    node *a = p_or(ps);
    while (is_name(pk(ps), "if")) {
        node *n = nnew(ps, E_COND, pk(ps)->line);
        ps->i++;
        n->b = a;
        n->a = p_or(ps);
        if (is_name(pk(ps), "else")) {
            ps->i++;
            n->c = p_expr(ps);
        }
        a = n;
    }
    ps->depth--;
    return a;
}

/* statements */
static void expect_end_stmt(parser *ps) {
    token *t = pk(ps);
    if (t->k != T_ESTMT) jfail(ps->e, JINJA_E_SYNTAX, t->line, "unexpected '%.*s' in a {%% %%} tag", (int)(t->len > 40 ? 40 : t->len), t->p);
    ps->i++;
}

/* Parses statements until a {% name %} whose name is in `ends` (NULL-terminated); leaves the
 * parser just after that name and returns the name's index; -1 at end of template. */
static int p_body(parser *ps, const char *const *ends, nvec *out);

/* After {% if / {% elif: condition, body, then elif / else / endif; consumes through the %} of
 * the endif. An elif becomes a nested if in the else branch. */
static node *p_if_rest(parser *ps, int line) {
    enter(ps);
    node *n = nnew(ps, N_IF, line);
    n->a = p_expr(ps);
    expect_end_stmt(ps);
    nvec body = {0};
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    int e = p_body(ps, ends, &body);
    n->l = body.v;
    n->n = body.n;
    if (e == 0) {
        n->l2 = ar_alloc(ps->ar, ps->e, sizeof(node *));
        n->l2[0] = p_if_rest(ps, ps->t[ps->i - 1].line);
        n->n2 = 1;
    } else if (e == 1) {
        expect_end_stmt(ps);
        nvec eb = {0};
        static const char *const endif_only[] = {"endif", NULL};
        if (p_body(ps, endif_only, &eb) != 0) jfail(ps->e, JINJA_E_SYNTAX, line, "{%% if %%} without {%% endif %%}");
        n->l2 = eb.v;
        n->n2 = eb.n;
        expect_end_stmt(ps);
    } else if (e == 2) {
        expect_end_stmt(ps);
    } else
        jfail(ps->e, JINJA_E_SYNTAX, line, "{%% if %%} without {%% endif %%}");
    ps->depth--;
    return n;
}

static node *p_stmt(parser *ps) {
    token *kw = pk(ps);
    int line = kw->line;
    if (kw->k != T_NAME) jfail(ps->e, JINJA_E_SYNTAX, line, "expected a statement name after {%%");
    const char *w = kw->s->s;
    ps->i++;
    enter(ps);
    node *n;
    if (!strcmp(w, "if")) {
        n = p_if_rest(ps, line);
        ps->depth--;
        return n;
    } else if (!strcmp(w, "for")) {
        n = nnew(ps, N_FOR, line);
        svec tg = {0};
        bool paren = is_op(pk(ps), "(");
        if (paren) ps->i++;
        sv_push(ps, &tg, expect_name(ps));
        while (is_op(pk(ps), ",")) {
            ps->i++;
            sv_push(ps, &tg, expect_name(ps));
        }
        if (paren) expect_op(ps, ")");
        n->names = tg.v;
        n->nn = tg.n;
        if (!is_name(pk(ps), "in")) jfail(ps->e, JINJA_E_SYNTAX, line, "expected 'in' in {%% for %%}");
        ps->i++;
        n->a = p_or(ps); /* not p_expr: a trailing `if` is the loop filter */
        if (is_name(pk(ps), "if")) {
            ps->i++;
            n->b = p_expr(ps);
        }
        if (is_name(pk(ps), "recursive")) jfail(ps->e, JINJA_E_UNSUPPORTED, line, "recursive for loops are not supported");
        expect_end_stmt(ps);
        nvec body = {0};
        static const char *const ends[] = {"else", "endfor", NULL};
        int e = p_body(ps, ends, &body);
        n->l = body.v;
        n->n = body.n;
        if (e == 0) {
            expect_end_stmt(ps);
            nvec eb = {0};
            static const char *const endfor_only[] = {"endfor", NULL};
            if (p_body(ps, endfor_only, &eb) != 0) jfail(ps->e, JINJA_E_SYNTAX, line, "{%% for %%} without {%% endfor %%}");
            n->l2 = eb.v;
            n->n2 = eb.n;
        } else if (e != 1)
            jfail(ps->e, JINJA_E_SYNTAX, line, "{%% for %%} without {%% endfor %%}");
    } else if (!strcmp(w, "set")) {
        svec tg = {0};
        jstr *first = expect_name(ps);
        jstr *attr = NULL;
        if (is_op(pk(ps), ".")) {
            ps->i++;
            attr = expect_name(ps);
        }
        sv_push(ps, &tg, first);
        while (!attr && is_op(pk(ps), ",")) {
            ps->i++;
            sv_push(ps, &tg, expect_name(ps));
        }
        if (is_op(pk(ps), "=")) {
            ps->i++;
            n = nnew(ps, N_SET, line);
            n->a = p_expr(ps);
            if (is_op(pk(ps), ",")) { /* set a = 1, 2 */
                nvec it = {0};
                nv_push(ps, &it, n->a);
                while (is_op(pk(ps), ",")) {
                    ps->i++;
                    nv_push(ps, &it, p_expr(ps));
                }
                node *l = nnew(ps, E_LIST, line);
                l->l = it.v;
                l->n = it.n;
                n->a = l;
            }
            n->names = tg.v;
            n->nn = tg.n;
            n->s = attr;
        } else {
            if (attr || tg.n != 1) jfail(ps->e, JINJA_E_SYNTAX, line, "expected '=' in {%% set %%}");
            if (is_op(pk(ps), "|")) jfail(ps->e, JINJA_E_UNSUPPORTED, line, "filtered {%% set %%} blocks are not supported");
            expect_end_stmt(ps);
            n = nnew(ps, N_SETBLOCK, line);
            n->names = tg.v;
            n->nn = 1;
            nvec body = {0};
            static const char *const ends[] = {"endset", NULL};
            if (p_body(ps, ends, &body) != 0) jfail(ps->e, JINJA_E_SYNTAX, line, "{%% set %%} without {%% endset %%}");
            n->l = body.v;
            n->n = body.n;
            expect_end_stmt(ps);
            ps->depth--;
            return n;
        }
    } else if (!strcmp(w, "macro")) {
        n = nnew(ps, N_MACRO, line);
        n->s = expect_name(ps);
        expect_op(ps, "(");
        svec params = {0};
        nvec defs = {0};
        while (!is_op(pk(ps), ")")) {
            sv_push(ps, &params, expect_name(ps));
            node *d = NULL;
            if (is_op(pk(ps), "=")) {
                ps->i++;
                d = p_expr(ps);
            }
            nv_push(ps, &defs, d);
            if (!is_op(pk(ps), ",")) break;
            ps->i++;
        }
        expect_op(ps, ")");
        n->names = params.v;
        n->nn = params.n;
        n->l2 = defs.v;
        n->n2 = defs.n;
        expect_end_stmt(ps);
        nvec body = {0};
        static const char *const ends[] = {"endmacro", NULL};
        if (p_body(ps, ends, &body) != 0) jfail(ps->e, JINJA_E_SYNTAX, line, "{%% macro %%} without {%% endmacro %%}");
        if (pk(ps)->k == T_NAME) ps->i++; /* {% endmacro name %} */
        n->l = body.v;
        n->n = body.n;
    } else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        n = nnew(ps, w[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    } else if (!strcmp(w, "generation")) {
        /* HF's AssistantTracker extension: marks assistant text; renders its body */
        expect_end_stmt(ps);
        n = nnew(ps, N_BODY, line);
        nvec body = {0};
        static const char *const ends[] = {"endgeneration", NULL};
        if (p_body(ps, ends, &body) != 0) jfail(ps->e, JINJA_E_SYNTAX, line, "{%% generation %%} without {%% endgeneration %%}");
        n->l = body.v;
        n->n = body.n;
    } else if (!strcmp(w, "elif") || !strcmp(w, "else") || !strncmp(w, "end", 3)) {
        jfail(ps->e, JINJA_E_SYNTAX, line, "unexpected {%% %s %%}", w);
    } else {
        jfail(ps->e, JINJA_E_UNSUPPORTED, line, "the {%% %s %%} statement is not supported", w);
    }
    expect_end_stmt(ps);
    ps->depth--;
    return n;
}

static int p_body(parser *ps, const char *const *ends, nvec *out) {
    for (;;) {
        token *t = pk(ps);
        if (t->k == T_EOF) return -1;
        if (t->k == T_TEXT) {
            node *n = nnew(ps, N_TEXT, t->line);
            n->s = mkstr(ps->ar, ps->e, t->p, t->len);
            nv_push(ps, out, n);
            ps->i++;
        } else if (t->k == T_BEXPR) {
            ps->i++;
            node *n = nnew(ps, N_OUT, t->line);
            n->a = p_expr(ps);
            if (pk(ps)->k != T_EEXPR) jfail(ps->e, JINJA_E_SYNTAX, pk(ps)->line, "unexpected '%.*s' in {{ }}", (int)(pk(ps)->len > 40 ? 40 : pk(ps)->len), pk(ps)->p);
            ps->i++;
            nv_push(ps, out, n);
        } else if (t->k == T_BSTMT) {
            token *kw = &ps->t[ps->i + 1];
            if (ends && kw->k == T_NAME)
                for (int k = 0; ends[k]; k++)
                    if (!strcmp(kw->s->s, ends[k])) {
                        ps->i += 2;
                        return k;
                    }
            ps->i++;
            nv_push(ps, out, p_stmt(ps));
        } else {
            jfail(ps->e, JINJA_E_SYNTAX, t->line, "unexpected token");
        }
    }
}

int jinja_parse(jinja_tmpl **out, const char *src, size_t len, mla_err *err) {
    *out = NULL;
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) return mla_errf(err, "out of memory"), JINJA_E_LIMIT;
    jerr_ctx e;
    e.err = err;
    e.status = 0;
    if (setjmp(e.jb)) {
        ar_free(&t->ar);
        free(t);
        return e.status;
    }
    char *copy = ar_alloc(&t->ar, &e, len + 1);
    memcpy(copy, src, len);
    copy[len] = 0;
    lexer lx = {copy, len, &t->ar, &e, NULL, 0, 0, NULL, 1};
    lex(&lx);
    parser ps = {lx.t, lx.n, 0, &t->ar, &e, 0};
    nvec body = {0};
    if (p_body(&ps, NULL, &body) != -1) jfail(&e, JINJA_E_SYNTAX, pk(&ps)->line, "unexpected end tag");
    t->body = body.v;
    t->n = body.n;
    *out = t;
    return JINJA_OK;
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    ar_free(&t->ar);
    free(t);
}

static bool uses_var(const node *n, const char *name, int depth) {
    if (!n || depth > 10000) return false;
    if (n->k == E_VAR && n->s && !strcmp(n->s->s, name)) return true;
    if (uses_var(n->a, name, depth + 1) || uses_var(n->b, name, depth + 1) || uses_var(n->c, name, depth + 1) ||
        uses_var(n->d, name, depth + 1))
        return true;
    for (size_t i = 0; i < n->n; i++)
        if (uses_var(n->l[i], name, depth + 1)) return true;
    for (size_t i = 0; i < n->n2; i++)
        if (uses_var(n->l2[i], name, depth + 1)) return true;
    return false;
}

bool jinja_uses_var(const jinja_tmpl *t, const char *name) {
    for (size_t i = 0; t && i < t->n; i++)
        if (uses_var(t->body[i], name, 0)) return true;
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* Render                                                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef struct frame {
    jdict vars;
} frame;

typedef struct rctx {
    arena ar;
    jerr_ctx e;
    char *out;
    size_t out_len, out_cap;
    frame *frames[J_MAX_DEPTH + 8];
    int nframes;
    int base; /* first frame visible (macro calls hide the caller's frames) */
    long steps;
    int depth;
    /* outer output buffers set aside while a macro body or {% set %} block renders into its
     * own; an error unwinding from inside frees them (jinja_render) */
    struct saved_out {
        char *p;
        size_t len, cap;
    } saved[J_MAX_DEPTH + 8];
    int nsaved;
} rctx;

enum { F_RANGE = 1, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT };

static void step(rctx *r, int line) {
    if (++r->steps > J_MAX_STEPS) jfail(&r->e, JINJA_E_LIMIT, line, "the template takes too many steps");
}

/* Renders into a fresh buffer from here to capture_end, which returns what was rendered. */
static void capture_begin(rctx *r, int line) {
    if (r->nsaved >= (int)(sizeof r->saved / sizeof r->saved[0]))
        jfail(&r->e, JINJA_E_LIMIT, line, "macro calls and {%% set %%} blocks nested too deeply");
    struct saved_out *o = &r->saved[r->nsaved++];
    o->p = r->out;
    o->len = r->out_len;
    o->cap = r->out_cap;
    r->out = NULL;
    r->out_len = r->out_cap = 0;
}

static jv mk_str(rctx *r, const char *s, size_t n);

static jv capture_end(rctx *r) {
    jv v = mk_str(r, r->out ? r->out : "", r->out_len);
    free(r->out);
    struct saved_out *o = &r->saved[--r->nsaved];
    r->out = o->p;
    r->out_len = o->len;
    r->out_cap = o->cap;
    return v;
}

static void out_put(rctx *r, const char *s, size_t n, int line) {
    if (r->out_len + n > J_MAX_OUT) jfail(&r->e, JINJA_E_LIMIT, line, "output exceeds %zu MiB", J_MAX_OUT >> 20);
    if (r->out_len + n + 1 > r->out_cap) {
        size_t nc = r->out_cap ? r->out_cap : 1024;
        while (nc < r->out_len + n + 1) nc *= 2;
        char *o = realloc(r->out, nc);
        if (!o) jfail(&r->e, JINJA_E_LIMIT, line, "out of memory");
        r->out = o;
        r->out_cap = nc;
    }
    memcpy(r->out + r->out_len, s, n);
    r->out_len += n;
}

/* string builder in the arena */
typedef struct sb {
    char *p;
    size_t n, cap;
} sb;
static void sb_put(rctx *r, sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        if (nc > J_MAX_OUT * 2) jfail(&r->e, JINJA_E_LIMIT, 0, "a string exceeds %zu MiB", J_MAX_OUT >> 20);
        char *np = ar_alloc(&r->ar, &r->e, nc);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(rctx *r, sb *b, const char *s) { sb_put(r, b, s, strlen(s)); }
static jstr *sb_str(rctx *r, sb *b) { return mkstr(&r->ar, &r->e, b->p ? b->p : "", b->n); }

static jv mk_str(rctx *r, const char *s, size_t n) {
    jv v = {JV_STR, {0}};
    v.u.s = mkstr(&r->ar, &r->e, s, n);
    return v;
}
static jv mk_strz(rctx *r, const char *s) { return mk_str(r, s, strlen(s)); }
static jv mk_int(int64_t i) {
    jv v = {JV_INT, {0}};
    v.u.i = i;
    return v;
}
static jv mk_float(double f) {
    jv v = {JV_FLOAT, {0}};
    v.u.f = f;
    return v;
}
static jv mk_bool(bool b) {
    jv v = {JV_BOOL, {0}};
    v.u.b = b;
    return v;
}
static jv mk_list(rctx *r, size_t cap) {
    jv v = {JV_LIST, {0}};
    v.u.l = ar_alloc(&r->ar, &r->e, sizeof *v.u.l);
    v.u.l->n = 0;
    v.u.l->tuple = false;
    v.u.l->cap = cap;
    v.u.l->v = cap ? ar_alloc(&r->ar, &r->e, cap * sizeof(jv)) : NULL;
    return v;
}
static void list_push(rctx *r, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        jv *nv = ar_alloc(&r->ar, &r->e, nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
static jv mk_dict(rctx *r, jvt t) {
    jv v = {t, {0}};
    v.u.d = ar_alloc(&r->ar, &r->e, sizeof *v.u.d);
    memset(v.u.d, 0, sizeof *v.u.d);
    return v;
}
static jv *dict_find(const jdict *d, const char *k, size_t kl) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i]->len == kl && !memcmp(d->k[i]->s, k, kl)) return &d->v[i];
    return NULL;
}
static void dict_set(rctx *r, jdict *d, jstr *k, jv x) {
    jv *p = dict_find(d, k->s, k->len);
    if (p) {
        *p = x;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        jstr **nk = ar_alloc(&r->ar, &r->e, nc * sizeof *nk);
        jv *nv = ar_alloc(&r->ar, &r->e, nc * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = x;
    d->n++;
}
static void dict_setz(rctx *r, jdict *d, const char *k, jv x) { dict_set(r, d, mkstr(&r->ar, &r->e, k, strlen(k)), x); }

static const char *type_name(jvt t) {
    static const char *const n[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "namespace", "macro", "function"};
    return n[t];
}

static bool truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

/* number of code points */
static size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
/* byte offset of code point index ci */
static size_t u8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0, c = 0;
    while (i < n) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == ci) return i;
            c++;
        }
        i++;
    }
    return n;
}

/* Python float repr: shortest round-tripping form, with ".0" on integral values */
static void fmt_float(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* Python uses exponent form only below 1e-4 or from 1e16 */
    double a = fabs(f);
    if (a >= 1e16 || (a > 0 && a < 1e-4)) {
        char *e = strchr(buf, 'e');
        if (e) { /* Python: 1e+16, 1e-05 -> 1e-05 ; C gives the same two-digit exponent */
            bool has_dot = memchr(buf, '.', (size_t)(e - buf)) != NULL;
            (void)has_dot;
        }
        return;
    }
    if (strchr(buf, 'e')) snprintf(buf, cap, "%.17f", f); /* rare: fall back to fixed */
    if (!strchr(buf, '.') && !strchr(buf, 'e')) {
        size_t l = strlen(buf);
        if (l + 2 < cap) memcpy(buf + l, ".0", 3);
    }
}

static void repr_str(rctx *r, sb *b, const jstr *s) {
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    sb_put(r, b, &q, 1);
    for (size_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char tmp[8];
        if (c == '\\') sb_puts(r, b, "\\\\");
        else if (c == (unsigned char)q) {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            sb_put(r, b, tmp, 2);
        } else if (c == '\n') sb_puts(r, b, "\\n");
        else if (c == '\r') sb_puts(r, b, "\\r");
        else if (c == '\t') sb_puts(r, b, "\\t");
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            sb_puts(r, b, tmp);
        } else
            sb_put(r, b, (const char *)&c, 1);
    }
    sb_put(r, b, &q, 1);
}

static void to_str(rctx *r, sb *b, jv v, bool repr);

static void to_str(rctx *r, sb *b, jv v, bool repr) {
    char buf[64];
    if (++r->depth > J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, 0, "values nested too deeply");
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: sb_puts(r, b, "None"); break;
    case JV_BOOL: sb_puts(r, b, v.u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        sb_puts(r, b, buf);
        break;
    case JV_FLOAT:
        fmt_float(v.u.f, buf, sizeof buf);
        sb_puts(r, b, buf);
        break;
    case JV_STR:
        if (repr) repr_str(r, b, v.u.s);
        else sb_put(r, b, v.u.s->s, v.u.s->len);
        break;
    case JV_LIST:
        sb_puts(r, b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(r, b, ", ");
            to_str(r, b, v.u.l->v[i], true);
        }
        if (v.u.l->tuple && v.u.l->n == 1) sb_puts(r, b, ",");
        sb_puts(r, b, v.u.l->tuple ? ")" : "]");
        break;
    case JV_DICT:
        sb_puts(r, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(r, b, ", ");
            repr_str(r, b, v.u.d->k[i]);
            sb_puts(r, b, ": ");
            to_str(r, b, v.u.d->v[i], true);
        }
        sb_puts(r, b, "}");
        break;
    case JV_NS: sb_puts(r, b, "<Namespace>"); break;
    case JV_MACRO: sb_puts(r, b, "<Macro>"); break;
    case JV_FUNC: sb_puts(r, b, "<function>"); break;
    }
    r->depth--;
}

static jstr *str_of(rctx *r, jv v) {
    if (v.t == JV_STR) return v.u.s;
    sb b = {0};
    to_str(r, &b, v, false);
    return sb_str(r, &b);
}

/* JSON as Python's json.dumps(ensure_ascii=..., indent=..., separators=..., sort_keys=...) */
typedef struct json_opts {
    bool ensure_ascii;
    int indent; /* -1: none */
    const char *item_sep, *key_sep;
    bool sort_keys;
} json_opts;

static void json_str(rctx *r, sb *b, const char *s, size_t n, bool ascii) {
    sb_puts(r, b, "\"");
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        char tmp[16];
        if (c == '"') sb_puts(r, b, "\\\"");
        else if (c == '\\') sb_puts(r, b, "\\\\");
        else if (c == '\n') sb_puts(r, b, "\\n");
        else if (c == '\r') sb_puts(r, b, "\\r");
        else if (c == '\t') sb_puts(r, b, "\\t");
        else if (c == '\b') sb_puts(r, b, "\\b");
        else if (c == '\f') sb_puts(r, b, "\\f");
        else if (c < 0x20 || (ascii && c == 0x7F)) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            sb_puts(r, b, tmp);
        } else if (c >= 0x80 && ascii) {
            uint32_t cp = 0xFFFD;
            size_t l = 1;
            if ((c & 0xE0) == 0xC0 && i + 1 < n) { cp = ((c & 0x1Fu) << 6) | (s[i + 1] & 0x3F); l = 2; }
            else if ((c & 0xF0) == 0xE0 && i + 2 < n) { cp = ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3F); l = 3; }
            else if ((c & 0xF8) == 0xF0 && i + 3 < n) { cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3F); l = 4; }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            sb_puts(r, b, tmp);
            i += l;
            continue;
        } else
            sb_put(r, b, (const char *)&c, 1);
        i++;
    }
    sb_puts(r, b, "\"");
}

static void json_nl(rctx *r, sb *b, const json_opts *o, int level) {
    if (o->indent < 0) return;
    sb_puts(r, b, "\n");
    for (int i = 0; i < o->indent * level; i++) sb_puts(r, b, " ");
}

static int cmp_jstr(const jstr *a, const jstr *b) {
    size_t m = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, m);
    return c ? c : (a->len < b->len ? -1 : a->len > b->len);
}

static void to_json(rctx *r, sb *b, jv v, const json_opts *o, int level, int line) {
    char buf[64];
    if (++r->depth > J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, line, "values nested too deeply");
    switch (v.t) {
    case JV_NONE: sb_puts(r, b, "null"); break;
    case JV_BOOL: sb_puts(r, b, v.u.b ? "true" : "false"); break;
    case JV_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        sb_puts(r, b, buf);
        break;
    case JV_FLOAT:
        if (isnan(v.u.f)) sb_puts(r, b, "NaN");
        else if (isinf(v.u.f)) sb_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(v.u.f, buf, sizeof buf);
            sb_puts(r, b, buf);
        }
        break;
    case JV_STR: json_str(r, b, v.u.s->s, v.u.s->len, o->ensure_ascii); break;
    case JV_LIST:
        if (!v.u.l->n) {
            sb_puts(r, b, "[]");
            break;
        }
        sb_puts(r, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(r, b, o->item_sep);
            json_nl(r, b, o, level + 1);
            to_json(r, b, v.u.l->v[i], o, level + 1, line);
        }
        json_nl(r, b, o, level);
        sb_puts(r, b, "]");
        break;
    case JV_DICT:
    case JV_NS: {
        jdict *d = v.u.d;
        if (!d->n) {
            sb_puts(r, b, "{}");
            break;
        }
        size_t *ord = ar_alloc(&r->ar, &r->e, d->n * sizeof *ord);
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort_keys)
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && cmp_jstr(d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        sb_puts(r, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i) sb_puts(r, b, o->item_sep);
            json_nl(r, b, o, level + 1);
            json_str(r, b, d->k[ord[i]]->s, d->k[ord[i]]->len, o->ensure_ascii);
            sb_puts(r, b, o->key_sep);
            to_json(r, b, d->v[ord[i]], o, level + 1, line);
        }
        json_nl(r, b, o, level);
        sb_puts(r, b, "}");
        break;
    }
    default:
        jfail(&r->e, JINJA_E_RUNTIME, line, "Object of type %s is not JSON serializable", type_name(v.t));
    }
    r->depth--;
}

/* ---- variables ---- */
static jv lookup(rctx *r, const jstr *name) {
    for (int i = r->nframes - 1; i >= r->base; i--) {
        jv *p = dict_find(&r->frames[i]->vars, name->s, name->len);
        if (p) return *p;
    }
    if (r->base > 0) { /* macros see the template's top level */
        jv *p = dict_find(&r->frames[0]->vars, name->s, name->len);
        if (p) return *p;
    }
    jv f = {JV_FUNC, {0}};
    if (!strcmp(name->s, "range")) f.u.fn = F_RANGE;
    else if (!strcmp(name->s, "namespace")) f.u.fn = F_NAMESPACE;
    else if (!strcmp(name->s, "raise_exception")) f.u.fn = F_RAISE;
    else if (!strcmp(name->s, "strftime_now")) f.u.fn = F_STRFTIME;
    else if (!strcmp(name->s, "dict")) f.u.fn = F_DICT;
    else return JUNDEF;
    return f;
}

static void assign(rctx *r, jstr *name, jv v) { dict_set(r, &r->frames[r->nframes - 1]->vars, name, v); }

static void push_frame(rctx *r, int line) {
    if (r->nframes >= J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, line, "blocks nested too deeply");
    frame *f = ar_alloc(&r->ar, &r->e, sizeof *f);
    memset(f, 0, sizeof *f);
    r->frames[r->nframes++] = f;
}

/* ---- comparisons ---- */
static bool is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }

static bool equal(rctx *r, jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num(a) == num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal(r, a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = dict_find(b.u.d, a.u.d->k[i]->s, a.u.d->k[i]->len);
            if (!o || !equal(r, a.u.d->v[i], *o)) return false;
        }
        return true;
    default: return a.u.d == b.u.d;
    }
}

static int order(rctx *r, jv a, jv b, int line, const char *op) {
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) return cmp_jstr(a.u.s, b.u.s) < 0 ? -1 : cmp_jstr(a.u.s, b.u.s) > 0;
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (!equal(r, a.u.l->v[i], b.u.l->v[i])) return order(r, a.u.l->v[i], b.u.l->v[i], line, op);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    jfail(&r->e, JINJA_E_RUNTIME, line, "'%s' not supported between %s and %s", op, type_name(a.t), type_name(b.t));
}

static bool contains(rctx *r, jv hay, jv needle, int line) {
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR) jfail(&r->e, JINJA_E_RUNTIME, line, "'in <string>' requires a string on the left, not %s", type_name(needle.t));
        return memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL || needle.u.s->len == 0;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (equal(r, hay.u.l->v[i], needle)) return true;
        return false;
    case JV_DICT:
    case JV_NS:
        if (needle.t != JV_STR) return false;
        return dict_find(hay.u.d, needle.u.s->s, needle.u.s->len) != NULL;
    case JV_UNDEF: return false;
    default: jfail(&r->e, JINJA_E_RUNTIME, line, "argument of type %s is not iterable", type_name(hay.t));
    }
}

/* items of an iterable as a list (dict: its keys; string: its characters) */
static jlist *iter_list(rctx *r, jv v, int line) {
    jv l;
    switch (v.t) {
    case JV_LIST: return v.u.l;
    case JV_UNDEF: return mk_list(r, 0).u.l;
    case JV_DICT:
        l = mk_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv k = {JV_STR, {0}};
            k.u.s = v.u.d->k[i];
            list_push(r, l.u.l, k);
        }
        return l.u.l;
    case JV_STR: {
        l = mk_list(r, 0);
        const char *s = v.u.s->s;
        size_t n = v.u.s->len, i = 0;
        while (i < n) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            list_push(r, l.u.l, mk_str(r, s + i, j - i));
            i = j;
        }
        return l.u.l;
    }
    default: jfail(&r->e, JINJA_E_RUNTIME, line, "'%s' object is not iterable", type_name(v.t));
    }
}

/* ---- evaluation ---- */
static jv eval(rctx *r, const node *n);
static int exec_body(rctx *r, node *const *body, size_t n);

typedef struct args {
    jv *pos;
    size_t npos;
    jstr **kwn;
    jv *kwv;
    size_t nkw;
} args;

static args eval_args(rctx *r, const node *call) {
    args a = {0};
    a.npos = call->n;
    a.nkw = call->nn;
    if (a.npos) a.pos = ar_alloc(&r->ar, &r->e, a.npos * sizeof *a.pos);
    for (size_t i = 0; i < a.npos; i++) a.pos[i] = eval(r, call->l[i]);
    if (a.nkw) {
        a.kwv = ar_alloc(&r->ar, &r->e, a.nkw * sizeof *a.kwv);
        a.kwn = call->names;
    }
    for (size_t i = 0; i < a.nkw; i++) a.kwv[i] = eval(r, call->l2[i]);
    return a;
}

/* argument i (positional) or keyword `name`; JUNDEF when absent */
static jv arg(const args *a, size_t i, const char *name) {
    if (i < a->npos) return a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k]->s, name)) return a->kwv[k];
    return JUNDEF;
}

static void want_str(rctx *r, jv v, int line, const char *what) {
    if (v.t != JV_STR) jfail(&r->e, JINJA_E_RUNTIME, line, "%s expects a string, got %s", what, type_name(v.t));
}

static bool in_chars(const char *set, size_t sl, const char *s, size_t cl) {
    for (size_t i = 0; i + cl <= sl;) {
        size_t j = i + 1;
        while (j < sl && ((unsigned char)set[j] & 0xC0) == 0x80) j++;
        if (j - i == cl && !memcmp(set + i, s, cl)) return true;
        i = j;
    }
    return false;
}

static bool py_space(const char *s, size_t avail, size_t *cl) {
    unsigned char c = (unsigned char)s[0];
    *cl = 1;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
    static const char *const ws[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82",
                                     "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87",
                                     "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9",
                                     "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80", NULL};
    for (int i = 0; ws[i]; i++) {
        size_t l = strlen(ws[i]);
        if (l <= avail && !memcmp(s, ws[i], l)) {
            *cl = l;
            return true;
        }
    }
    return false;
}

/* Python str.strip / lstrip / rstrip (chars: NULL for whitespace) */
static jv py_strip(rctx *r, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t b = 0, e = s->len;
    if (left)
        while (b < e) {
            size_t cl = 1;
            while (b + cl < e && ((unsigned char)s->s[b + cl] & 0xC0) == 0x80) cl++;
            bool m = chars ? in_chars(chars->s, chars->len, s->s + b, cl) : py_space(s->s + b, e - b, &cl);
            if (!m) break;
            b += cl;
        }
    if (right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t cl = e - st, dummy;
            bool m = chars ? in_chars(chars->s, chars->len, s->s + st, cl) : (py_space(s->s + st, cl, &dummy) && dummy == cl);
            if (!m) break;
            e = st;
        }
    return mk_str(r, s->s + b, e - b);
}

static jv py_split(rctx *r, const jstr *s, jv sep, int64_t maxsplit, int line) {
    jv l = mk_list(r, 0);
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) {
        size_t i = 0, n = s->len, cl;
        int64_t splits = 0;
        for (;;) {
            while (i < n && py_space(s->s + i, n - i, &cl)) i += cl;
            if (i >= n) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = n;
                while (e > i) { /* rstrip the remainder */
                    size_t st = e - 1;
                    while (st > i && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
                    size_t d;
                    if (!(py_space(s->s + st, e - st, &d) && d == e - st)) break;
                    e = st;
                }
                list_push(r, l.u.l, mk_str(r, s->s + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n && !py_space(s->s + j, n - j, &cl)) j++;
            list_push(r, l.u.l, mk_str(r, s->s + i, j - i));
            splits++;
            i = j;
        }
        return l;
    }
    want_str(r, sep, line, "split()");
    if (sep.u.s->len == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "split(): empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *f = (maxsplit < 0 || splits < maxsplit) ? memmem(s->s + i, s->len - i, sep.u.s->s, sep.u.s->len) : NULL;
        if (!f) {
            list_push(r, l.u.l, mk_str(r, s->s + i, s->len - i));
            break;
        }
        list_push(r, l.u.l, mk_str(r, s->s + i, (size_t)(f - (s->s + i))));
        i = (size_t)(f - s->s) + sep.u.s->len;
        splits++;
        step(r, line);
    }
    return l;
}

static jv py_replace(rctx *r, const jstr *s, jv a, jv b, int64_t count, int line) {
    want_str(r, a, line, "replace()");
    want_str(r, b, line, "replace()");
    sb o = {0};
    size_t i = 0;
    int64_t done = 0;
    if (a.u.s->len == 0) { /* Python inserts between characters */
        while (i <= s->len && (count < 0 || done < count)) {
            sb_put(r, &o, b.u.s->s, b.u.s->len);
            done++;
            if (i == s->len) {
                i++;
                break;
            }
            size_t j = i + 1;
            while (j < s->len && ((unsigned char)s->s[j] & 0xC0) == 0x80) j++;
            sb_put(r, &o, s->s + i, j - i);
            i = j;
        }
        if (i < s->len) sb_put(r, &o, s->s + i, s->len - i);
        jv v = {JV_STR, {0}};
        v.u.s = sb_str(r, &o);
        return v;
    }
    for (;;) {
        const char *f = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, a.u.s->s, a.u.s->len) : NULL;
        if (!f) {
            sb_put(r, &o, s->s + i, s->len - i);
            break;
        }
        sb_put(r, &o, s->s + i, (size_t)(f - (s->s + i)));
        sb_put(r, &o, b.u.s->s, b.u.s->len);
        i = (size_t)(f - s->s) + a.u.s->len;
        done++;
        step(r, line);
    }
    jv v = {JV_STR, {0}};
    v.u.s = sb_str(r, &o);
    return v;
}

static jv case_map(rctx *r, const jstr *s, int mode) { /* 0 lower, 1 upper, 2 capitalize, 3 title (ASCII) */
    jstr *o = mkstr(&r->ar, &r->e, s->s, s->len);
    bool word_start = true;
    for (size_t i = 0; i < o->len; i++) {
        char c = o->s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (mode == 0 || (mode == 2 && i > 0) || (mode == 3 && !word_start)) {
            if (c >= 'A' && c <= 'Z') o->s[i] = (char)(c + 32);
        } else if (mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start)) {
            if (c >= 'a' && c <= 'z') o->s[i] = (char)(c - 32);
        }
        word_start = !alpha && !((unsigned char)c & 0x80);
    }
    jv v = {JV_STR, {0}};
    v.u.s = o;
    return v;
}

static int64_t as_int(rctx *r, jv v, int line, const char *what) {
    if (v.t == JV_INT) return v.u.i;
    if (v.t == JV_BOOL) return v.u.b;
    jfail(&r->e, JINJA_E_RUNTIME, line, "%s expects an integer, got %s", what, type_name(v.t));
}

/* str / dict / list methods; *handled = false when obj has no such method */
static jv call_method(rctx *r, jv obj, const jstr *name, const args *a, int line, bool *handled) {
    const char *m = name->s;
    *handled = true;
    if (obj.t == JV_STR) {
        const jstr *s = obj.u.s;
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            jv p = arg(a, 0, NULL);
            jlist one = {1, 1, &p, false};
            jlist *alts = p.t == JV_LIST ? p.u.l : &one;
            for (size_t i = 0; i < alts->n; i++) {
                jv x = alts->v[i];
                want_str(r, x, line, m);
                if (x.u.s->len > s->len) continue;
                const char *at = m[0] == 's' ? s->s : s->s + s->len - x.u.s->len;
                if (!memcmp(at, x.u.s->s, x.u.s->len)) return mk_bool(true);
            }
            return mk_bool(false);
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            jv c = arg(a, 0, "chars");
            if (c.t != JV_UNDEF && c.t != JV_NONE) want_str(r, c, line, m);
            return py_strip(r, s, c.t == JV_STR ? c.u.s : NULL, m[0] != 'r', m[0] != 'l');
        }
        if (!strcmp(m, "split")) {
            jv ms = arg(a, 1, "maxsplit");
            return py_split(r, s, arg(a, 0, "sep"), ms.t == JV_UNDEF ? -1 : as_int(r, ms, line, "split()"), line);
        }
        if (!strcmp(m, "replace")) {
            jv c = arg(a, 2, "count");
            return py_replace(r, s, arg(a, 0, NULL), arg(a, 1, NULL), c.t == JV_UNDEF ? -1 : as_int(r, c, line, "replace()"), line);
        }
        if (!strcmp(m, "lower")) return case_map(r, s, 0);
        if (!strcmp(m, "upper")) return case_map(r, s, 1);
        if (!strcmp(m, "capitalize")) return case_map(r, s, 2);
        if (!strcmp(m, "title")) return case_map(r, s, 3);
        if (!strcmp(m, "find") || !strcmp(m, "count")) {
            jv x = arg(a, 0, NULL);
            want_str(r, x, line, m);
            if (m[0] == 'f') {
                const char *f = memmem(s->s, s->len, x.u.s->s, x.u.s->len);
                return mk_int(f ? (int64_t)u8_count(s->s, (size_t)(f - s->s)) : -1);
            }
            if (!x.u.s->len) return mk_int((int64_t)u8_count(s->s, s->len) + 1);
            int64_t c = 0;
            const char *p = s->s, *e = s->s + s->len;
            while ((p = memmem(p, (size_t)(e - p), x.u.s->s, x.u.s->len))) {
                c++;
                p += x.u.s->len;
            }
            return mk_int(c);
        }
        if (!strcmp(m, "join")) {
            jlist *l = iter_list(r, arg(a, 0, NULL), line);
            sb o = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i) sb_put(r, &o, s->s, s->len);
                want_str(r, l->v[i], line, "join()");
                sb_put(r, &o, l->v[i].u.s->s, l->v[i].u.s->len);
            }
            jv v = {JV_STR, {0}};
            v.u.s = sb_str(r, &o);
            return v;
        }
        if (!strcmp(m, "isdigit") || !strcmp(m, "isspace") || !strcmp(m, "isalpha")) {
            if (!s->len) return mk_bool(false);
            for (size_t i = 0; i < s->len; i++) {
                char c = s->s[i];
                bool ok = m[2] == 'd' ? (c >= '0' && c <= '9') : m[2] == 's' ? is_ws(c) : ((c | 32) >= 'a' && (c | 32) <= 'z');
                if (!ok) return mk_bool(false);
            }
            return mk_bool(true);
        }
        jfail(&r->e, JINJA_E_UNSUPPORTED, line, "the string method '%s' is not supported", m);
    }
    if (obj.t == JV_DICT) {
        jdict *d = obj.u.d;
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            jv l = mk_list(r, d->n);
            for (size_t i = 0; i < d->n; i++) {
                jv k = {JV_STR, {0}};
                k.u.s = d->k[i];
                if (m[0] == 'k') list_push(r, l.u.l, k);
                else if (m[0] == 'v') list_push(r, l.u.l, d->v[i]);
                else {
                    jv pair = mk_list(r, 2);
                    pair.u.l->tuple = true;
                    list_push(r, pair.u.l, k);
                    list_push(r, pair.u.l, d->v[i]);
                    list_push(r, l.u.l, pair);
                }
            }
            return l;
        }
        if (!strcmp(m, "get")) {
            jv k = arg(a, 0, NULL);
            if (k.t == JV_STR) {
                jv *p = dict_find(d, k.u.s->s, k.u.s->len);
                if (p) return *p;
            }
            jv def = arg(a, 1, "default");
            return def.t == JV_UNDEF ? JNONE : def;
        }
        /* a key named like the method: a plain attribute call would fail anyway */
        *handled = false;
        return JUNDEF;
    }
    *handled = false;
    return JUNDEF;
}

static jv get_attr(rctx *r, jv obj, const char *name, size_t nl, int line) {
    if (obj.t == JV_UNDEF) jfail(&r->e, JINJA_E_RUNTIME, line, "'%.*s' of an undefined value", (int)nl, name);
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jv *p = dict_find(obj.u.d, name, nl);
        return p ? *p : JUNDEF;
    }
    return JUNDEF;
}

static jv get_item(rctx *r, jv obj, jv key, int line) {
    if (obj.t == JV_UNDEF) jfail(&r->e, JINJA_E_RUNTIME, line, "subscript of an undefined value");
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        if (key.t != JV_STR) return JUNDEF;
        jv *p = dict_find(obj.u.d, key.u.s->s, key.u.s->len);
        return p ? *p : JUNDEF;
    }
    if (obj.t == JV_LIST || obj.t == JV_STR) {
        if (key.t != JV_INT && key.t != JV_BOOL) return JUNDEF;
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        int64_t n = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)u8_count(obj.u.s->s, obj.u.s->len);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return JUNDEF;
        if (obj.t == JV_LIST) return obj.u.l->v[i];
        size_t b = u8_offset(obj.u.s->s, obj.u.s->len, (size_t)i), e = u8_offset(obj.u.s->s, obj.u.s->len, (size_t)i + 1);
        return mk_str(r, obj.u.s->s + b, e - b);
    }
    return JUNDEF;
}

static jv do_slice(rctx *r, jv obj, jv a, jv b, jv c, int line) {
    if (obj.t != JV_LIST && obj.t != JV_STR) jfail(&r->e, JINJA_E_RUNTIME, line, "cannot slice %s", type_name(obj.t));
    int64_t n = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)u8_count(obj.u.s->s, obj.u.s->len);
    int64_t st = (c.t == JV_UNDEF || c.t == JV_NONE) ? 1 : as_int(r, c, line, "slice step");
    if (st == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "slice step cannot be zero");
    int64_t lo, hi;
    if (st > 0) {
        lo = (a.t == JV_UNDEF || a.t == JV_NONE) ? 0 : as_int(r, a, line, "slice index");
        hi = (b.t == JV_UNDEF || b.t == JV_NONE) ? n : as_int(r, b, line, "slice index");
        if (lo < 0) lo += n;
        if (hi < 0) hi += n;
        lo = lo < 0 ? 0 : lo > n ? n : lo;
        hi = hi < 0 ? 0 : hi > n ? n : hi;
    } else {
        lo = (a.t == JV_UNDEF || a.t == JV_NONE) ? n - 1 : as_int(r, a, line, "slice index");
        hi = (b.t == JV_UNDEF || b.t == JV_NONE) ? -1 : as_int(r, b, line, "slice index");
        if (lo < 0) lo += n;
        if (b.t != JV_UNDEF && b.t != JV_NONE && hi < 0) hi += n;
        lo = lo < -1 ? -1 : lo > n - 1 ? n - 1 : lo;
        hi = hi < -1 ? -1 : hi > n - 1 ? n - 1 : hi;
    }
    jv out = obj.t == JV_LIST ? mk_list(r, 0) : JUNDEF;
    sb s = {0};
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        if (obj.t == JV_LIST) list_push(r, out.u.l, obj.u.l->v[i]);
        else {
            size_t bo = u8_offset(obj.u.s->s, obj.u.s->len, (size_t)i), eo = u8_offset(obj.u.s->s, obj.u.s->len, (size_t)i + 1);
            sb_put(r, &s, obj.u.s->s + bo, eo - bo);
        }
        step(r, line);
    }
    if (obj.t == JV_STR) {
        out.t = JV_STR;
        out.u.s = sb_str(r, &s);
    }
    return out;
}

static int64_t length_of(rctx *r, jv v, int line) {
    switch (v.t) {
    case JV_STR: return (int64_t)u8_count(v.u.s->s, v.u.s->len);
    case JV_LIST: return (int64_t)v.u.l->n;
    case JV_DICT: case JV_NS: return (int64_t)v.u.d->n;
    case JV_UNDEF: return 0;
    default: jfail(&r->e, JINJA_E_RUNTIME, line, "object of type %s has no length", type_name(v.t));
    }
}

static jv call_macro(rctx *r, const node *m, const args *a, int line);
static bool run_test(rctx *r, jv v, const char *name, const args *a, int line);

static jv apply_filter(rctx *r, jv v, const char *f, const args *a, int line) {
    if (!strcmp(f, "trim") || !strcmp(f, "strip")) {
        want_str(r, v, line, "trim");
        jv c = arg(a, 0, "chars");
        return py_strip(r, v.u.s, c.t == JV_STR ? c.u.s : NULL, true, true);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) return mk_int(length_of(r, v, line));
    if (!strcmp(f, "string")) {
        jv s = {JV_STR, {0}};
        s.u.s = str_of(r, v);
        return s;
    }
    if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape")) {
        if (f[0] == 'e') jfail(&r->e, JINJA_E_UNSUPPORTED, line, "the '%s' filter is not supported", f);
        return v;
    }
    if (!strcmp(f, "tojson")) {
        json_opts o = {false, -1, ", ", ": ", false};
        jv ea = arg(a, 0, "ensure_ascii"), in = arg(a, 1, "indent"), sep = arg(a, 2, "separators"), sk = arg(a, 3, "sort_keys");
        /* positional order of HF's tojson(x, ensure_ascii, indent, separators, sort_keys) */
        if (ea.t != JV_UNDEF) o.ensure_ascii = truthy(ea);
        if (in.t == JV_INT) {
            o.indent = (int)(in.u.i < 0 ? 0 : in.u.i > 64 ? 64 : in.u.i);
            o.item_sep = ",";
        }
        if (sep.t == JV_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == JV_STR && sep.u.l->v[1].t == JV_STR) {
            o.item_sep = sep.u.l->v[0].u.s->s;
            o.key_sep = sep.u.l->v[1].u.s->s;
        }
        if (sk.t != JV_UNDEF) o.sort_keys = truthy(sk);
        if (v.t == JV_UNDEF) jfail(&r->e, JINJA_E_RUNTIME, line, "tojson of an undefined value");
        sb b = {0};
        to_json(r, &b, v, &o, 0, line);
        jv s = {JV_STR, {0}};
        s.u.s = sb_str(r, &b);
        return s;
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") || !strcmp(f, "title")) {
        want_str(r, v, line, f);
        return case_map(r, v.u.s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 'c' ? 2 : 3);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jlist *l = iter_list(r, v, line);
        if (!l->n) return JUNDEF;
        return f[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(f, "join")) {
        jlist *l = iter_list(r, v, line);
        jv sep = arg(a, 0, "d"), attr = arg(a, 1, "attribute");
        sb o = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i && sep.t == JV_STR) sb_put(r, &o, sep.u.s->s, sep.u.s->len);
            jv x = l->v[i];
            if (attr.t == JV_STR) x = get_attr(r, x, attr.u.s->s, attr.u.s->len, line);
            jstr *s = str_of(r, x);
            sb_put(r, &o, s->s, s->len);
        }
        jv s = {JV_STR, {0}};
        s.u.s = sb_str(r, &o);
        return s;
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv def = arg(a, 0, "default_value"), boolean = arg(a, 1, "boolean");
        if (v.t == JV_UNDEF || (truthy(boolean) && !truthy(v))) return def.t == JV_UNDEF ? mk_str(r, "", 0) : def;
        return v;
    }
    if (!strcmp(f, "replace")) {
        want_str(r, v, line, "replace");
        jv c = arg(a, 2, "count");
        return py_replace(r, v.u.s, arg(a, 0, "old"), arg(a, 1, "new"), c.t == JV_UNDEF || c.t == JV_NONE ? -1 : as_int(r, c, line, "replace"), line);
    }
    if (!strcmp(f, "list")) {
        jlist *l = iter_list(r, v, line);
        jv o = mk_list(r, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(r, o.u.l, l->v[i]);
        return o;
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JV_STR) return do_slice(r, v, JUNDEF, JUNDEF, mk_int(-1), line);
        jlist *l = iter_list(r, v, line);
        jv o = mk_list(r, l->n);
        for (size_t i = l->n; i-- > 0;) list_push(r, o.u.l, l->v[i]);
        return o;
    }
    if (!strcmp(f, "items")) {
        if (v.t == JV_UNDEF) return mk_list(r, 0);
        if (v.t != JV_DICT) jfail(&r->e, JINJA_E_RUNTIME, line, "items expects a mapping, got %s", type_name(v.t));
        bool h;
        static jstr *items_name = NULL;
        (void)items_name;
        jstr *nm = mkstr(&r->ar, &r->e, "items", 5);
        return call_method(r, v, nm, a, line, &h);
    }
    if (!strcmp(f, "int")) {
        if (v.t == JV_INT) return v;
        if (v.t == JV_FLOAT) return mk_int((int64_t)v.u.f);
        if (v.t == JV_BOOL) return mk_int(v.u.b);
        if (v.t == JV_STR) {
            char *e;
            long long x = strtoll(v.u.s->s, &e, 10);
            return mk_int(*e == 0 && e != v.u.s->s ? x : 0);
        }
        return mk_int(0);
    }
    if (!strcmp(f, "float")) {
        if (is_num(v)) return mk_float(num(v));
        if (v.t == JV_STR) {
            char *e;
            double x = strtod(v.u.s->s, &e);
            return mk_float(*e == 0 && e != v.u.s->s ? x : 0.0);
        }
        return mk_float(0.0);
    }
    if (!strcmp(f, "abs")) {
        if (v.t == JV_INT) return mk_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return mk_float(fabs(v.u.f));
        jfail(&r->e, JINJA_E_RUNTIME, line, "abs of %s", type_name(v.t));
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        jlist *l = iter_list(r, v, line);
        jv attr = arg(a, 0, NULL);
        want_str(r, attr, line, f);
        jv test = arg(a, 1, NULL);
        args ta = {0};
        if (a->npos > 2) {
            ta.pos = a->pos + 2;
            ta.npos = a->npos - 2;
        }
        jv o = mk_list(r, 0);
        for (size_t i = 0; i < l->n; i++) {
            jv x = get_attr(r, l->v[i], attr.u.s->s, attr.u.s->len, line);
            bool ok;
            if (test.t == JV_UNDEF) ok = truthy(x);
            else {
                want_str(r, test, line, f);
                ok = run_test(r, x, test.u.s->s, &ta, line);
            }
            if (ok == (f[0] == 's')) list_push(r, o.u.l, l->v[i]);
        }
        return o;
    }
    if (!strcmp(f, "map")) {
        jlist *l = iter_list(r, v, line);
        jv attr = arg(a, 99, "attribute");
        if (attr.t != JV_STR) jfail(&r->e, JINJA_E_UNSUPPORTED, line, "map() is supported with attribute= only");
        jv o = mk_list(r, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(r, o.u.l, get_attr(r, l->v[i], attr.u.s->s, attr.u.s->len, line));
        return o;
    }
    jfail(&r->e, JINJA_E_UNSUPPORTED, line, "the '%s' filter is not supported", f);
}

static bool run_test(rctx *r, jv v, const char *t, const args *a, int line) {
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "string")) return v.t == JV_STR;
    if (!strcmp(t, "number")) return v.t == JV_INT || v.t == JV_FLOAT;
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.u.b;
    if (!strcmp(t, "mapping")) return v.t == JV_DICT;
    if (!strcmp(t, "iterable")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR || v.t == JV_UNDEF;
    if (!strcmp(t, "sequence")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR;
    if (!strcmp(t, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
    if (!strcmp(t, "odd") || !strcmp(t, "even")) return (as_int(r, v, line, t) & 1) == (t[0] == 'o');
    if (!strcmp(t, "divisibleby")) {
        int64_t d = as_int(r, arg(a, 0, "num"), line, t);
        return d != 0 && as_int(r, v, line, t) % d == 0;
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        want_str(r, v, line, t);
        for (size_t i = 0; i < v.u.s->len; i++) {
            char c = v.u.s->s[i];
            if (t[0] == 'l' ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
        }
        return true;
    }
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==") || !strcmp(t, "sameas")) return equal(r, v, arg(a, 0, NULL));
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !equal(r, v, arg(a, 0, NULL));
    if (!strcmp(t, "lt") || !strcmp(t, "<")) return order(r, v, arg(a, 0, NULL), line, "<") < 0;
    if (!strcmp(t, "gt") || !strcmp(t, ">")) return order(r, v, arg(a, 0, NULL), line, ">") > 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return order(r, v, arg(a, 0, NULL), line, "<=") <= 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return order(r, v, arg(a, 0, NULL), line, ">=") >= 0;
    if (!strcmp(t, "in")) return contains(r, arg(a, 0, NULL), v, line);
    jfail(&r->e, JINJA_E_UNSUPPORTED, line, "the '%s' test is not supported", t);
}

static jv call_func(rctx *r, int fn, const args *a, int line) {
    switch (fn) {
    case F_RANGE: {
        int64_t lo = 0, hi, st = 1;
        if (a->npos == 1) hi = as_int(r, a->pos[0], line, "range()");
        else if (a->npos == 2 || a->npos == 3) {
            lo = as_int(r, a->pos[0], line, "range()");
            hi = as_int(r, a->pos[1], line, "range()");
            if (a->npos == 3) st = as_int(r, a->pos[2], line, "range()");
        } else
            jfail(&r->e, JINJA_E_RUNTIME, line, "range() takes 1 to 3 arguments");
        if (st == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "range() step must not be zero");
        double cnt = st > 0 ? ((double)hi - (double)lo) / (double)st : ((double)lo - (double)hi) / (double)-st;
        if (cnt > J_MAX_RANGE) jfail(&r->e, JINJA_E_LIMIT, line, "range() of more than %d items", J_MAX_RANGE);
        jv l = mk_list(r, cnt > 0 ? (size_t)ceil(cnt) : 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) list_push(r, l.u.l, mk_int(i));
        return l;
    }
    case F_NAMESPACE:
    case F_DICT: {
        jv ns = mk_dict(r, fn == F_NAMESPACE ? JV_NS : JV_DICT);
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].t != JV_DICT && a->pos[i].t != JV_NS) jfail(&r->e, JINJA_E_RUNTIME, line, "%s() takes keyword arguments or a mapping", fn == F_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < a->pos[i].u.d->n; k++) dict_set(r, ns.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
        }
        for (size_t i = 0; i < a->nkw; i++) dict_set(r, ns.u.d, a->kwn[i], a->kwv[i]);
        return ns;
    }
    case F_RAISE: {
        jstr *m = a->npos ? str_of(r, a->pos[0]) : mkstr(&r->ar, &r->e, "", 0);
        jfail(&r->e, JINJA_E_RAISED, line, "raise_exception: %s", m->s);
    }
    case F_STRFTIME: {
        jv f = arg(a, 0, NULL);
        want_str(r, f, line, "strftime_now()");
        char buf[256];
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(buf, sizeof buf, f.u.s->s, &tmv);
        return mk_str(r, buf, n);
    }
    default: break;
    }
    jfail(&r->e, JINJA_E_RUNTIME, line, "not callable");
}

static jv binop(rctx *r, int op, jv a, jv b, int line) {
    char ops[3] = {(char)op, 0, 0};
    if (op == '~') {
        jstr *x = str_of(r, a), *y = str_of(r, b);
        sb s = {0};
        sb_put(r, &s, x->s, x->len);
        sb_put(r, &s, y->s, y->len);
        jv v = {JV_STR, {0}};
        v.u.s = sb_str(r, &s);
        return v;
    }
    switch (op) {
    case '=': return mk_bool(equal(r, a, b));
    case '!': return mk_bool(!equal(r, a, b));
    case '<': return mk_bool(order(r, a, b, line, "<") < 0);
    case 'l': return mk_bool(order(r, a, b, line, "<=") <= 0);
    case '>': return mk_bool(order(r, a, b, line, ">") > 0);
    case 'g': return mk_bool(order(r, a, b, line, ">=") >= 0);
    case 'i': return mk_bool(contains(r, b, a, line));
    case 'n': return mk_bool(!contains(r, b, a, line));
    default: break;
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) jfail(&r->e, JINJA_E_RUNTIME, line, "an undefined value in an arithmetic expression");
    if (op == '+' && a.t == JV_STR && b.t == JV_STR) {
        sb s = {0};
        sb_put(r, &s, a.u.s->s, a.u.s->len);
        sb_put(r, &s, b.u.s->s, b.u.s->len);
        jv v = {JV_STR, {0}};
        v.u.s = sb_str(r, &s);
        return v;
    }
    if (op == '+' && a.t == JV_LIST && b.t == JV_LIST) {
        jv l = mk_list(r, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(r, l.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(r, l.u.l, b.u.l->v[i]);
        return l;
    }
    if (op == '*' && ((a.t == JV_STR && b.t == JV_INT) || (a.t == JV_INT && b.t == JV_STR))) {
        jv s = a.t == JV_STR ? a : b;
        int64_t k = a.t == JV_INT ? a.u.i : b.u.i;
        if (k > 0 && (double)k * (double)s.u.s->len > (double)J_MAX_OUT) jfail(&r->e, JINJA_E_LIMIT, line, "string repetition too large");
        sb o = {0};
        for (int64_t i = 0; i < k; i++) sb_put(r, &o, s.u.s->s, s.u.s->len);
        jv v = {JV_STR, {0}};
        v.u.s = sb_str(r, &o);
        return v;
    }
    if (op == '%' && a.t == JV_STR) jfail(&r->e, JINJA_E_UNSUPPORTED, line, "string formatting with %% is not supported");
    if (!is_num(a) || !is_num(b)) {
        if (op == 'F') memcpy(ops, "//", 3);
        if (op == 'P') memcpy(ops, "**", 3);
        jfail(&r->e, JINJA_E_RUNTIME, line, "unsupported operand types for %s: %s and %s", ops, type_name(a.t), type_name(b.t));
    }
    bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t x = a.t == JV_INT ? a.u.i : a.t == JV_BOOL ? a.u.b : 0, y = b.t == JV_INT ? b.u.i : b.t == JV_BOOL ? b.u.b : 0;
    double fx = num(a), fy = num(b);
    switch (op) {
    case '+':
        if (ints) {
            int64_t z;
            if (__builtin_add_overflow(x, y, &z)) return mk_float(fx + fy);
            return mk_int(z);
        }
        return mk_float(fx + fy);
    case '-':
        if (ints) {
            int64_t z;
            if (__builtin_sub_overflow(x, y, &z)) return mk_float(fx - fy);
            return mk_int(z);
        }
        return mk_float(fx - fy);
    case '*':
        if (ints) {
            int64_t z;
            if (__builtin_mul_overflow(x, y, &z)) return mk_float(fx * fy);
            return mk_int(z);
        }
        return mk_float(fx * fy);
    case '/':
        if (fy == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "division by zero");
        return mk_float(fx / fy);
    case 'F':
    case '%':
        if (ints) {
            if (y == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) return op == 'F' ? mk_float(-(double)x) : mk_int(0);
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return op == 'F' ? mk_int(q) : mk_int(m);
        }
        if (fy == 0) jfail(&r->e, JINJA_E_RUNTIME, line, "float division or modulo by zero");
        if (op == 'F') return mk_float(floor(fx / fy));
        {
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
            return mk_float(m);
        }
    case 'P':
        if (ints && y >= 0) {
            double p = pow(fx, fy);
            if (fabs(p) < 9.2e18) {
                int64_t z = 1;
                for (int64_t i = 0; i < y; i++) z *= x;
                return mk_int(z);
            }
            return mk_float(p);
        }
        return mk_float(pow(fx, fy));
    default: break;
    }
    jfail(&r->e, JINJA_E_RUNTIME, line, "bad operator");
}

static jv eval(rctx *r, const node *n) {
    step(r, n->line);
    if (++r->depth > J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, n->line, "evaluation nested too deeply");
    jv v = JUNDEF;
    switch (n->k) {
    case E_LIT: v = n->lit; break;
    case E_VAR: v = lookup(r, n->s); break;
    case E_ATTR: {
        jv o = eval(r, n->a);
        v = get_attr(r, o, n->s->s, n->s->len, n->line);
        break;
    }
    case E_ITEM: {
        jv o = eval(r, n->a);
        jv k = eval(r, n->b);
        v = get_item(r, o, k, n->line);
        break;
    }
    case E_SLICE: {
        jv o = eval(r, n->a);
        v = do_slice(r, o, n->b ? eval(r, n->b) : JUNDEF, n->c ? eval(r, n->c) : JUNDEF, n->d ? eval(r, n->d) : JUNDEF, n->line);
        break;
    }
    case E_CALL: {
        if (n->a->k == E_ATTR) {
            jv o = eval(r, n->a->a);
            args a = eval_args(r, n);
            bool handled = false;
            if (o.t == JV_UNDEF) jfail(&r->e, JINJA_E_RUNTIME, n->line, "'%s' of an undefined value", n->a->s->s);
            v = call_method(r, o, n->a->s, &a, n->line, &handled);
            if (handled) break;
            jv f = get_attr(r, o, n->a->s->s, n->a->s->len, n->line);
            if (f.t == JV_MACRO) v = call_macro(r, f.u.m, &a, n->line);
            else if (f.t == JV_FUNC) v = call_func(r, f.u.fn, &a, n->line);
            else if (o.t == JV_LIST || o.t == JV_STR || o.t == JV_DICT)
                jfail(&r->e, JINJA_E_UNSUPPORTED, n->line, "the %s method '%s' is not supported", type_name(o.t), n->a->s->s);
            else
                jfail(&r->e, JINJA_E_RUNTIME, n->line, "'%s' is not callable", n->a->s->s);
            break;
        }
        jv f = eval(r, n->a);
        args a = eval_args(r, n);
        if (f.t == JV_MACRO) v = call_macro(r, f.u.m, &a, n->line);
        else if (f.t == JV_FUNC) v = call_func(r, f.u.fn, &a, n->line);
        else if (f.t == JV_UNDEF && n->a->k == E_VAR)
            jfail(&r->e, JINJA_E_UNSUPPORTED, n->line, "the function '%s' is not defined", n->a->s->s);
        else
            jfail(&r->e, JINJA_E_RUNTIME, n->line, "a %s is not callable", type_name(f.t));
        break;
    }
    case E_FILTER: {
        jv x = eval(r, n->a);
        args a = eval_args(r, n);
        v = apply_filter(r, x, n->s->s, &a, n->line);
        break;
    }
    case E_TEST: {
        jv x = eval(r, n->a);
        args a = eval_args(r, n);
        v = mk_bool(run_test(r, x, n->s->s, &a, n->line) != n->neg);
        break;
    }
    case E_NEG:
    case E_POS: {
        jv x = eval(r, n->a);
        if (x.t == JV_INT) v = n->k == E_NEG ? (x.u.i == INT64_MIN ? mk_float(9223372036854775808.0) : mk_int(-x.u.i)) : x;
        else if (x.t == JV_FLOAT) v = mk_float(n->k == E_NEG ? -x.u.f : x.u.f);
        else if (x.t == JV_BOOL) v = mk_int(n->k == E_NEG ? -(int64_t)x.u.b : x.u.b);
        else jfail(&r->e, JINJA_E_RUNTIME, n->line, "bad operand type for unary %c: %s", n->k == E_NEG ? '-' : '+', type_name(x.t));
        break;
    }
    case E_NOT: v = mk_bool(!truthy(eval(r, n->a))); break;
    case E_AND: {
        jv x = eval(r, n->a);
        v = truthy(x) ? eval(r, n->b) : x;
        break;
    }
    case E_OR: {
        jv x = eval(r, n->a);
        v = truthy(x) ? x : eval(r, n->b);
        break;
    }
    case E_BIN: {
        jv x = eval(r, n->a);
        jv y = eval(r, n->b);
        v = binop(r, n->op, x, y, n->line);
        break;
    }
    case E_COND: v = truthy(eval(r, n->a)) ? eval(r, n->b) : (n->c ? eval(r, n->c) : JUNDEF); break;
    case E_LIST:
        v = mk_list(r, n->n);
        v.u.l->tuple = n->op == 1;
        for (size_t i = 0; i < n->n; i++) list_push(r, v.u.l, eval(r, n->l[i]));
        break;
    case E_DICT:
        v = mk_dict(r, JV_DICT);
        for (size_t i = 0; i < n->n; i++) {
            jv k = eval(r, n->l[i]);
            if (k.t != JV_STR) jfail(&r->e, JINJA_E_UNSUPPORTED, n->line, "dict keys other than strings are not supported");
            dict_set(r, v.u.d, k.u.s, eval(r, n->l2[i]));
        }
        break;
    default: jfail(&r->e, JINJA_E_RUNTIME, n->line, "bad expression node");
    }
    r->depth--;
    return v;
}

static jv call_macro(rctx *r, const node *m, const args *a, int line) {
    if (a->npos > m->nn) jfail(&r->e, JINJA_E_RUNTIME, line, "macro '%s' takes %zu arguments, %zu given", m->s->s, m->nn, a->npos);
    int saved_base = r->base, saved_n = r->nframes;
    /* the arguments and defaults are evaluated in the caller's scope */
    jv *vals = m->nn ? ar_alloc(&r->ar, &r->e, m->nn * sizeof *vals) : NULL;
    for (size_t i = 0; i < m->nn; i++) {
        jv x = arg(a, i, m->names[i]->s);
        if (x.t == JV_UNDEF && m->l2[i]) x = eval(r, m->l2[i]);
        vals[i] = x;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->nn; i++) known = known || !strcmp(a->kwn[k]->s, m->names[i]->s);
        if (!known) jfail(&r->e, JINJA_E_RUNTIME, line, "macro '%s' has no parameter '%s'", m->s->s, a->kwn[k]->s);
    }
    push_frame(r, line);
    r->base = r->nframes - 1;
    for (size_t i = 0; i < m->nn; i++) assign(r, m->names[i], vals[i]);
    /* render the body into its own buffer */
    capture_begin(r, line);
    int rc = exec_body(r, m->l, m->n);
    (void)rc;
    jv res = capture_end(r);
    r->nframes = saved_n;
    r->base = saved_base;
    return res;
}

enum { X_NORMAL = 0, X_BREAK, X_CONTINUE };

static int exec_node(rctx *r, const node *n) {
    step(r, n->line);
    switch (n->k) {
    case N_TEXT: out_put(r, n->s->s, n->s->len, n->line); return X_NORMAL;
    case N_OUT: {
        jv v = eval(r, n->a);
        if (v.t == JV_STR) out_put(r, v.u.s->s, v.u.s->len, n->line);
        else {
            jstr *s = str_of(r, v);
            out_put(r, s->s, s->len, n->line);
        }
        return X_NORMAL;
    }
    case N_IF:
        if (truthy(eval(r, n->a))) return exec_body(r, n->l, n->n);
        return exec_body(r, n->l2, n->n2);
    case N_FOR: {
        jv it = eval(r, n->a);
        jlist *src = iter_list(r, it, n->line);
        /* apply the loop filter first: loop.* counts filtered items (Jinja semantics) */
        jlist *items = src;
        push_frame(r, n->line);
        if (n->b) {
            items = mk_list(r, 0).u.l;
            for (size_t i = 0; i < src->n; i++) {
                jv x = src->v[i];
                if (n->nn == 1) assign(r, n->names[0], x);
                else {
                    if (x.t != JV_LIST || x.u.l->n != n->nn) jfail(&r->e, JINJA_E_RUNTIME, n->line, "cannot unpack a %s into %zu names", type_name(x.t), n->nn);
                    for (size_t k = 0; k < n->nn; k++) assign(r, n->names[k], x.u.l->v[k]);
                }
                if (truthy(eval(r, n->b))) list_push(r, items, x);
            }
        }
        int rc = X_NORMAL;
        jstr *loop_name = mkstr(&r->ar, &r->e, "loop", 4);
        for (size_t i = 0; i < items->n; i++) {
            jv x = items->v[i];
            if (n->nn == 1) assign(r, n->names[0], x);
            else {
                if (x.t != JV_LIST || x.u.l->n != n->nn) jfail(&r->e, JINJA_E_RUNTIME, n->line, "cannot unpack a %s into %zu names", type_name(x.t), n->nn);
                for (size_t k = 0; k < n->nn; k++) assign(r, n->names[k], x.u.l->v[k]);
            }
            jv loop = mk_dict(r, JV_DICT);
            int64_t len = (int64_t)items->n, idx = (int64_t)i;
            dict_setz(r, loop.u.d, "index0", mk_int(idx));
            dict_setz(r, loop.u.d, "index", mk_int(idx + 1));
            dict_setz(r, loop.u.d, "revindex0", mk_int(len - idx - 1));
            dict_setz(r, loop.u.d, "revindex", mk_int(len - idx));
            dict_setz(r, loop.u.d, "first", mk_bool(i == 0));
            dict_setz(r, loop.u.d, "last", mk_bool(i + 1 == items->n));
            dict_setz(r, loop.u.d, "length", mk_int(len));
            dict_setz(r, loop.u.d, "depth", mk_int(1));
            dict_setz(r, loop.u.d, "depth0", mk_int(0));
            if (i > 0) dict_setz(r, loop.u.d, "previtem", items->v[i - 1]);
            if (i + 1 < items->n) dict_setz(r, loop.u.d, "nextitem", items->v[i + 1]);
            assign(r, loop_name, loop);
            rc = exec_body(r, n->l, n->n);
            if (rc == X_BREAK) break;
        }
        r->nframes--;
        if (items->n == 0) return exec_body(r, n->l2, n->n2);
        return X_NORMAL;
    }
    case N_SET: {
        jv v = eval(r, n->a);
        if (n->s) { /* ns.attr = v */
            jv ns = lookup(r, n->names[0]);
            if (ns.t != JV_NS) jfail(&r->e, JINJA_E_RUNTIME, n->line, "cannot assign attribute on a %s (only on a namespace)", type_name(ns.t));
            dict_set(r, ns.u.d, n->s, v);
        } else if (n->nn == 1) {
            assign(r, n->names[0], v);
        } else {
            if (v.t != JV_LIST || v.u.l->n != n->nn) jfail(&r->e, JINJA_E_RUNTIME, n->line, "cannot unpack into %zu names", n->nn);
            for (size_t k = 0; k < n->nn; k++) assign(r, n->names[k], v.u.l->v[k]);
        }
        return X_NORMAL;
    }
    case N_SETBLOCK: {
        capture_begin(r, n->line);
        exec_body(r, n->l, n->n);
        jv v = capture_end(r);
        assign(r, n->names[0], v);
        return X_NORMAL;
    }
    case N_MACRO: {
        jv m = {JV_MACRO, {0}};
        m.u.m = n;
        assign(r, n->s, m);
        return X_NORMAL;
    }
    case N_BREAK: return X_BREAK;
    case N_CONTINUE: return X_CONTINUE;
    case N_BODY: return exec_body(r, n->l, n->n);
    default: jfail(&r->e, JINJA_E_RUNTIME, n->line, "bad statement node");
    }
}

static int exec_body(rctx *r, node *const *body, size_t n) {
    if (++r->depth > J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, n ? body[0]->line : 0, "blocks nested too deeply");
    for (size_t i = 0; i < n; i++) {
        int rc = exec_node(r, body[i]);
        if (rc != X_NORMAL) {
            r->depth--;
            return rc;
        }
    }
    r->depth--;
    return X_NORMAL;
}

static jv from_json(rctx *r, const cJSON *j) {
    if (++r->depth > J_MAX_DEPTH) jfail(&r->e, JINJA_E_LIMIT, 0, "input values nested too deeply");
    jv v = JNONE;
    if (cJSON_IsBool(j)) v = mk_bool(cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.0e15) v = mk_int((int64_t)d);
        else v = mk_float(d);
    } else if (cJSON_IsString(j)) v = mk_strz(r, j->valuestring);
    else if (cJSON_IsArray(j)) {
        v = mk_list(r, 0);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) list_push(r, v.u.l, from_json(r, it));
    } else if (cJSON_IsObject(j)) {
        v = mk_dict(r, JV_DICT);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) dict_set(r, v.u.d, mkstr(&r->ar, &r->e, it->string, strlen(it->string)), from_json(r, it));
    }
    r->depth--;
    return v;
}

int jinja_render(const jinja_tmpl *t, const cJSON *vars, char **out, size_t *out_len, mla_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    rctx *r = calloc(1, sizeof *r);
    if (!r) return mla_errf(err, "out of memory"), JINJA_E_LIMIT;
    r->e.err = err;
    if (setjmp(r->e.jb)) {
        int st = r->e.status;
        free(r->out);
        while (r->nsaved > 0) free(r->saved[--r->nsaved].p);
        ar_free(&r->ar);
        free(r);
        return st;
    }
    push_frame(r, 0);
    if (vars) {
        const cJSON *it;
        cJSON_ArrayForEach(it, vars) {
            if (!it->string) continue;
            assign(r, mkstr(&r->ar, &r->e, it->string, strlen(it->string)), from_json(r, it));
        }
    }
    exec_body(r, t->body, t->n);
    out_put(r, "", 0, 0);
    if (!r->out) {
        r->out = malloc(1);
        if (!r->out) jfail(&r->e, JINJA_E_LIMIT, 0, "out of memory");
    }
    r->out[r->out_len] = 0;
    *out = r->out;
    if (out_len) *out_len = r->out_len;
    ar_free(&r->ar);
    free(r);
    return JINJA_OK;
}
