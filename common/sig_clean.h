/* sig_clean: what a command leaves behind when SIGINT, SIGTERM or SIGHUP ends it. A command
 * registers the files and folders it creates for the time they are incomplete or in use (the
 * control socket and its private folder, an output being written); sig_clean_install() sets
 * handlers for those signals that remove every registered entry (files first, then folders, in
 * the order registered) and then end the process by the same signal, as it would have ended
 * without them. A signal the process was started ignoring (nohup, a background job of a shell
 * script) stays ignored. `serve` replaces the SIGINT and SIGTERM handlers with its drain (its
 * shutdown removes the same entries); its SIGHUP, unless ignored, still ends it here.
 *
 * The table is process-wide and fixed (SIG_CLEAN_MAX entries of SIG_CLEAN_PATH bytes): nothing
 * is allocated, and the handler calls only async-signal-safe functions (unlink, rmdir, sigaction,
 * raise). Registering and forgetting are safe from any thread.
 *
 * Ownership: an entry holds a copy of its path; it stays until sig_clean_forget(its id). */
#ifndef SIG_CLEAN_H
#define SIG_CLEAN_H

#define SIG_CLEAN_MAX 16
#define SIG_CLEAN_PATH 4096

/* Handlers for SIGINT, SIGTERM and SIGHUP. 0, or -1 when sigaction fails (errno set). */
int sig_clean_install(void);

/* Registers a file (sig_clean_file) or an empty folder (sig_clean_dir) to remove on those
 * signals. Returns its id (>= 0), or -1 when the table is full or the path is longer than
 * SIG_CLEAN_PATH - 1 bytes: then that path is not removed, nothing else changes. */
int sig_clean_file(const char *path);
int sig_clean_dir(const char *path);

/* Forgets entry id (nothing for -1): its path is no longer removed. */
void sig_clean_forget(int id);

#endif
