/* sig_clean: files and folders removed when a signal ends the process (common/sig_clean.h). */
#include "sig_clean.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* an entry's state: FREE, CLAIMED (its path being written, ignored by the handler), ready, or
 * REMOVING (the handler took it: neither forgotten nor reused while its path is read) */
enum { FREE, CLAIMED, FILE_READY, DIR_READY, REMOVING };

static struct {
    _Atomic int state;
    char path[SIG_CLEAN_PATH];
} entries[SIG_CLEAN_MAX];

static const int signals[] = {SIGINT, SIGTERM, SIGHUP};

static void remove_all(int kind) {
    for (int i = 0; i < SIG_CLEAN_MAX; i++) {
        int expect = kind; /* taken before its path is read: no thread rewrites it from here */
        if (!atomic_compare_exchange_strong(&entries[i].state, &expect, REMOVING)) continue;
        if (kind == FILE_READY)
            unlink(entries[i].path);
        else
            rmdir(entries[i].path);
    }
}

static void on_signal(int sig) {
    remove_all(FILE_READY);
    remove_all(DIR_READY);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* the signal is blocked while its handler runs: raised now, it ends the process on return */
    raise(sig);
}

int sig_clean_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) sigaddset(&sa.sa_mask, signals[i]);
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        struct sigaction old;
        if (sigaction(signals[i], NULL, &old) != 0) return -1;
        if (old.sa_handler == SIG_IGN) continue; /* started ignoring it (nohup, a background job): it still does */
        if (sigaction(signals[i], &sa, NULL) != 0) return -1;
    }
    return 0;
}

static int add(const char *path, int kind) {
    size_t n = strlen(path);
    if (n >= SIG_CLEAN_PATH) return -1;
    for (int i = 0; i < SIG_CLEAN_MAX; i++) {
        int expect = FREE;
        if (atomic_compare_exchange_strong(&entries[i].state, &expect, CLAIMED)) {
            memcpy(entries[i].path, path, n + 1);
            atomic_store(&entries[i].state, kind);
            return i;
        }
    }
    return -1;
}

int sig_clean_file(const char *path) { return add(path, FILE_READY); }

int sig_clean_dir(const char *path) { return add(path, DIR_READY); }

void sig_clean_forget(int id) {
    if (id < 0 || id >= SIG_CLEAN_MAX) return;
    int st = atomic_load(&entries[id].state); /* a ready entry goes free; one the handler took stays taken */
    if (st == FILE_READY || st == DIR_READY) atomic_compare_exchange_strong(&entries[id].state, &st, FREE);
}
