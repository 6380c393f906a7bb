/* opts: `--opt value` and `--opt=value`, flags, bounds, choices, callbacks, positionals, the
 * stop at a subcommand, unknown options named, and --help listing meanings and defaults. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "mla_test.h"

typedef struct vals {
    const char *model, *prompt;
    int tp, flag, choice;
    long big;
    double temp;
    float topp;
    uint64_t seed;
    int n_stop;
    const char *stops[4];
} vals;

static int add_stop(void *ctx, const char *v, mla_err *err) {
    vals *o = ctx;
    if (o->n_stop >= 4) return mla_errf(err, "at most 4 values");
    o->stops[o->n_stop++] = v;
    return MLA_OK;
}

static const char *const modes[] = {"stop", "restart", "exit", NULL};

static int parse(vals *o, int argc, char **argv, int flags, const char **pos, int *n_pos, int *next, int *help,
                 mla_err *err) {
    memset(o, 0, sizeof *o);
    o->tp = 1;
    const opt_spec a[] = {
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH", .help = "the model", .dest = &o->model},
        {.name = "--tp", .kind = OPT_INT, .arg = "N", .def = "1", .help = "ranks", .dest = &o->tp, .lo = 1, .hi = 64},
        {.name = "--json", .kind = OPT_FLAG, .help = "JSON output", .dest = &o->flag},
        {.name = "--prompt", .kind = OPT_STR, .arg = "TEXT", .help = "a text", .dest = &o->prompt, .empty_ok = true},
    };
    const opt_spec b[] = {
        {.name = "--big", .kind = OPT_LONG, .arg = "N", .help = "a long", .dest = &o->big},
        {.name = "--temp", .kind = OPT_DOUBLE, .arg = "T", .def = "0", .help = "temperature", .dest = &o->temp, .lo = 0, .hi = 2},
        {.name = "--top-p", .kind = OPT_FLOAT, .arg = "P", .help = "nucleus", .dest = &o->topp, .lo = 0, .hi = 1,
         .lo_open = true},
        {.name = "--seed", .kind = OPT_U64, .arg = "S", .help = "seed", .dest = &o->seed},
        {.name = "--on-failure", .kind = OPT_CHOICE, .arg = "MODE", .def = "stop", .help = "policy", .dest = &o->choice,
         .choices = modes},
        {.name = "--stop", .kind = OPT_FN, .arg = "TEXT", .help = "stop text (repeatable)", .fn = add_stop, .ctx = o},
    };
    const opt_table t[] = {{"one", a, 4}, {"two", b, 6}};
    return opts_parse(t, 2, argc, argv, 1, flags, pos, 2, n_pos, next, help, err);
}

#define ARGV(...) ((char *[]){"cmd", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"cmd", __VA_ARGS__}) / sizeof(char *)))
#define P(...) parse(&o, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), 0, pos, &np, &next, &help, &err)

int main(void) {
    vals o;
    mla_err err = {{0}};
    const char *pos[2];
    int np = 0, next = 0, help = 0;

    /* both spellings, aliases, every kind */
    CHECK(P("-m", "a.gguf", "--tp=8", "--json", "--big", "-5", "--temp=0.7", "--top-p", "0.9", "--seed=18446744073709551615",
            "--on-failure=exit", "--stop", "x", "--stop=y") == MLA_OK);
    CHECK(o.model && !strcmp(o.model, "a.gguf"));
    CHECK(o.tp == 8 && o.flag == 1 && o.big == -5);
    CHECK(o.temp > 0.69 && o.temp < 0.71 && o.topp > 0.89f && o.topp < 0.91f);
    CHECK(o.seed == UINT64_MAX && o.choice == 2);
    CHECK(o.n_stop == 2 && !strcmp(o.stops[0], "x") && !strcmp(o.stops[1], "y"));
    CHECK(np == 0 && next == 15 && help == 0);
    CHECK(P("--model=b=c.gguf") == MLA_OK && !strcmp(o.model, "b=c.gguf")); /* only the first '=' splits */
    CHECK(P("--stop=") == MLA_OK && o.n_stop == 1 && !strcmp(o.stops[0], ""));
    /* an empty string (an unset variable expanded) is refused, but where it is a value */
    CHECK(P("--model", "") == MLA_ERR && strstr(err.msg, "--model: the value is empty"));
    CHECK(P("-m", "") == MLA_ERR && P("--model=") == MLA_ERR && strstr(err.msg, "--model: the value is empty"));
    CHECK(P("--prompt", "") == MLA_OK && o.prompt && !o.prompt[0]);

    /* positionals, "--", help */
    CHECK(P("in.gguf", "--tp", "2", "--", "--json") == MLA_OK);
    CHECK(np == 2 && !strcmp(pos[0], "in.gguf") && !strcmp(pos[1], "--json") && o.flag == 0 && o.tp == 2);
    CHECK(P("x", "y", "z") == MLA_ERR && strstr(err.msg, "'z'"));
    CHECK(P("--help") == MLA_OK && help == 1);
    help = 0;
    CHECK(P("-h") == MLA_OK && help == 1);

    /* errors name the option */
    CHECK(P("--nope", "1") == MLA_ERR && strstr(err.msg, "unknown option '--nope'"));
    CHECK(P("--nope=1") == MLA_ERR && strstr(err.msg, "'--nope'") && !strstr(err.msg, "=1"));
    CHECK(P("--tp") == MLA_ERR && strstr(err.msg, "--tp needs a value"));
    CHECK(P("--tp", "0") == MLA_ERR && strstr(err.msg, "--tp") && strstr(err.msg, "[1, 64]"));
    CHECK(P("--tp=65") == MLA_ERR);
    CHECK(P("--tp", "3x") == MLA_ERR && strstr(err.msg, "'3x'"));
    CHECK(P("--tp", "") == MLA_ERR);
    CHECK(P("--big", "99999999999999999999999") == MLA_ERR);
    CHECK(P("--temp", "nan") == MLA_ERR && P("--temp", "2.5") == MLA_ERR);
    CHECK(P("--seed", "-1") == MLA_ERR && strstr(err.msg, "--seed: '-1' is not a whole number from 0 to"));
    /* numbers as written: a blank before one (strtoull would read " -1" as 2^64 - 1) or after it,
     * and hex (a float's "0x1p1" would be 2), are refused */
    CHECK(P("--seed", " -1") == MLA_ERR && strstr(err.msg, "' -1'"));
    CHECK(P("--tp", " 2") == MLA_ERR && P("--tp", "2 ") == MLA_ERR && P("--big", "\t-5") == MLA_ERR);
    CHECK(P("--temp", "0x1p0") == MLA_ERR && P("--tp", "0x2") == MLA_ERR);
    CHECK(P("--temp", "1e-1") == MLA_OK && o.temp > 0.09 && o.temp < 0.11);
    /* an open lower bound: (0, 1] */
    CHECK(P("--top-p", "0") == MLA_ERR && strstr(err.msg, "--top-p: '0' is not a number in (0, 1]"));
    CHECK(P("--top-p", "1e-9") == MLA_OK && P("--top-p", "1") == MLA_OK && o.topp == 1.0f);
    CHECK(P("--json=1") == MLA_ERR && strstr(err.msg, "--json takes no value"));
    CHECK(P("--on-failure", "maybe") == MLA_ERR && strstr(err.msg, "stop, restart, exit"));
    CHECK(P("--stop", "1", "--stop", "2", "--stop", "3", "--stop", "4", "--stop", "5") == MLA_ERR &&
          strstr(err.msg, "--stop: at most 4"));
    CHECK(parse(&o, 3, ARGV("-h", "x"), 0, pos, &np, &next, NULL, &err) == MLA_ERR); /* no help wanted */

    /* a subcommand ends the parse */
    char **av = ARGV("--tp", "4", "generate", "--tp", "9");
    CHECK(parse(&o, 6, av, OPTS_STOP_AT_POSITIONAL, pos, &np, &next, &help, &err) == MLA_OK);
    CHECK(o.tp == 4 && next == 3 && np == 0);

    /* --help text: every option, its value, meaning and default */
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    REQUIRE(f);
    const opt_spec s[] = {
        {.name = "--tp", .kind = OPT_INT, .arg = "N", .def = "1", .help = "tensor-parallel ranks", .dest = &o.tp},
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH", .help = "the GGUF file", .dest = &o.model},
        {.name = "--json", .kind = OPT_FLAG, .help = "JSON output", .dest = &o.flag}};
    const opt_table t = {"serving", s, 3};
    opts_help(f, "usage: x\n", &t, 1);
    fclose(f);
    CHECK(strstr(buf, "usage: x\n\nserving:\n"));
    CHECK(strstr(buf, "--tp N") && strstr(buf, "tensor-parallel ranks (default: 1)"));
    CHECK(strstr(buf, "-m, --model PATH") && strstr(buf, "the GGUF file\n"));
    CHECK(strstr(buf, "--json ") && !strstr(buf, "--json VALUE"));
    free(buf);

    printf("%d passed, %d failed\n", mla_test_pass_, mla_test_fail_);
    return mla_test_fail_ ? 1 : 0;
}
