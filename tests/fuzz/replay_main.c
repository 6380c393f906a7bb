/* Plain (non-libFuzzer) driver for any fuzz target: feeds every file named on the command
 * line, and every regular file under every folder named there (recursively), to
 * LLVMFuzzerTestOneInput once. Link it with a target's source (without -fsanitize=fuzzer) to
 * turn a seed/regression corpus into an ordinary test: a crash or sanitizer report fails it.
 * Exit status: 0 when every input ran, 2 on usage or I/O errors. */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int g_runs;

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 2;
    }
    /* an exact-size copy so that reads past the end are caught by ASan */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return 2;
    }
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    g_runs++;
    return 0;
}

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) return S_ISREG(st.st_mode) ? run_file(path) : 0;
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return 2;
    }
    /* sorted, for reproducible logs */
    struct dirent **names;
    closedir(d);
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        perror(path);
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        if (strcmp(nm, ".") && strcmp(nm, "..")) {
            size_t L = strlen(path) + strlen(nm) + 2;
            char *child = malloc(L);
            if (!child) return 2;
            snprintf(child, L, "%s/%s", path, nm);
            if (run_path(child)) rc = 2;
            free(child);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i])) rc = 2;
    fprintf(stderr, "replay: %d inputs ran\n", g_runs);
    if (g_runs == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 2;
    }
    return rc;
}
