/* Unit tests of common/mla_switch: defaults, typed getters, bad values rejected with the
 * variable's name and what it accepts, unknown MLA_* variables rejected, the printed table.
 * Built twice: against the build's library (test `switch`) and with mla_switch.c compiled
 * without MLA_DEV_SWITCHES (test `switch_release`), so both kinds of build are checked. The
 * switches whose default the kernels also hold as a macro (the GPU checks' and the chooser's
 * starting values) have the same default in both places. */
#include <stdlib.h>
#include <string.h>

#include "common/mla_switch.h"
#include "kernels/cuda_ops.h"
#include "mla_test.h"

extern char **environ;

/* unsets every MLA_* variable, so the test starts from the defaults */
static void clear_mla_env(void) {
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++)
            if (!strncmp(*e, "MLA_", 4)) {
                const char *eq = strchr(*e, '=');
                size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
                if (n < sizeof name) {
                    memcpy(name, *e, n);
                    name[n] = '\0';
                }
                break;
            }
        if (!name[0]) break;
        unsetenv(name);
    }
    mla_switch_reset();
}

static int check_fails_with(const char *a, const char *b) {
    char err[1024] = "";
    int rc = mla_switch_check(err, sizeof err);
    int ok = rc != 0 && strstr(err, a) && (!b || strstr(err, b));
    if (!ok) fprintf(stderr, "  check: rc %d, message '%s' (wanted '%s' and '%s')\n", rc, err, a, b ? b : "");
    return ok;
}

static int check_passes(void) {
    char err[1024] = "";
    int rc = mla_switch_check(err, sizeof err);
    if (rc) fprintf(stderr, "  check failed: %s\n", err);
    return rc == 0;
}

/* whether the printed table has a line starting with name */
static int printed(const char *name) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    REQUIRE(f);
    mla_switch_print(f);
    fclose(f);
    int found = 0;
    size_t len = strlen(name);
    for (char *line = buf; line && *line;) {
        if (!strncmp(line, name, len) && line[len] == ' ') found = 1;
        char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return found;
}

static void test_unknown(void) {
    clear_mla_env();
    CHECK(check_passes());
    setenv("MLA_STEP_TRACEE", "/tmp", 1); /* a typo */
    CHECK(check_fails_with("MLA_STEP_TRACEE: unknown variable", NULL));
    unsetenv("MLA_STEP_TRACEE");
    setenv("MLA_BACKEND", "cpu", 1); /* a user setting: a flag now (--backend), no longer a switch */
    CHECK(check_fails_with("MLA_BACKEND: unknown variable", NULL));
    unsetenv("MLA_BACKEND");
    setenv("MLA_FIXTURES", "/somewhere", 1); /* read by the build and the tests, not the programs */
    CHECK(check_passes());
    setenv("MLASERVE_API_KEY", "k", 1); /* not an MLA_* name */
    CHECK(check_passes());
    clear_mla_env();
}

static void test_dev(void) {
    CHECK(atol(mla_sw_def_of(MLA_SW_CUDA_GEMVM_TMIN)->def) == MLA_CUDA_GEMVM_TMIN);
    CHECK(atol(mla_sw_def_of(MLA_SW_CUDA_GEMVM_GRP)->def) == MLA_CUDA_GEMVM_GRP_TMAX);
    clear_mla_env();
    CHECK(!mla_sw_is_set(MLA_SW_WORKER_STEP_DELAY_MS));
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 0);
    CHECK(mla_sw_int(MLA_SW_TEST_ENGINE_FAIL_LOAD) == -1);
    CHECK(mla_sw_bool(MLA_SW_LOCAL_LINK));
    CHECK(!mla_sw_bool(MLA_SW_ROPE_FREQ_BF16));
    CHECK(mla_sw_str(MLA_SW_STEP_TRACE) == NULL);
    CHECK(mla_sw_str(MLA_SW_CUDA_ATTN) == NULL);
    CHECK(printed("MLA_WORKER_STEP_DELAY_MS") && printed("MLA_CUDA_KV") && printed("NAME"));

    /* good values, read once: a later change is not seen until a reset */
    setenv("MLA_WORKER_STEP_DELAY_MS", "250", 1);
    setenv("MLA_LOCAL_LINK", "0", 1);
    setenv("MLA_CUDA_ATTN", "fp32", 1);
    setenv("MLA_STEP_TRACE", "/tmp/tr", 1);
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 0); /* cached from above */
    mla_switch_reset();
    CHECK(check_passes());
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 250);
    CHECK(mla_sw_is_set(MLA_SW_WORKER_STEP_DELAY_MS));
    CHECK(!mla_sw_bool(MLA_SW_LOCAL_LINK));
    CHECK(mla_sw_str(MLA_SW_CUDA_ATTN) && !strcmp(mla_sw_str(MLA_SW_CUDA_ATTN), "fp32"));
    CHECK(mla_sw_str(MLA_SW_STEP_TRACE) && !strcmp(mla_sw_str(MLA_SW_STEP_TRACE), "/tmp/tr"));
    setenv("MLA_WORKER_STEP_DELAY_MS", "", 1); /* empty: the default */
    mla_switch_reset();
    CHECK(check_passes());
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 0);
    clear_mla_env();

    /* bad values: the check names the variable, the value and what it accepts; the getter keeps
     * the default */
    setenv("MLA_LOCAL_LINK", "yes", 1);
    CHECK(check_fails_with("MLA_LOCAL_LINK=yes: expected 0 or 1", NULL));
    CHECK(mla_sw_bool(MLA_SW_LOCAL_LINK));
    clear_mla_env();
    setenv("MLA_WORKER_STEP_DELAY_MS", "-5", 1);
    CHECK(check_fails_with("MLA_WORKER_STEP_DELAY_MS=-5: expected an integer from 0 to 600000", NULL));
    setenv("MLA_WORKER_STEP_DELAY_MS", "12ms", 1);
    CHECK(check_fails_with("MLA_WORKER_STEP_DELAY_MS=12ms", "integer"));
    setenv("MLA_WORKER_STEP_DELAY_MS", "99999999999999999999", 1);
    CHECK(check_fails_with("MLA_WORKER_STEP_DELAY_MS=99999999999999999999", "integer"));
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 0);
    clear_mla_env();
    setenv("MLA_CUDA_KV", "bf16", 1);
    CHECK(check_fails_with("MLA_CUDA_KV=bf16: expected one of f16|f32", NULL));
    CHECK(mla_sw_str(MLA_SW_CUDA_KV) == NULL);
    /* every problem is listed */
    setenv("MLA_NO_SUCH", "1", 1);
    CHECK(check_fails_with("MLA_CUDA_KV=bf16", "MLA_NO_SUCH: unknown variable"));
    clear_mla_env();
}

static void test_release(void) {
    /* no developer switch: not printed, not read, and setting one is the unknown-variable error */
    clear_mla_env();
    CHECK(!mla_sw_available(MLA_SW_STEP_TRACE));
    CHECK(!printed("MLA_STEP_TRACE") && !printed("MLA_WORKER_STEP_DELAY_MS") && printed("NAME"));
    setenv("MLA_WORKER_STEP_DELAY_MS", "250", 1);
    mla_switch_reset();
    CHECK(check_fails_with("MLA_WORKER_STEP_DELAY_MS: unknown variable", "MLA_DEV_SWITCHES=OFF"));
    CHECK(mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS) == 0);
    CHECK(!mla_sw_is_set(MLA_SW_WORKER_STEP_DELAY_MS));
    clear_mla_env();
}

int main(void) {
    const int release = !mla_switch_dev_build();
#ifdef MLA_TEST_RELEASE_SWITCHES
    CHECK(release); /* mla_switch.c compiled here without MLA_DEV_SWITCHES */
#endif
    /* at most 12 switches in a build without developer switches */
    int n_release = 0;
    for (int i = 0; i < MLA_SW_COUNT; i++) {
        const mla_sw_def *d = mla_sw_def_of((mla_sw_id)i);
        CHECK((int)d->id == i && !strncmp(d->name, "MLA_", 4) && d->meaning && d->meaning[0]);
        n_release += !d->dev_only;
    }
    CHECKF(n_release <= 12, "%d switches in a release build", n_release);
    test_unknown();
    if (release)
        test_release();
    else
        test_dev();
    return mla_test_finish();
}
