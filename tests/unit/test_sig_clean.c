/* common/sig_clean.h: a child process registers files, a folder and a host-collective segment,
 * forgets one file, then gets SIGTERM (or SIGINT, SIGHUP): it must die by that signal, with what
 * was registered removed (files before their folder) and the forgotten file kept. Also: a full
 * table and a path too long are refused (-1) and change nothing; a forgotten entry is reused; a
 * signal the process started ignoring stays ignored. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_host.h"
#include "mla_test.h"
#include "sig_clean.h"

static int exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static void touch(const char *p) {
    FILE *f = fopen(p, "w");
    if (!f || fputs("x", f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(1);
    }
}

/* a child that runs setup(ctx) (exit 3 when it fails), says it is ready and waits for signals;
 * its pid once it is ready */
static pid_t spawn_ready(int (*setup)(void *), void *ctx) {
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        if (setup(ctx) != 0) _exit(3);
        if (write(p[1], "r", 1) != 1) _exit(5);
        for (;;) pause();
    }
    close(p[1]);
    char c = 0;
    CHECK(read(p[0], &c, 1) == 1 && c == 'r');
    close(p[0]);
    return pid;
}

/* what the child registers: a folder, two files in it, a segment, and a file it forgets */
typedef struct regs {
    const char *dir, *a, *b, *kept, *shm;
} regs;

static int register_all(void *ctx) {
    const regs *r = ctx;
    /* the folder first: removal runs files before folders whatever the order registered */
    if (sig_clean_install() != 0 || sig_clean_dir(r->dir) < 0 || sig_clean_file(r->a) < 0 || sig_clean_file(r->b) < 0)
        return -1;
    int k = sig_clean_file(r->kept);
    if (k < 0) return -1;
    sig_clean_forget(k);
    coll_host_seg *seg = NULL;
    mla_err err;
    return coll_host_seg_create(&seg, r->shm, 2, 0, &err) == MLA_OK ? 0 : -1;
}

static void one_signal(const char *base, int sig) {
    char dir[256], a[512], b[512], kept[512], shm[COLL_HOST_NAME_MAX], shm_path[COLL_HOST_NAME_MAX + 16];
    snprintf(dir, sizeof dir, "%s/d%d", base, sig);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b.sock", dir);
    snprintf(kept, sizeof kept, "%s/kept", base);
    REQUIRE(mkdir(dir, 0700) == 0);
    touch(a);
    touch(b);
    touch(kept);
    coll_host_make_name(shm, sizeof shm);
    snprintf(shm_path, sizeof shm_path, "/dev/shm%s", shm);
    regs r = {dir, a, b, kept, shm};
    pid_t pid = spawn_ready(register_all, &r);
    CHECK(exists(shm_path)); /* the segment is where the handler looks for it */
    kill(pid, sig);
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    CHECKF(WIFSIGNALED(ws) && WTERMSIG(ws) == sig, "signal %d: status 0x%x", sig, ws);
    CHECKF(!exists(a) && !exists(b) && !exists(dir), "signal %d: the files and their folder removed", sig);
    CHECKF(!exists(shm_path), "signal %d: %s removed", sig, shm_path);
    CHECKF(exists(kept), "signal %d: the forgotten file kept", sig);
    unlink(kept);
    unlink(shm_path);
}

/* a signal the process starts ignoring (nohup: SIGHUP) stays ignored: the child outlives it, and a
 * SIGTERM still cleans up and ends it */
static int ignore_hup_then_register(void *ctx) {
    signal(SIGHUP, SIG_IGN);
    return sig_clean_install() != 0 || sig_clean_file(ctx) < 0 ? -1 : 0;
}

static void test_ignored(const char *base) {
    char f[512];
    snprintf(f, sizeof f, "%s/ign", base);
    touch(f);
    pid_t pid = spawn_ready(ignore_hup_then_register, f);
    kill(pid, SIGHUP);
    usleep(200 * 1000);
    int ws = 0;
    CHECKF(waitpid(pid, &ws, WNOHANG) == 0 && access(f, F_OK) == 0, "an ignored SIGHUP ended the process");
    kill(pid, SIGTERM);
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM && access(f, F_OK) != 0);
    unlink(f);
}

static void test_table(void) {
    int ids[SIG_CLEAN_MAX];
    int n = 0;
    for (; n < SIG_CLEAN_MAX; n++)
        if ((ids[n] = sig_clean_file("/nonexistent/mla-sig-clean")) < 0) break;
    CHECK(n == SIG_CLEAN_MAX);                                    /* every entry free here */
    CHECK(sig_clean_file("/nonexistent/one-more") == -1);       /* full */
    sig_clean_forget(ids[3]);
    CHECK(sig_clean_dir("/nonexistent/reused") == ids[3]);      /* a forgotten entry is reused */
    for (int i = 0; i < n; i++) sig_clean_forget(ids[i]);
    sig_clean_forget(-1); /* nothing */
    static char longp[SIG_CLEAN_PATH + 8];
    memset(longp, 'x', sizeof longp - 1);
    CHECK(sig_clean_file(longp) == -1); /* too long */
    longp[SIG_CLEAN_PATH - 1] = '\0';
    int id = sig_clean_file(longp); /* SIG_CLEAN_PATH - 1 bytes: fits */
    CHECK(id >= 0);
    sig_clean_forget(id);
}

int main(void) {
    char base[] = "/tmp/mla-sig-clean-XXXXXX";
    REQUIRE(mkdtemp(base) != NULL);
    test_table();
    one_signal(base, SIGTERM);
    one_signal(base, SIGINT);
    one_signal(base, SIGHUP);
    test_ignored(base);
    CHECK(rmdir(base) == 0);
    return mla_test_finish();
}
