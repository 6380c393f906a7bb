/* `mlaserve keygen DIR [--client NAME] [--force]`: CURVE key pairs for the control plane
 * (coordinator/coord.h). Keys are Z85 text (40 characters and a newline), made with
 * zmq_curve_keypair (libsodium-backed libzmq).
 *
 * Without --client it writes the server pair and one client pair shared by the workers:
 *   DIR/server.key (secret, 0600)   DIR/server.pub
 *   DIR/client.key (secret, 0600)   DIR/client.pub
 *   DIR/authorized_keys             the client public keys the coordinator admits
 * and refuses to overwrite an existing server.key without --force. --client NAME adds a client
 * pair NAME.key / NAME.pub and sets NAME.pub's key in authorized_keys (replacing an earlier NAME
 * line: with --force the old key stops being admitted; a worker uses it with
 * --curve-client-key DIR/NAME.key). The coordinator needs server.key and authorized_keys; a
 * worker needs server.pub and its client key. DIR is created with mode 0700. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "cmds.h"
#include "common/mla_log.h"
#include "common/opts.h"
#include "common/mla_err.h"

static int write_file(const char *dir, const char *name, const char *text, mode_t mode, int append, mla_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), mode);
    if (fd < 0) return mla_errf(err, "cannot write %s: %s", path, strerror(errno));
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int rc = fchmod(fd, mode);
    if (close(fd) != 0 || w != (ssize_t)n || rc != 0) return mla_errf(err, "cannot write %s", path);
    return MLA_OK;
}

/* DIR/authorized_keys with client NAME's line (KEY NAME) set to line: any earlier line of that
 * name is dropped (a replaced key must stop being admitted), the others and the comments kept.
 * Lines are read as the coordinator reads them (coordinator/coord_reg.c): blanks around the
 * fields, "#" alone or before a blank starts a comment (a Z85 key may start with '#'). */
static int set_client_line(const char *dir, const char *name, const char *line, mla_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/authorized_keys", dir);
    FILE *f = fopen(path, "r");
    if (!f && errno != ENOENT) return mla_errf(err, "cannot read %s: %s", path, strerror(errno));
    char *text = NULL, *l = NULL;
    size_t tn = 0, cap = 0;
    FILE *mem = open_memstream(&text, &tn);
    if (!mem) {
        if (f) fclose(f);
        return mla_errf(err, "open_memstream: %s", strerror(errno));
    }
    const size_t nl = strlen(name);
    ssize_t got;
    while (f && (got = getline(&l, &cap, f)) >= 0) {
        const char *p = l;
        while (*p && isspace((unsigned char)*p)) p++;
        if (*p && !(p[0] == '#' && (!p[1] || isspace((unsigned char)p[1])))) {
            const char *q = p;
            while (*q && !isspace((unsigned char)*q)) q++; /* the key */
            while (*q == ' ' || *q == '\t') q++;
            const char *e = q;
            while (*e && !isspace((unsigned char)*e)) e++; /* its name */
            if ((size_t)(e - q) == nl && !memcmp(q, name, nl)) continue;
        }
        fputs(l, mem);
        if (got > 0 && l[got - 1] != '\n') fputc('\n', mem); /* a last line without its newline */
    }
    const bool bad = f && ferror(f);
    free(l);
    if (f) fclose(f);
    fputs(line, mem);
    fclose(mem);
    int rc = bad ? mla_errf(err, "cannot read %s", path) : write_file(dir, "authorized_keys", text, 0644, 0, err);
    free(text);
    return rc;
}

/* writes NAME.key and NAME.pub; pub_out gets the public key */
static int write_pair(const char *dir, const char *name, char pub_out[41], mla_err *err) {
    char secret[41], line[64], file[300];
    if (zmq_curve_keypair(pub_out, secret) != 0)
        return mla_errf(err, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    snprintf(line, sizeof line, "%s\n", secret);
    snprintf(file, sizeof file, "%s.key", name);
    int rc = write_file(dir, file, line, 0600, 0, err);
    memset(secret, 0, sizeof secret);
    memset(line, 0, sizeof line);
    if (rc) return rc;
    snprintf(line, sizeof line, "%s\n", pub_out);
    snprintf(file, sizeof file, "%s.pub", name);
    return write_file(dir, file, line, 0644, 0, err);
}

static int valid_name(const char *s) {
    if (!*s || strlen(s) > 64 || !strcmp(s, "server")) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_'))
            return 0;
    return 1;
}

int cmd_keygen(int argc, char **argv) {
    const char *dir = NULL, *client = NULL, *pos[1] = {NULL};
    int force = 0, n_pos = 0;
    const opt_spec specs[] = {
        {.name = "--client", .kind = OPT_STR, .arg = "NAME", .def = "none",
         .help = "also a key pair for another client, NAME.key (letters, digits, - and _)", .dest = &client},
        {.name = "--force", .kind = OPT_FLAG, .help = "overwrite keys that exist", .dest = &force},
        MLA_LOG_LEVEL_OPT_SOLO,
    };
    const opt_table tab = {"options", specs, sizeof specs / sizeof *specs};
    int st = opts_command("mlaserve keygen",
                          "usage: mlaserve keygen DIR [--client NAME] [--force]\n"
                          "CURVE key pairs for the coordinator <-> worker control plane (--curve-dir DIR).\n"
                          "DIR holds secret keys: it is made, or set, mode 0700 (a shared folder too: use one\n"
                          "of its own). --client NAME --force replaces NAME's line in authorized_keys.\n",
                          &tab, 1, argc, argv, pos, 1, &n_pos);
    if (st >= 0) return st;
    dir = n_pos ? pos[0] : NULL;
    if (!dir) {
        fprintf(stderr, "mlaserve keygen: the folder for the keys (DIR) is missing\n");
        goto usage;
    }
    if (client && !valid_name(client)) {
        fprintf(stderr, "mlaserve keygen: --client '%s': 1-64 letters, digits, - and _, not 'server'\n", client);
        goto usage;
    }
    mla_err err = {{0}};
    if (!zmq_has("curve")) {
        fprintf(stderr, "mlaserve keygen: this libzmq was built without CURVE support (needs libsodium)\n");
        return 1;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "mlaserve keygen: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    struct stat dst;
    if (stat(dir, &dst) != 0 || !S_ISDIR(dst.st_mode)) {
        fprintf(stderr, "mlaserve keygen: %s is not a folder\n", dir);
        return 1;
    }
    if ((dst.st_mode & 077) && chmod(dir, 0700) == 0) /* it holds secret keys: as if made here */
        fprintf(stderr, "mlaserve keygen: %s was mode %04o, now 0700\n", dir, (unsigned)dst.st_mode & 07777);
    char path[PATH_MAX], pub[41], line[128];
    if (client) {
        snprintf(path, sizeof path, "%s/server.key", dir);
        if (access(path, F_OK) != 0) {
            fprintf(stderr, "mlaserve keygen: %s does not exist: run `mlaserve keygen %s` first\n", path, dir);
            return 1;
        }
        snprintf(path, sizeof path, "%s/%s.key", dir, client);
        if (access(path, F_OK) == 0 && !force) {
            fprintf(stderr, "mlaserve keygen: %s exists (--force overwrites it)\n", path);
            return 1;
        }
        if (write_pair(dir, client, pub, &err)) goto fail;
        snprintf(line, sizeof line, "%s %s\n", pub, client);
        if (set_client_line(dir, client, line, &err)) goto fail;
        printf("wrote %s/%s.key and %s/%s.pub; set in %s/authorized_keys\n", dir, client, dir, client, dir);
        return 0;
    }
    snprintf(path, sizeof path, "%s/server.key", dir);
    if (access(path, F_OK) == 0 && !force) {
        fprintf(stderr, "mlaserve keygen: %s exists (--force replaces every key in %s)\n", path, dir);
        return 1;
    }
    if (write_pair(dir, "server", pub, &err) || write_pair(dir, "client", pub, &err)) goto fail;
    snprintf(line, sizeof line, "# client public keys the coordinator admits (Z85, one a line)\n%s client\n", pub);
    if (write_file(dir, "authorized_keys", line, 0644, 0, &err)) goto fail;
    printf("wrote %s/{server,client}.{key,pub} and %s/authorized_keys\n", dir, dir);
    return 0;
fail:
    fprintf(stderr, "mlaserve keygen: %s\n", err.msg);
    return 1;
usage:
    fprintf(stderr, "usage: mlaserve keygen DIR [--client NAME] [--force]\n"
                    "  writes CURVE key pairs for the coordinator <-> worker control plane\n");
    return 2;
}
