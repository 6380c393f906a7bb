/* gram: see gram.h. */
#include "gram.h"

#include <stdlib.h>
#include <string.h>

/* ---- compiled grammar ---------------------------------------------------------------------- */

/* E_TOKEN / E_NTOKEN: one whole token, <[id]> / any token but id (!<[id]>); they take no byte */
enum { E_END = 0, E_CHARS = 1, E_REF = 2, E_TOKEN = 3, E_NTOKEN = 4 };

typedef struct elem {
    uint8_t kind;
    uint32_t val; /* E_CHARS: charset index; E_REF: rule index; E_TOKEN, E_NTOKEN: token id */
} elem;

static bool is_tok_elem(uint8_t kind) { return kind == E_TOKEN || kind == E_NTOKEN; }

typedef struct charset {
    uint32_t first, n; /* ranges[first .. first + n) */
    bool neg;
} charset;

struct gram {
    elem *el;            /* alternatives, each ended by E_END */
    uint32_t n_el;
    uint32_t *alt;       /* alternative start positions in el */
    uint32_t *rule_alt;  /* rule r's alternatives: alt[rule_alt[r] .. rule_alt[r + 1]) */
    uint32_t n_rules;
    uint32_t root;
    charset *cs;
    uint32_t n_cs;
    uint32_t (*rng)[2];
    uint32_t n_rng;
};

static bool cs_has(const gram *g, uint32_t c, uint32_t cp) {
    const charset *s = &g->cs[c];
    bool in = false;
    for (uint32_t i = 0; i < s->n && !in; i++) in = cp >= g->rng[s->first + i][0] && cp <= g->rng[s->first + i][1];
    return in != s->neg;
}

/* Whether the charset holds some code point in [lo, hi]. */
static bool cs_meets(const gram *g, uint32_t c, uint32_t lo, uint32_t hi) {
    const charset *s = &g->cs[c];
    if (!s->neg) {
        for (uint32_t i = 0; i < s->n; i++)
            if (g->rng[s->first + i][0] <= hi && g->rng[s->first + i][1] >= lo) return true;
        return false;
    }
    /* negated: some point of [lo, hi] outside every range */
    uint32_t x = lo;
    for (;;) {
        bool moved = false;
        for (uint32_t i = 0; i < s->n; i++)
            if (x >= g->rng[s->first + i][0] && x <= g->rng[s->first + i][1]) {
                if (g->rng[s->first + i][1] >= hi) return false;
                x = g->rng[s->first + i][1] + 1;
                moved = true;
            }
        if (!moved) return true;
    }
}

/* ---- parser ------------------------------------------------------------------------------- */

typedef struct vec {
    void *p;
    size_t n, cap, sz;
} vec;

static void *vec_push(vec *v) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->p = mla_xrealloc(v->p, v->cap * v->sz);
    }
    void *r = (char *)v->p + v->n * v->sz;
    memset(r, 0, v->sz);
    v->n++;
    return r;
}

typedef struct prule {
    char *name;   /* NULL: a generated rule */
    bool defined;
    size_t at;    /* byte of the first reference, for "undefined" errors */
    vec alts;     /* of vec (of elem) */
} prule;

typedef struct parser {
    const char *s;
    size_t n, i;
    vec rules; /* prule */
    vec cs;    /* charset */
    vec rng;   /* uint32_t[2] */
    size_t n_elems;
    int depth;
    mla_err *err;
    uint32_t *names; /* open addressing over the named rules: rule index + 1, 0 empty */
    uint32_t names_cap, n_names;
} parser;

static void pos_of(const parser *p, size_t at, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int perr(parser *p, const char *what) {
    size_t l, c;
    pos_of(p, p->i, &l, &c);
    return mla_errf(p->err, "grammar: line %zu, column %zu: %s", l, c, what);
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else {
            break;
        }
    }
}

static bool is_name_ch(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static prule *rule_at(parser *p, uint32_t r) { return &((prule *)p->rules.p)[r]; }

static int new_rule(parser *p, uint32_t *out) {
    *out = 0;
    if (p->rules.n >= GRAM_MAX_RULES) return perr(p, "too many rules (at most " "16384" ")");
    prule *r = vec_push(&p->rules);
    r->alts.sz = sizeof(vec);
    *out = (uint32_t)(p->rules.n - 1);
    return MLA_OK;
}

static uint32_t name_hash(const char *nm, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t k = 0; k < len; k++) h = (h ^ (uint8_t)nm[k]) * 16777619u;
    return h;
}

/* the slot of name nm in p->names: its rule's, or the empty one where it would go */
static uint32_t name_slot(const parser *p, const char *nm, size_t len) {
    uint32_t i = name_hash(nm, len) & (p->names_cap - 1);
    for (;; i = (i + 1) & (p->names_cap - 1)) {
        const uint32_t v = p->names[i];
        if (!v) return i;
        const prule *x = &((const prule *)p->rules.p)[v - 1];
        if (strlen(x->name) == len && !memcmp(x->name, nm, len)) return i;
    }
}

static int rule_by_name(parser *p, const char *nm, size_t len, uint32_t *out) {
    if (2 * (p->n_names + 1) > p->names_cap) { /* at most half full */
        const uint32_t oc = p->names_cap, nc = oc ? 2 * oc : 64;
        uint32_t *old = p->names;
        p->names = mla_xcalloc(nc, sizeof *p->names);
        p->names_cap = nc;
        for (uint32_t k = 0; k < oc; k++) {
            if (!old[k]) continue;
            const prule *x = rule_at(p, old[k] - 1);
            p->names[name_slot(p, x->name, strlen(x->name))] = old[k];
        }
        free(old);
    }
    const uint32_t slot = name_slot(p, nm, len);
    if (p->names[slot]) {
        *out = p->names[slot] - 1;
        return MLA_OK;
    }
    if (new_rule(p, out)) return MLA_ERR;
    prule *x = rule_at(p, *out);
    x->name = mla_xmalloc(len + 1);
    memcpy(x->name, nm, len);
    x->name[len] = 0;
    x->at = p->i;
    p->names[slot] = *out + 1;
    p->n_names++;
    return MLA_OK;
}

static vec *new_alt(parser *p, uint32_t r) {
    vec *a = vec_push(&rule_at(p, r)->alts);
    a->sz = sizeof(elem);
    return a;
}

static int add_elem(parser *p, vec *alt, uint8_t kind, uint32_t val) {
    if (++p->n_elems > GRAM_MAX_ELEMS) return perr(p, "the grammar is too large (more than 1048576 elements)");
    elem *e = vec_push(alt);
    e->kind = kind;
    e->val = val;
    return MLA_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a string or class: an escape or a UTF-8 sequence. */
static int read_char(parser *p, uint32_t *cp) {
    if (p->i >= p->n) return perr(p, "unexpected end of the grammar");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '\\') {
        p->i++;
        if (p->i >= p->n) return perr(p, "unexpected end of the grammar after '\\'");
        char e = p->s[p->i++];
        int nh = 0;
        switch (e) {
        case 'n': *cp = '\n'; return MLA_OK;
        case 'r': *cp = '\r'; return MLA_OK;
        case 't': *cp = '\t'; return MLA_OK;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': *cp = (uint32_t)e; return MLA_OK;
        case 'x': nh = 2; break;
        case 'u': nh = 4; break;
        case 'U': nh = 8; break;
        default: p->i--; return perr(p, "unknown escape (known: \\n \\r \\t \\\\ \\\" \\' \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)");
        }
        uint32_t v = 0;
        for (int k = 0; k < nh; k++) {
            int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
            if (h < 0) return perr(p, "bad hexadecimal escape");
            v = v * 16 + (uint32_t)h;
            p->i++;
        }
        if (v > 0x10FFFF) return perr(p, "escape beyond U+10FFFF");
        *cp = v;
        return MLA_OK;
    }
    int n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!n || p->i + (size_t)n > p->n) return perr(p, "invalid UTF-8 in the grammar");
    uint32_t v = n == 1 ? c : (uint32_t)(c & (0x7F >> n));
    for (int k = 1; k < n; k++) {
        unsigned char d = (unsigned char)p->s[p->i + (size_t)k];
        if ((d & 0xC0) != 0x80) return perr(p, "invalid UTF-8 in the grammar");
        v = (v << 6) | (d & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return perr(p, "invalid UTF-8 in the grammar");
    p->i += (size_t)n;
    *cp = v;
    return MLA_OK;
}

static uint32_t add_charset(parser *p, bool neg) {
    charset *c = vec_push(&p->cs);
    c->first = (uint32_t)p->rng.n;
    c->neg = neg;
    return (uint32_t)(p->cs.n - 1);
}

static void add_range(parser *p, uint32_t lo, uint32_t hi) {
    uint32_t *r = vec_push(&p->rng);
    r[0] = lo;
    r[1] = hi;
    ((charset *)p->cs.p)[p->cs.n - 1].n++;
}

static int parse_alts(parser *p, uint32_t rule);

/* One primary into alt; *start = index in alt of its first element (for postfix operators). */
static int parse_primary(parser *p, uint32_t rule, vec *alt, bool *got) {
    *got = false;
    skip_ws(p);
    if (p->i >= p->n) return MLA_OK;
    char c = p->s[p->i];
    if (c == '"') {
        p->i++;
        while (p->i < p->n && p->s[p->i] != '"') {
            uint32_t cp;
            if (read_char(p, &cp)) return MLA_ERR;
            uint32_t cs = add_charset(p, false);
            add_range(p, cp, cp);
            if (add_elem(p, alt, E_CHARS, cs)) return MLA_ERR;
        }
        if (p->i >= p->n) return perr(p, "unterminated string");
        p->i++;
        *got = true;
        return MLA_OK;
    }
    if (c == '[') {
        p->i++;
        bool neg = p->i < p->n && p->s[p->i] == '^';
        if (neg) p->i++;
        uint32_t cs = add_charset(p, neg);
        while (p->i < p->n && p->s[p->i] != ']') {
            uint32_t lo, hi;
            if (read_char(p, &lo)) return MLA_ERR;
            hi = lo;
            if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                p->i++;
                if (read_char(p, &hi)) return MLA_ERR;
                if (hi < lo) return perr(p, "character range with its end before its start");
            }
            add_range(p, lo, hi);
        }
        if (p->i >= p->n) return perr(p, "unterminated character class");
        p->i++;
        if (add_elem(p, alt, E_CHARS, cs)) return MLA_ERR;
        *got = true;
        return MLA_OK;
    }
    if (c == '<' || (c == '!' && p->i + 1 < p->n && p->s[p->i + 1] == '<')) { /* <[id]>, !<[id]> */
        const bool neg = c == '!';
        p->i += neg ? 2 : 1;
        if (p->i >= p->n || p->s[p->i] != '[')
            return perr(p, "expected a token id as <[id]> (token text is not supported: name the id)");
        p->i++;
        uint64_t id = 0;
        size_t d0 = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && id <= GRAM_MAX_TOKEN)
            id = id * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (p->i == d0) return perr(p, "expected a token id (digits) after '<['");
        if (id > GRAM_MAX_TOKEN) return perr(p, "token id above 2147483647");
        if (p->i + 1 >= p->n || p->s[p->i] != ']' || p->s[p->i + 1] != '>') return perr(p, "expected ']>' after a token id");
        p->i += 2;
        if (add_elem(p, alt, neg ? E_NTOKEN : E_TOKEN, (uint32_t)id)) return MLA_ERR;
        *got = true;
        return MLA_OK;
    }
    if (c == '.') {
        p->i++;
        uint32_t cs = add_charset(p, false);
        add_range(p, 0, 0x10FFFF);
        if (add_elem(p, alt, E_CHARS, cs)) return MLA_ERR;
        *got = true;
        return MLA_OK;
    }
    if (c == '(') {
        if (++p->depth > GRAM_MAX_NEST) return perr(p, "groups nested too deeply (at most 100)");
        p->i++;
        uint32_t sub = 0;
        if (new_rule(p, &sub)) return MLA_ERR;
        if (parse_alts(p, sub)) return MLA_ERR;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ')') return perr(p, "expected ')'");
        p->i++;
        p->depth--;
        if (add_elem(p, alt, E_REF, sub)) return MLA_ERR;
        *got = true;
        return MLA_OK;
    }
    if (is_name_ch(c)) {
        size_t st = p->i;
        while (p->i < p->n && is_name_ch(p->s[p->i])) p->i++;
        size_t en = p->i;
        skip_ws(p);
        if (p->i + 3 <= p->n && !memcmp(p->s + p->i, "::=", 3)) { /* the next rule starts */
            p->i = st;
            return MLA_OK;
        }
        uint32_t r;
        if (rule_by_name(p, p->s + st, en - st, &r)) return MLA_ERR;
        (void)rule;
        if (add_elem(p, alt, E_REF, r)) return MLA_ERR;
        *got = true;
        return MLA_OK;
    }
    return MLA_OK;
}

/* Moves alt[from..) into a new rule and leaves a reference to it; returns that rule. */
static int wrap_tail(parser *p, vec *alt, size_t from, uint32_t *out) {
    uint32_t r = 0;
    if (new_rule(p, &r)) return MLA_ERR;
    vec *a = new_alt(p, r);
    size_t k = alt->n - from;
    for (size_t j = 0; j < k; j++) *(elem *)vec_push(a) = ((elem *)alt->p)[from + j];
    alt->n = from;
    *out = r;
    return MLA_OK;
}

static int read_uint(parser *p, uint32_t *v) {
    skip_ws(p);
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, "expected a number");
    uint64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > GRAM_MAX_REPEAT) return perr(p, "repetition count above 1000");
    }
    *v = (uint32_t)x;
    return MLA_OK;
}

/* X{mn,mx} (mx == UINT32_MAX: unbounded) for X = the rule x, appended to alt. */
static int add_repeat(parser *p, vec *alt, uint32_t x, uint32_t mn, uint32_t mx) {
    for (uint32_t k = 0; k < mn; k++)
        if (add_elem(p, alt, E_REF, x)) return MLA_ERR;
    if (mx == UINT32_MAX) { /* R ::= X R | empty */
        uint32_t r = 0;
        if (new_rule(p, &r)) return MLA_ERR;
        vec *a = new_alt(p, r);
        if (add_elem(p, a, E_REF, x) || add_elem(p, a, E_REF, r)) return MLA_ERR;
        new_alt(p, r);
        return add_elem(p, alt, E_REF, r);
    }
    /* O_k ::= X O_{k-1} | empty, O_1 ::= X | empty */
    uint32_t prev = UINT32_MAX;
    for (uint32_t k = mn; k < mx; k++) {
        uint32_t r = 0;
        if (new_rule(p, &r)) return MLA_ERR;
        vec *a = new_alt(p, r);
        if (add_elem(p, a, E_REF, x)) return MLA_ERR;
        if (prev != UINT32_MAX && add_elem(p, a, E_REF, prev)) return MLA_ERR;
        new_alt(p, r);
        prev = r;
    }
    if (prev != UINT32_MAX) return add_elem(p, alt, E_REF, prev);
    return MLA_OK;
}

static int parse_seq(parser *p, uint32_t rule, vec *alt) {
    for (;;) {
        size_t from = alt->n;
        bool got;
        if (parse_primary(p, rule, alt, &got)) return MLA_ERR;
        if (!got) return MLA_OK;
        skip_ws(p);
        if (p->i >= p->n) return MLA_OK;
        char c = p->s[p->i];
        uint32_t mn = 0, mx = 0;
        if (c == '*') { mn = 0; mx = UINT32_MAX; }
        else if (c == '+') { mn = 1; mx = UINT32_MAX; }
        else if (c == '?') { mn = 0; mx = 1; }
        else if (c == '{') {
            p->i++;
            if (read_uint(p, &mn)) return MLA_ERR;
            skip_ws(p);
            mx = mn;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_ws(p);
                if (p->i < p->n && p->s[p->i] == '}') mx = UINT32_MAX;
                else if (read_uint(p, &mx)) return MLA_ERR;
                if (mx < mn) return perr(p, "repetition {m,n} with n < m");
            }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '}') return perr(p, "expected '}'");
        } else {
            continue;
        }
        p->i++;
        uint32_t x = 0;
        if (wrap_tail(p, alt, from, &x)) return MLA_ERR;
        alt = &((vec *)rule_at(p, rule)->alts.p)[rule_at(p, rule)->alts.n - 1]; /* rules may have moved */
        if (add_repeat(p, alt, x, mn, mx)) return MLA_ERR;
        alt = &((vec *)rule_at(p, rule)->alts.p)[rule_at(p, rule)->alts.n - 1];
        skip_ws(p);
        if (p->i < p->n && (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' || p->s[p->i] == '{'))
            return perr(p, "two repetition operators in a row (use a group)");
    }
}

static int parse_alts(parser *p, uint32_t rule) {
    for (;;) {
        new_alt(p, rule);
        vec *alt = &((vec *)rule_at(p, rule)->alts.p)[rule_at(p, rule)->alts.n - 1];
        if (parse_seq(p, rule, alt)) return MLA_ERR;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        return MLA_OK;
    }
}

static void parser_free(parser *p) {
    for (size_t r = 0; r < p->rules.n; r++) {
        prule *x = rule_at(p, (uint32_t)r);
        free(x->name);
        for (size_t a = 0; a < x->alts.n; a++) free(((vec *)x->alts.p)[a].p);
        free(x->alts.p);
    }
    free(p->rules.p);
    free(p->cs.p);
    free(p->rng.p);
    free(p->names);
}

/* Left recursion: a rule reaching itself through references at positions where everything
 * before is nullable. */
static int check_left_rec(gram *g, parser *p) {
    uint32_t R = g->n_rules;
    bool *nul = mla_xcalloc(R, sizeof *nul);
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = 0; r < R; r++) {
            if (nul[r]) continue;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nul[r]; a++) {
                uint32_t e = g->alt[a];
                while (g->el[e].kind == E_REF && nul[g->el[e].val]) e++;
                if (g->el[e].kind == E_END) {
                    nul[r] = true;
                    ch = true;
                }
            }
        }
    }
    /* iterative DFS over leading edges: 0 new, 1 on the path, 2 done */
    uint8_t *col = mla_xcalloc(R, 1);
    uint32_t *st = mla_xmalloc((size_t)R * sizeof *st), *it = mla_xmalloc((size_t)R * sizeof *it);
    int rc = MLA_OK;
    for (uint32_t s0 = 0; s0 < R && rc == MLA_OK; s0++) {
        if (col[s0]) continue;
        size_t sp = 0;
        st[sp] = s0;
        it[sp++] = 0; /* edge cursor: alternative-major over element positions */
        col[s0] = 1;
        while (sp && rc == MLA_OK) {
            uint32_t r = st[sp - 1];
            /* find the next leading reference after cursor it[] (a flat index over the rule's
             * alternatives' elements) */
            uint32_t lo = g->alt[g->rule_alt[r]];
            uint32_t hi = g->alt[g->rule_alt[r + 1]];
            uint32_t e = lo + it[sp - 1];
            uint32_t next = UINT32_MAX;
            while (e < hi) {
                /* is e a leading position? walk back in its alternative */
                bool lead = true;
                for (uint32_t b = e; b > lo && g->el[b - 1].kind != E_END; b--)
                    if (!(g->el[b - 1].kind == E_REF && nul[g->el[b - 1].val])) {
                        lead = false;
                        break;
                    }
                if (lead && g->el[e].kind == E_REF) {
                    next = g->el[e].val;
                    e++;
                    break;
                }
                e++;
            }
            it[sp - 1] = e - lo;
            if (next == UINT32_MAX) {
                col[r] = 2;
                sp--;
                continue;
            }
            if (col[next] == 1) {
                const char *nm = NULL;
                for (size_t k = sp; k-- > 0 && !nm;) nm = rule_at(p, st[k])->name;
                rc = mla_errf(p->err, "grammar: rule '%s' can reach itself without consuming input (left recursion, "
                              "or a repetition of something that can be empty)", nm ? nm : "root");
            } else if (col[next] == 0) {
                col[next] = 1;
                st[sp] = next;
                it[sp++] = 0;
            }
        }
    }
    free(nul);
    free(col);
    free(st);
    free(it);
    return rc;
}

int gram_parse(gram **out, const char *text, size_t len, mla_err *err) {
    *out = NULL;
    if (len > GRAM_MAX_TEXT) return mla_errf(err, "grammar: %zu bytes, more than the limit of %u", len, GRAM_MAX_TEXT);
    parser p = {.s = text, .n = len, .err = err};
    p.rules.sz = sizeof(prule);
    p.cs.sz = sizeof(charset);
    p.rng.sz = sizeof(uint32_t[2]);
    int rc = MLA_OK;
    for (;;) {
        skip_ws(&p);
        if (p.i >= p.n) break;
        size_t st = p.i;
        while (p.i < p.n && is_name_ch(p.s[p.i])) p.i++;
        if (p.i == st) {
            rc = perr(&p, "expected a rule name");
            break;
        }
        size_t en = p.i;
        skip_ws(&p);
        if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) {
            rc = perr(&p, "expected '::=' after the rule name");
            break;
        }
        uint32_t r;
        if ((rc = rule_by_name(&p, p.s + st, en - st, &r))) break;
        if (rule_at(&p, r)->defined) {
            p.i = st;
            rc = perr(&p, "rule defined twice");
            break;
        }
        rule_at(&p, r)->defined = true;
        p.i += 3;
        if ((rc = parse_alts(&p, r))) break;
        skip_ws(&p);
        if (p.i < p.n && !is_name_ch(p.s[p.i])) {
            rc = perr(&p, "unexpected character");
            break;
        }
    }
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; rc == MLA_OK && r < p.rules.n; r++) {
        prule *x = rule_at(&p, r);
        if (x->name && !x->defined) {
            size_t line, col;
            pos_of(&p, x->at, &line, &col);
            rc = mla_errf(err, "grammar: rule '%s' (line %zu) is used but not defined", x->name, line);
        }
        if (x->name && !strcmp(x->name, "root")) root = r;
    }
    if (rc == MLA_OK && root == UINT32_MAX) rc = mla_errf(err, "grammar: no 'root' rule");
    if (rc) {
        parser_free(&p);
        return MLA_ERR;
    }
    gram *g = mla_xcalloc(1, sizeof *g);
    g->n_rules = (uint32_t)p.rules.n;
    g->root = root;
    size_t n_alt = 0, n_el = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        prule *x = rule_at(&p, r);
        n_alt += x->alts.n;
        for (size_t a = 0; a < x->alts.n; a++) n_el += ((vec *)x->alts.p)[a].n + 1;
    }
    g->el = mla_xmalloc((n_el ? n_el : 1) * sizeof *g->el);
    g->alt = mla_xmalloc((n_alt + 1) * sizeof *g->alt);
    g->rule_alt = mla_xmalloc((g->n_rules + 1) * sizeof *g->rule_alt);
    uint32_t ka = 0, ke = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        prule *x = rule_at(&p, r);
        g->rule_alt[r] = ka;
        for (size_t a = 0; a < x->alts.n; a++) {
            vec *v = &((vec *)x->alts.p)[a];
            g->alt[ka++] = ke;
            if (v->n) memcpy(g->el + ke, v->p, v->n * sizeof(elem));
            ke += (uint32_t)v->n;
            g->el[ke].kind = E_END;
            g->el[ke++].val = 0;
        }
    }
    g->rule_alt[g->n_rules] = ka;
    g->alt[ka] = ke;
    g->n_el = ke;
    g->cs = p.cs.p;
    g->n_cs = (uint32_t)p.cs.n;
    g->rng = p.rng.p;
    g->n_rng = (uint32_t)p.rng.n;
    p.cs.p = NULL;
    p.rng.p = NULL;
    rc = check_left_rec(g, &p);
    parser_free(&p);
    if (rc) {
        gram_free(g);
        return MLA_ERR;
    }
    *out = g;
    return MLA_OK;
}

void gram_free(gram *g) {
    if (!g) return;
    free(g->el);
    free(g->alt);
    free(g->rule_alt);
    free(g->cs);
    free(g->rng);
    free(g);
}

uint32_t gram_n_rules(const gram *g) { return g->n_rules; }

int64_t gram_max_token(const gram *g) {
    int64_t mx = -1;
    for (uint32_t i = 0; i < g->n_el; i++)
        if (is_tok_elem(g->el[i].kind) && (int64_t)g->el[i].val > mx) mx = g->el[i].val;
    return mx;
}

/* ---- vocabulary trie ---------------------------------------------------------------------- */

typedef struct tnode {
    uint32_t child, sib; /* first child, next sibling (0: none; node 0 is the root) */
    uint32_t tok;        /* first token ending here (UINT32_MAX: none), more in tok_next */
    uint8_t byte;
} tnode;

struct gram_vocab {
    uint32_t n;
    uint8_t **bytes;
    uint32_t *len;
    uint8_t *eos;
    uint8_t *special; /* a token without text, taken only by token elements */
    tnode *t;
    uint32_t n_t, cap_t;
    uint32_t *tok_next; /* tokens with equal bytes, chained */
    /* the trie flattened for walks (built at the first mask, dropped by a set): nodes in
     * depth-first order, node i's children kid[first[i] .. first[i] + nkid[i]) */
    uint32_t *first, *nkid, *kid, *ftok;
    uint8_t *fbyte;
    uint32_t n_f;
};

gram_vocab *gram_vocab_new(uint32_t n_vocab) {
    gram_vocab *v = mla_xcalloc(1, sizeof *v);
    v->n = n_vocab;
    v->bytes = mla_xcalloc(n_vocab ? n_vocab : 1, sizeof *v->bytes);
    v->len = mla_xcalloc(n_vocab ? n_vocab : 1, sizeof *v->len);
    v->eos = mla_xcalloc(n_vocab ? n_vocab : 1, 1);
    v->special = mla_xcalloc(n_vocab ? n_vocab : 1, 1);
    v->tok_next = mla_xmalloc((n_vocab ? n_vocab : 1) * sizeof *v->tok_next);
    v->cap_t = 1024;
    v->t = mla_xmalloc(v->cap_t * sizeof *v->t);
    v->t[0] = (tnode){0, 0, UINT32_MAX, 0};
    v->n_t = 1;
    return v;
}

static void unfreeze(gram_vocab *v) {
    free(v->first);
    free(v->nkid);
    free(v->kid);
    free(v->ftok);
    free(v->fbyte);
    v->first = v->nkid = v->kid = v->ftok = NULL;
    v->fbyte = NULL;
    v->n_f = 0;
}

static void freeze(gram_vocab *v) {
    if (v->n_f) return;
    uint32_t N = v->n_t;
    v->first = mla_xmalloc(N * sizeof *v->first);
    v->nkid = mla_xmalloc(N * sizeof *v->nkid);
    v->kid = mla_xmalloc(N * sizeof *v->kid);
    v->ftok = mla_xmalloc(N * sizeof *v->ftok);
    v->fbyte = mla_xmalloc(N);
    uint32_t *newid = mla_xmalloc(N * sizeof *newid), *stack = mla_xmalloc(N * sizeof *stack);
    /* preorder ids */
    uint32_t sp = 0, k = 0;
    stack[sp++] = 0;
    while (sp) {
        uint32_t o = stack[--sp];
        newid[o] = k++;
        for (uint32_t c = v->t[o].child; c; c = v->t[c].sib) stack[sp++] = c;
    }
    uint32_t nk = 0;
    for (uint32_t o = 0; o < N; o++) {
        uint32_t i = newid[o];
        v->fbyte[i] = v->t[o].byte;
        v->ftok[i] = v->t[o].tok;
    }
    /* children lists in preorder of their parents */
    for (uint32_t i = 0; i < N; i++) v->nkid[i] = 0;
    sp = 0;
    stack[sp++] = 0;
    while (sp) {
        uint32_t o = stack[--sp];
        uint32_t i = newid[o];
        v->first[i] = nk;
        for (uint32_t c = v->t[o].child; c; c = v->t[c].sib) {
            v->kid[nk++] = newid[c];
            v->nkid[i]++;
            stack[sp++] = c;
        }
    }
    free(newid);
    free(stack);
    v->n_f = N;
}

void gram_vocab_set(gram_vocab *v, uint32_t id, const uint8_t *bytes, size_t len) {
    MLA_ASSERT(id < v->n && !v->bytes[id]);
    if (!len) return;
    unfreeze(v);
    v->bytes[id] = mla_xmalloc(len);
    memcpy(v->bytes[id], bytes, len);
    v->len[id] = (uint32_t)len;
    uint32_t cur = 0;
    for (size_t k = 0; k < len; k++) {
        uint32_t c = v->t[cur].child;
        while (c && v->t[c].byte != bytes[k]) c = v->t[c].sib;
        if (!c) {
            if (v->n_t == v->cap_t) {
                v->cap_t *= 2;
                v->t = mla_xrealloc(v->t, v->cap_t * sizeof *v->t);
            }
            c = v->n_t++;
            v->t[c] = (tnode){0, v->t[cur].child, UINT32_MAX, bytes[k]};
            v->t[cur].child = c;
        }
        cur = c;
    }
    v->tok_next[id] = v->t[cur].tok;
    v->t[cur].tok = id;
}

void gram_vocab_set_eos(gram_vocab *v, uint32_t id) {
    if (id < v->n) v->eos[id] = 1;
}

void gram_vocab_set_special(gram_vocab *v, uint32_t id) {
    if (id < v->n && !v->len[id]) v->special[id] = 1;
}

/* a token a token element may take: one with text, or a special one */
static bool vocab_has(const gram_vocab *v, uint32_t id) { return id < v->n && (v->len[id] || v->special[id]); }

uint32_t gram_vocab_n(const gram_vocab *v) { return v->n; }

bool gram_vocab_is_eos(const gram_vocab *v, uint32_t id) { return id < v->n && v->eos[id]; }

const uint8_t *gram_vocab_bytes(const gram_vocab *v, uint32_t id, size_t *len) {
    *len = id < v->n ? v->len[id] : 0;
    return id < v->n ? v->bytes[id] : NULL;
}

void gram_vocab_free(gram_vocab *v) {
    if (!v) return;
    for (uint32_t i = 0; i < v->n; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->eos);
    free(v->special);
    free(v->tok_next);
    free(v->t);
    unfreeze(v);
    free(v);
}

int gram_gpt2_byte(uint32_t cp) {
    /* bytes printable in Latin-1 stand for themselves; the others were shifted to 256 + k in
     * byte order */
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable) continue;
        if (k == 0) return (int)b;
        k--;
    }
    return -1;
}

/* ---- matcher ------------------------------------------------------------------------------ */

#define NONE UINT32_MAX /* the empty stack */

typedef struct snode {
    uint32_t pos, parent, depth, next;
} snode;

typedef struct sstate {
    uint32_t *st; /* sorted distinct stack ids (NONE: the empty, accepting stack) */
    uint32_t n, cap;
    uint32_t cp;   /* incomplete UTF-8 sequence: bits so far */
    uint8_t need;  /* continuation bytes still needed */
    uint8_t tot;   /* the sequence's length */
} sstate;

struct gram_match {
    const gram *g;
    snode *nd;
    uint32_t n_nd, cap_nd;
    uint32_t *bucket;
    uint32_t n_bucket;
    sstate cur;
    /* scratch: states per trie depth, an expansion buffer */
    sstate *lv;
    uint32_t n_lv;
    uint32_t *tmp;
    uint32_t n_tmp, cap_tmp;
    mla_err *err;
    int failed;
    /* a mask's walk: its states interned (ws, their stacks in wpool, a hash wh) and the
     * transitions found (trans[state * 256 + byte]: -2 not yet known, -1 dead), so that each
     * state meets each byte once however many tokens share it */
    struct wstate {
        uint32_t off, n, cp;
        uint8_t need, tot;
    } *ws;
    uint32_t n_ws, cap_ws;
    uint32_t *wpool;
    size_t n_wpool, cap_wpool;
    int32_t *trans;
    uint32_t *wh;
    uint32_t wh_cap;
    /* masks of states met before (their stacks are kept nodes, so equal ids are equal states):
     * GRAM_MASK_CACHE bitsets, replaced round robin */
    struct mcache {
        sstate key;
        const gram_vocab *v;
        uint64_t *bits;
        int64_t cnt;
        bool used;
    } mc[GRAM_MASK_CACHE];
    uint32_t mc_next;
};

static uint32_t hnode(uint32_t pos, uint32_t parent) {
    uint64_t h = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static void rehash(gram_match *m, uint32_t nb) {
    free(m->bucket);
    m->n_bucket = nb;
    m->bucket = mla_xmalloc(nb * sizeof *m->bucket);
    memset(m->bucket, 0xFF, nb * sizeof *m->bucket);
    for (uint32_t i = 0; i < m->n_nd; i++) {
        uint32_t b = hnode(m->nd[i].pos, m->nd[i].parent) & (nb - 1);
        m->nd[i].next = m->bucket[b];
        m->bucket[b] = i;
    }
}

static uint32_t mk(gram_match *m, uint32_t pos, uint32_t parent) {
    uint32_t b = hnode(pos, parent) & (m->n_bucket - 1);
    for (uint32_t i = m->bucket[b]; i != NONE; i = m->nd[i].next)
        if (m->nd[i].pos == pos && m->nd[i].parent == parent) return i;
    uint32_t depth = parent == NONE ? 1 : m->nd[parent].depth + 1;
    if (depth > GRAM_MAX_DEPTH) {
        if (!m->failed) mla_errf(m->err, "grammar: parse stack deeper than %d (nesting too deep)", GRAM_MAX_DEPTH);
        m->failed = 1;
        return NONE;
    }
    if (m->n_nd >= GRAM_MAX_NODES) {
        if (!m->failed) mla_errf(m->err, "grammar: more than %u parse stack nodes", GRAM_MAX_NODES);
        m->failed = 1;
        return NONE;
    }
    if (m->n_nd == m->cap_nd) {
        m->cap_nd *= 2;
        m->nd = mla_xrealloc(m->nd, m->cap_nd * sizeof *m->nd);
    }
    uint32_t i = m->n_nd++;
    m->nd[i] = (snode){pos, parent, depth, NONE};
    if (m->n_nd * 2 > m->n_bucket) {
        rehash(m, m->n_bucket * 2);
    } else {
        m->nd[i].next = m->bucket[b];
        m->bucket[b] = i;
    }
    return i;
}

/* Forgets nodes made after mark (newest first: each is the head of its bucket). */
static void rollback(gram_match *m, uint32_t mark) {
    while (m->n_nd > mark) {
        uint32_t i = --m->n_nd;
        uint32_t b = hnode(m->nd[i].pos, m->nd[i].parent) & (m->n_bucket - 1);
        m->bucket[b] = m->nd[i].next;
    }
}

static void tmp_push(gram_match *m, uint32_t v) {
    if (m->n_tmp >= GRAM_MAX_STACKS * 8) {
        if (!m->failed)
            mla_errf(m->err, "grammar: more than %d parse stacks at once (the grammar is too ambiguous)",
                     GRAM_MAX_STACKS);
        m->failed = 1;
        return;
    }
    if (m->n_tmp == m->cap_tmp) {
        m->cap_tmp = m->cap_tmp ? m->cap_tmp * 2 : 64;
        m->tmp = mla_xrealloc(m->tmp, m->cap_tmp * sizeof *m->tmp);
    }
    m->tmp[m->n_tmp++] = v;
}

/* Expands stack s until its top is a character element (or it is empty), into tmp. */
static void expand(gram_match *m, uint32_t s, int lvl) {
    const gram *g = m->g;
    for (;;) {
        if (m->failed) return;
        if (s == NONE) {
            tmp_push(m, NONE);
            break;
        }
        const elem *e = &g->el[m->nd[s].pos];
        if (e->kind == E_END) {
            s = m->nd[s].parent;
            continue;
        }
        if (e->kind == E_CHARS || is_tok_elem(e->kind)) {
            tmp_push(m, s);
            break;
        }
        /* a reference: its alternatives over the continuation (dropped when it is the end) */
        uint32_t cont = m->nd[s].pos + 1;
        uint32_t base = g->el[cont].kind == E_END ? m->nd[s].parent : mk(m, cont, m->nd[s].parent);
        if (m->failed) return;
        if (lvl > GRAM_MAX_EMPTY_RUN) { /* finite without left recursion, but bounded */
            mla_errf(m->err, "grammar: more than %d rule references in a row before a character",
                     GRAM_MAX_EMPTY_RUN);
            m->failed = 1;
            return;
        }
        uint32_t r = e->val;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            uint32_t st = g->el[g->alt[a]].kind == E_END ? base : mk(m, g->alt[a], base);
            if (m->failed) return;
            expand(m, st, lvl + 1);
        }
        break;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* tmp -> sorted distinct, into dst (bounded) */
static int settle(gram_match *m, sstate *dst) {
    if (m->failed) return MLA_ERR;
    qsort(m->tmp, m->n_tmp, sizeof *m->tmp, cmp_u32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->n_tmp; i++)
        if (!k || m->tmp[i] != m->tmp[k - 1]) m->tmp[k++] = m->tmp[i];
    if (k > GRAM_MAX_STACKS) {
        m->failed = 1;
        return mla_errf(m->err, "grammar: more than %d parse stacks at once (the grammar is too ambiguous)",
                        GRAM_MAX_STACKS);
    }
    if (k > dst->cap) {
        dst->cap = k * 2;
        dst->st = mla_xrealloc(dst->st, dst->cap * sizeof *dst->st);
    }
    if (k) memcpy(dst->st, m->tmp, k * sizeof *dst->st);
    dst->n = k;
    return MLA_OK;
}

/* dst = src advanced by byte b; MLA_OK with dst->n == 0 when not accepted. */
static int step_byte(gram_match *m, const sstate *src, uint8_t b, sstate *dst) {
    const gram *g = m->g;
    m->n_tmp = 0;
    dst->n = 0;
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t cp;
    uint8_t need, tot;
    if (src->need == 0) {
        if (b < 0x80) { cp = b; need = 0; }
        else if (b >= 0xC2 && b <= 0xDF) { cp = b & 0x1F; need = 1; }
        else if (b >= 0xE0 && b <= 0xEF) { cp = b & 0x0F; need = 2; }
        else if (b >= 0xF0 && b <= 0xF4) { cp = b & 0x07; need = 3; }
        else return MLA_OK;
        tot = (uint8_t)(need + 1);
    } else {
        if ((b & 0xC0) != 0x80) return MLA_OK;
        cp = (src->cp << 6) | (b & 0x3F);
        need = (uint8_t)(src->need - 1);
        tot = src->tot;
    }
    if (need) { /* keep the stacks whose character can still be completed from here */
        uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
        if (lo < min_cp[tot]) lo = min_cp[tot];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return MLA_OK;
        for (uint32_t i = 0; i < src->n; i++) {
            uint32_t s = src->st[i];
            if (s != NONE && g->el[m->nd[s].pos].kind == E_CHARS && cs_meets(g, g->el[m->nd[s].pos].val, lo, hi))
                tmp_push(m, s);
        }
        if (m->n_tmp > dst->cap) {
            dst->cap = m->n_tmp * 2;
            dst->st = mla_xrealloc(dst->st, dst->cap * sizeof *dst->st);
        }
        if (m->n_tmp) memcpy(dst->st, m->tmp, m->n_tmp * sizeof *dst->st);
        dst->n = m->n_tmp;
        dst->cp = cp;
        dst->need = need;
        dst->tot = tot;
        return MLA_OK;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp < min_cp[tot]) return MLA_OK;
    for (uint32_t i = 0; i < src->n; i++) {
        uint32_t s = src->st[i];
        if (s == NONE || g->el[m->nd[s].pos].kind != E_CHARS || !cs_has(g, g->el[m->nd[s].pos].val, cp)) continue;
        uint32_t t = mk(m, m->nd[s].pos + 1, m->nd[s].parent);
        if (m->failed) return MLA_ERR;
        expand(m, t, 0);
        if (m->failed) return MLA_ERR;
    }
    dst->cp = 0;
    dst->need = 0;
    dst->tot = 0;
    return settle(m, dst);
}

static void state_copy(sstate *d, const sstate *s) {
    if (s->n > d->cap) {
        d->cap = s->n * 2;
        d->st = mla_xrealloc(d->st, d->cap * sizeof *d->st);
    }
    if (s->n) memcpy(d->st, s->st, s->n * sizeof *d->st);
    d->n = s->n;
    d->cp = s->cp;
    d->need = s->need;
    d->tot = s->tot;
}

static sstate *level(gram_match *m, uint32_t k) {
    if (k >= m->n_lv) {
        uint32_t n = k * 2 + 4;
        m->lv = mla_xrealloc(m->lv, n * sizeof *m->lv);
        memset(m->lv + m->n_lv, 0, (n - m->n_lv) * sizeof *m->lv);
        m->n_lv = n;
    }
    return &m->lv[k];
}

int gram_match_new(gram_match **out, const gram *g, mla_err *err) {
    gram_match *m = mla_xcalloc(1, sizeof *m);
    m->g = g;
    m->cap_nd = 256;
    m->nd = mla_xmalloc(m->cap_nd * sizeof *m->nd);
    rehash(m, 512);
    m->err = err;
    m->n_tmp = 0;
    /* the root's alternatives as stacks of one */
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        uint32_t s = g->el[g->alt[a]].kind == E_END ? NONE : mk(m, g->alt[a], NONE);
        if (m->failed) break;
        expand(m, s, 0);
    }
    if (settle(m, &m->cur)) {
        gram_match_free(m);
        *out = NULL;
        return MLA_ERR;
    }
    *out = m;
    return MLA_OK;
}

int gram_check(const char *text, size_t len, mla_err *err) {
    int64_t mx;
    return gram_check_tokens(text, len, &mx, NULL, NULL, err);
}

int gram_check_tokens(const char *text, size_t len, int64_t *max_token, uint32_t **taken, size_t *n_taken,
                      mla_err *err) {
    gram *g = NULL;
    gram_match *m = NULL;
    *max_token = -1;
    if (taken) *taken = NULL, *n_taken = 0;
    int rc = gram_parse(&g, text, len, err);
    if (rc == MLA_OK) *max_token = gram_max_token(g);
    if (rc == MLA_OK) rc = gram_match_new(&m, g, err);
    if (rc == MLA_OK && !gram_match_complete(m)) { /* a start that takes no byte nor token: nothing matches */
        bool any = false;
        for (uint32_t i = 0; i < m->cur.n && !any; i++)
            any = m->cur.st[i] != NONE && is_tok_elem(g->el[m->nd[m->cur.st[i]].pos].kind);
        for (int b = 0; b < 256 && !any && rc == MLA_OK; b++) {
            const uint8_t byte = (uint8_t)b;
            rc = gram_match_try(m, &byte, 1, &any, err);
        }
        if (rc == MLA_OK && !any)
            rc = mla_errf(err, "grammar: it matches no text (no first character or token fits the root rule)");
    }
    if (rc == MLA_OK && taken) {
        for (uint32_t i = 0; i < g->n_el; i++) *n_taken += g->el[i].kind == E_TOKEN;
        if (*n_taken) *taken = mla_xmalloc(*n_taken * sizeof **taken);
        for (uint32_t i = 0, k = 0; i < g->n_el; i++)
            if (g->el[i].kind == E_TOKEN) (*taken)[k++] = g->el[i].val;
    }
    gram_match_free(m);
    gram_free(g);
    return rc;
}

void gram_match_free(gram_match *m) {
    if (!m) return;
    free(m->nd);
    free(m->bucket);
    free(m->cur.st);
    for (uint32_t i = 0; i < m->n_lv; i++) free(m->lv[i].st);
    free(m->lv);
    free(m->tmp);
    free(m->ws);
    free(m->wpool);
    free(m->trans);
    free(m->wh);
    for (uint32_t k = 0; k < GRAM_MASK_CACHE; k++) {
        free(m->mc[k].key.st);
        free(m->mc[k].bits);
    }
    free(m);
}

/* Runs bytes from the current state into level 1 (.. via levels 0/1 alternately); *ok when
 * accepted. */
static int run_bytes(gram_match *m, const uint8_t *bytes, size_t len, bool *ok, sstate **res) {
    sstate *a = level(m, 0), *b = level(m, 1);
    state_copy(a, &m->cur);
    for (size_t k = 0; k < len; k++) {
        if (step_byte(m, a, bytes[k], b)) return MLA_ERR;
        if (b->n == 0) {
            *ok = false;
            return MLA_OK;
        }
        sstate *t = a;
        a = b;
        b = t;
    }
    *ok = true;
    *res = a;
    return MLA_OK;
}

/* The stacks of the current state whose token element takes token id, advanced and expanded,
 * appended to tmp. None while the state is inside a character. */
static void step_token_elems(gram_match *m, uint32_t id) {
    const gram *g = m->g;
    if (m->cur.need) return;
    for (uint32_t i = 0; i < m->cur.n && !m->failed; i++) {
        const uint32_t s = m->cur.st[i];
        if (s == NONE) continue;
        const elem *e = &g->el[m->nd[s].pos];
        if (!((e->kind == E_TOKEN && e->val == id) || (e->kind == E_NTOKEN && e->val != id))) continue;
        const uint32_t t = mk(m, m->nd[s].pos + 1, m->nd[s].parent);
        if (!m->failed) expand(m, t, 0);
    }
}

/* Runs token id of v from the current state: its text through the character elements and the
 * token itself through the token elements, the union into *res; *ok when either takes it. */
static int run_token(gram_match *m, const gram_vocab *v, uint32_t id, bool *ok, sstate **res) {
    sstate *d = level(m, 2); /* first: run_bytes's levels must not move after it returns */
    sstate *r = NULL;
    bool by_text = false;
    *ok = false;
    if (id < v->n && v->len[id] && run_bytes(m, v->bytes[id], v->len[id], &by_text, &r)) return MLA_ERR;
    m->n_tmp = 0;
    if (vocab_has(v, id) && !v->eos[id]) step_token_elems(m, id); /* the end only where complete */
    if (m->failed) return MLA_ERR;
    if (!m->n_tmp) {
        *ok = by_text;
        *res = r;
        return MLA_OK;
    }
    /* a token whose text ends inside a character, which a token element also takes, goes on by the
     * token element alone (one state cannot hold both) */
    if (by_text && !r->need)
        for (uint32_t i = 0; i < r->n; i++) tmp_push(m, r->st[i]);
    if (settle(m, d)) return MLA_ERR;
    d->cp = 0;
    d->need = d->tot = 0;
    *ok = true;
    *res = d;
    return MLA_OK;
}

/* Runs bytes (v NULL) or token id of v from the current state, *ok when taken; keeps the result as
 * the state when commit and it is taken (else the state and its nodes stay as they were). */
static int advance(gram_match *m, const gram_vocab *v, uint32_t id, const uint8_t *bytes, size_t len, bool commit,
                   bool *ok, mla_err *err) {
    m->err = err;
    m->failed = 0;
    uint32_t mark = m->n_nd;
    sstate *res = NULL;
    const int rc = v ? run_token(m, v, id, ok, &res) : run_bytes(m, bytes, len, ok, &res);
    if (rc == MLA_OK && *ok && commit) {
        state_copy(&m->cur, res);
        return MLA_OK;
    }
    rollback(m, mark);
    return rc;
}

int gram_match_try_token(gram_match *m, const gram_vocab *v, uint32_t id, bool *ok, mla_err *err) {
    return advance(m, v, id, NULL, 0, false, ok, err);
}

int gram_match_accept_token(gram_match *m, const gram_vocab *v, uint32_t id, mla_err *err) {
    bool ok = false;
    if (advance(m, v, id, NULL, 0, true, &ok, err)) return MLA_ERR;
    return ok ? MLA_OK : mla_errf(err, "grammar: token %u is not accepted here", id);
}

int gram_match_try(gram_match *m, const uint8_t *bytes, size_t len, bool *ok, mla_err *err) {
    return advance(m, NULL, 0, bytes, len, false, ok, err);
}

int gram_match_accept(gram_match *m, const uint8_t *bytes, size_t len, mla_err *err) {
    bool ok = false;
    if (advance(m, NULL, 0, bytes, len, true, &ok, err)) return MLA_ERR;
    return ok ? MLA_OK : mla_errf(err, "grammar: the input is not accepted here");
}

bool gram_match_complete(const gram_match *m) {
    return m->cur.need == 0 && m->cur.n > 0 && m->cur.st[m->cur.n - 1] == NONE; /* NONE sorts last */
}

#define GRAM_MAX_WALK_STATES 32768

static uint64_t state_hash(const sstate *x) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)x->cp << 8 | x->need);
    for (uint32_t i = 0; i < x->n; i++) h = (h ^ x->st[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

/* The id of state x in the walk's table (added when new); -1 beyond the bound. */
static int32_t intern(gram_match *m, const sstate *x) {
    if (m->n_ws * 2 >= m->wh_cap) {
        uint32_t nc = m->wh_cap ? m->wh_cap * 2 : 1024;
        free(m->wh);
        m->wh = mla_xmalloc(nc * sizeof *m->wh);
        memset(m->wh, 0xFF, nc * sizeof *m->wh);
        m->wh_cap = nc;
        for (uint32_t i = 0; i < m->n_ws; i++) {
            sstate y = {m->wpool + m->ws[i].off, m->ws[i].n, 0, m->ws[i].cp, m->ws[i].need, m->ws[i].tot};
            uint32_t b = (uint32_t)state_hash(&y) & (nc - 1);
            while (m->wh[b] != UINT32_MAX) b = (b + 1) & (nc - 1);
            m->wh[b] = i;
        }
    }
    uint32_t b = (uint32_t)state_hash(x) & (m->wh_cap - 1);
    for (; m->wh[b] != UINT32_MAX; b = (b + 1) & (m->wh_cap - 1)) {
        const struct wstate *w = &m->ws[m->wh[b]];
        if (w->n == x->n && w->cp == x->cp && w->need == x->need && w->tot == x->tot &&
            !memcmp(m->wpool + w->off, x->st, x->n * sizeof *x->st))
            return (int32_t)m->wh[b];
    }
    if (m->n_ws >= GRAM_MAX_WALK_STATES) {
        if (!m->failed)
            mla_errf(m->err, "grammar: more than %d states in one token mask", GRAM_MAX_WALK_STATES);
        m->failed = 1;
        return -1;
    }
    if (m->n_ws == m->cap_ws) {
        m->cap_ws = m->cap_ws ? m->cap_ws * 2 : 64;
        m->ws = mla_xrealloc(m->ws, m->cap_ws * sizeof *m->ws);
        m->trans = mla_xrealloc(m->trans, (size_t)m->cap_ws * 256 * sizeof *m->trans);
    }
    if (m->n_wpool + x->n > m->cap_wpool) {
        m->cap_wpool = (m->n_wpool + x->n) * 2;
        m->wpool = mla_xrealloc(m->wpool, m->cap_wpool * sizeof *m->wpool);
    }
    if (x->n) memcpy(m->wpool + m->n_wpool, x->st, x->n * sizeof *x->st);
    uint32_t id = m->n_ws++;
    m->ws[id] = (struct wstate){(uint32_t)m->n_wpool, x->n, x->cp, x->need, x->tot};
    m->n_wpool += x->n;
    for (int k = 0; k < 256; k++) m->trans[(size_t)id * 256 + (size_t)k] = -2;
    m->wh[b] = id;
    return (int32_t)id;
}

/* The state after byte b from state id (-1: dead; -3: a bound was hit). */
static int32_t trans(gram_match *m, int32_t id, uint8_t b) {
    int32_t *t = &m->trans[(size_t)id * 256 + b];
    if (*t != -2) return *t;
    sstate *src = level(m, 0), *dst = level(m, 1);
    const struct wstate *w = &m->ws[id];
    if (w->n > src->cap) {
        src->cap = w->n * 2;
        src->st = mla_xrealloc(src->st, src->cap * sizeof *src->st);
    }
    if (w->n) memcpy(src->st, m->wpool + w->off, w->n * sizeof *src->st);
    src->n = w->n;
    src->cp = w->cp;
    src->need = w->need;
    src->tot = w->tot;
    if (step_byte(m, src, b, dst)) return -3;
    int32_t r = dst->n ? intern(m, dst) : -1;
    if (r == -1 && m->failed) return -3;
    m->trans[(size_t)id * 256 + b] = r; /* trans may have moved */
    return r;
}

static int64_t walk(gram_match *m, const gram_vocab *v, uint32_t tn, int32_t state, uint8_t *allow) {
    int64_t cnt = 0;
    const uint32_t *kid = v->kid + v->first[tn];
    for (uint32_t j = 0, nk = v->nkid[tn]; j < nk; j++) {
        uint32_t c = kid[j];
        int32_t ns = trans(m, state, v->fbyte[c]);
        if (ns == -3) return -1;
        if (ns < 0) continue;
        for (uint32_t t = v->ftok[c]; t != UINT32_MAX; t = v->tok_next[t]) {
            allow[t] = 1;
            cnt++;
        }
        if (v->nkid[c]) {
            int64_t k = walk(m, v, c, ns, allow);
            if (k < 0) return -1;
            cnt += k;
        }
    }
    return cnt;
}

/* The tokens the current state's token elements take (end of sequence never), added to
 * allow; the count added. Two !<[id]> of different ids take every token between them. */
static int64_t token_elems_mask(const gram_match *m, const gram_vocab *v, uint8_t *allow) {
    const gram *g = m->g;
    if (m->cur.need) return 0;
    int64_t cnt = 0;
    uint32_t neg = UINT32_MAX; /* the one id every !<[id]> names so far; UINT32_MAX - 1: several */
    for (uint32_t i = 0; i < m->cur.n; i++) {
        const uint32_t s = m->cur.st[i];
        if (s == NONE) continue;
        const elem *e = &g->el[m->nd[s].pos];
        if (e->kind == E_TOKEN && vocab_has(v, e->val) && !v->eos[e->val] && !allow[e->val]) {
            allow[e->val] = 1;
            cnt++;
        } else if (e->kind == E_NTOKEN) {
            neg = neg == UINT32_MAX || neg == e->val ? e->val : UINT32_MAX - 1;
        }
    }
    if (neg != UINT32_MAX)
        for (uint32_t t = 0; t < v->n; t++)
            if (t != neg && !allow[t] && !v->eos[t] && vocab_has(v, t)) {
                allow[t] = 1;
                cnt++;
            }
    return cnt;
}

static bool same_state(const sstate *a, const sstate *b) {
    return a->n == b->n && a->cp == b->cp && a->need == b->need && a->tot == b->tot &&
           (!a->n || !memcmp(a->st, b->st, a->n * sizeof *a->st));
}

void gram_vocab_freeze(gram_vocab *v) { freeze(v); }

int64_t gram_match_mask(gram_match *m, gram_vocab *v, uint8_t *allow, mla_err *err) {
    freeze(v);
    m->err = err;
    m->failed = 0;
    for (uint32_t k = 0; k < GRAM_MASK_CACHE; k++) {
        struct mcache *c = &m->mc[k];
        if (!c->used || c->v != v || !same_state(&c->key, &m->cur)) continue;
        for (uint32_t i = 0; i < v->n; i++) allow[i] = (uint8_t)(c->bits[i >> 6] >> (i & 63) & 1);
        return c->cnt;
    }
    memset(allow, 0, v->n);
    uint32_t mark = m->n_nd;
    m->n_ws = 0;
    m->n_wpool = 0;
    if (m->wh) memset(m->wh, 0xFF, m->wh_cap * sizeof *m->wh);
    int32_t s0 = intern(m, &m->cur);
    int64_t cnt = s0 < 0 ? -1 : walk(m, v, 0, s0, allow);
    rollback(m, mark);
    if (cnt < 0) return -1;
    cnt += token_elems_mask(m, v, allow);
    if (gram_match_complete(m))
        for (uint32_t i = 0; i < v->n; i++)
            if (v->eos[i] && !allow[i]) {
                allow[i] = 1;
                cnt++;
            }
    struct mcache *c = &m->mc[m->mc_next++ % GRAM_MASK_CACHE];
    state_copy(&c->key, &m->cur);
    c->v = v;
    c->cnt = cnt;
    c->used = true;
    size_t words = ((size_t)v->n + 63) / 64;
    c->bits = mla_xrealloc(c->bits, (words ? words : 1) * sizeof *c->bits);
    memset(c->bits, 0, (words ? words : 1) * sizeof *c->bits);
    for (uint32_t i = 0; i < v->n; i++)
        if (allow[i]) c->bits[i >> 6] |= 1ull << (i & 63);
    return cnt;
}
