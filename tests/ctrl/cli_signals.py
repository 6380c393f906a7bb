#!/usr/bin/env python3
"""What `mlaserve logits --processes` and `mlaserve generate` leave behind (common/sig_clean.h).

- logits --tp 2, its steps slowed (MLA_WORKER_STEP_DELAY_MS), ended by SIGTERM while it writes
  (into NAME.partial-* beside --out and --ids-out): it dies by SIGTERM, its control socket's folder
  ($TMPDIR/mla-coord-*) and the partial files are gone, no --out or --ids-out appeared, and its
  workers exit by themselves; started with SIGHUP ignored (nohup), a SIGHUP leaves it running;
- generate --tp 2 ended by SIGINT: the same for its folder and workers;
- logits failing on line 2 (a token id past the vocabulary): exit 1 naming it, no --out or
  --ids-out made, and an --out that was there before keeps its bytes; with --out /dev/null the
  same failure leaves /dev/null alone;
- a run that succeeds writes its files (through a symbolic link --out: into the file it names, the
  link kept) with the umask's mode, and leaves no folder and no partial file.
usage: cli_signals.py MLASERVE FIXTURES_DIR
"""
import glob
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "deploy"))
from dlib import alive, check, children_of, finish, wait_for  # noqa: E402

exe, fixtures = sys.argv[1:3]
umask = os.umask(0o022)
os.umask(umask)
model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)


def folders(tmp):
    return [d for d in os.listdir(tmp) if d.startswith("mla-coord-")]


def partial(path):
    return glob.glob(path + ".partial-*")


def interrupt(cmd, env, tmp, sig, files, ignored_first=None):
    """Starts cmd, waits until its workers run and every file of files is being written (its
    partial file exists), sends sig (after ignored_first, a signal the command was started
    ignoring, which must leave it running); returns its workers' pids."""
    pre = (lambda: signal.signal(ignored_first, signal.SIG_IGN)) if ignored_first else None
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pre)
    ok = wait_for(lambda: len(children_of(p.pid)) >= 2 and folders(tmp) and all(partial(f) for f in files)
                  or p.poll() is not None, 60, 0.1)
    kids = children_of(p.pid)
    time.sleep(0.5)  # a few slow steps in
    running = p.poll() is None
    check(ok and running, "%s: running with its workers and its files (%s)" % (cmd[1], folders(tmp)))
    if ignored_first:
        p.send_signal(ignored_first)
        time.sleep(0.5)
        check(p.poll() is None, "%s: signal %d, ignored from the start, leaves it running" % (cmd[1], ignored_first))
    p.send_signal(sig)
    out = p.communicate(timeout=60)[0]
    check(p.returncode == -sig, "%s: ended by signal %d (status %s)" % (cmd[1], sig, p.returncode), out[-500:])
    return kids


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "tmp")
        os.mkdir(tmp)
        env = dict(os.environ, TMPDIR=tmp, MLA_WORKER_STEP_DELAY_MS="100")
        toks = os.path.join(d, "t.txt")
        with open(toks, "w") as f:
            f.write("1 2 3 4 5 6 7 8\n")
        out, ids = os.path.join(d, "l.f32"), os.path.join(d, "ids.txt")
        base = [exe, "logits", "-m", model, "--tokens", toks, "--tp", "2", "--processes", "--backend", "cpu",
                "--heartbeat-timeout-ms", "3000"]

        kids = interrupt(base + ["--out", out, "--decode-from", "2", "--greedy", "200", "--ids-out", ids],
                         env, tmp, signal.SIGTERM, [out, ids], ignored_first=signal.SIGHUP)
        check(not folders(tmp), "logits: no control-socket folder left", folders(tmp))
        check(not os.path.exists(out) and not os.path.exists(ids) and not partial(out) and not partial(ids),
              "logits: no --out or --ids-out, no partial file", os.listdir(d))
        check(len(kids) == 2 and wait_for(lambda: not any(alive(k) for k in kids), 30, 0.1),
              "logits: its workers exited", kids)

        kids = interrupt([exe, "generate", "-m", model, "-p", "Hello", "-n", "200", "--tp", "2", "--backend", "cpu",
                          "--heartbeat-timeout-ms", "3000"], env, tmp, signal.SIGINT, [])
        check(not folders(tmp), "generate: no control-socket folder left", folders(tmp))
        check(len(kids) == 2 and wait_for(lambda: not any(alive(k) for k in kids), 30, 0.1),
              "generate: its workers exited", kids)

        env.pop("MLA_WORKER_STEP_DELAY_MS")
        with open(toks, "w") as f:
            f.write("1 2 3\n1 999999 3\n")
        with open(ids, "w") as f:
            f.write("kept\n")
        r = subprocess.run(base + ["--out", out, "--greedy", "2", "--ids-out", ids], env=env,
                           capture_output=True, text=True, timeout=240)
        check(r.returncode == 1 and "line 2: token id 999999" in r.stderr, "a failing run: exit 1 naming the line",
              r.stderr[-300:])
        check(not os.path.exists(out) and open(ids).read() == "kept\n" and not partial(out) and not partial(ids),
              "a failing run: no --out made, the --ids-out that was there kept, no partial file", os.listdir(d))
        null_ino = os.stat("/dev/null").st_ino
        r = subprocess.run(base + ["--out", "/dev/null"], env=env, capture_output=True, text=True, timeout=240)
        st = os.stat("/dev/null")
        check(r.returncode == 1 and stat.S_ISCHR(st.st_mode) and st.st_ino == null_ino,
              "a failing run into /dev/null leaves it alone", r.stderr[-300:])
        check(not folders(tmp), "failing runs: no control-socket folder left", folders(tmp))

        with open(toks, "w") as f:
            f.write("1 2 3\n")
        real = os.path.join(d, "real.f32")
        link = os.path.join(d, "link.f32")
        with open(real, "w") as f:
            f.write("old")
        os.symlink(real, link)
        r = subprocess.run(base + ["--out", link, "--greedy", "2", "--ids-out", ids], env=env,
                           capture_output=True, text=True, timeout=240)
        check(r.returncode == 0 and os.path.islink(link) and os.path.getsize(real) == 3 * 2048 * 4 and
              open(ids).read() != "kept\n", "a good run writes its files, through the link", r.stderr[-300:])
        check(stat.S_IMODE(os.stat(real).st_mode) == 0o666 & ~umask, "the output has the umask's mode",
              oct(os.stat(real).st_mode))
        check(not folders(tmp) and not partial(real) and not partial(ids), "a good run: no folder, no partial file",
              os.listdir(d))
        # two of the files naming one (the same name, or a link to it): refused before anything is written
        before = open(real, "rb").read()
        for args, why in ((["--out", real, "--ids-out", link], "--out and --ids-out name the same file"),
                          (["--out", toks, "--ids-out", ids], "--out names the --tokens file"),
                          (["--out", real, "--ids-out", toks], "--ids-out names the --tokens file")):
            r = subprocess.run(base + args + ["--greedy", "2"], env=env, capture_output=True, text=True, timeout=240)
            check(r.returncode == 1 and why in r.stderr and open(toks).read() == "1 2 3\n" and
                  open(real, "rb").read() == before, "refused: " + why, r.stderr[-300:])
        # a --tokens that cannot be read (a folder) says so
        r = subprocess.run(base[:base.index("--tokens") + 1] + [d] + base[base.index("--tokens") + 2:] + ["--out", out],
                           env=env, capture_output=True, text=True, timeout=240)
        check(r.returncode == 1 and "Is a directory" in r.stderr, "a folder as --tokens: named so", r.stderr[-300:])
        # in one process too: --greedy beyond the model's context is refused up front, not an abort
        r = subprocess.run([exe, "logits", "-m", model, "--tokens", toks, "--out", out, "--greedy", "16777216",
                            "--ids-out", ids], env=env, capture_output=True, text=True, timeout=240)
        check(r.returncode == 1 and "pass the model's context length" in r.stderr and not partial(out),
              "in one process: --greedy past the context refused", r.stderr[-300:])
        # an option that would mean nothing is refused: any control-plane option with --in-process
        # (it runs no worker processes), --ids-out without --greedy
        for args, why in ((["--in-process", "--coll-timeout-ms", "5"], "the control-plane options do not apply"),
                          (["--in-process", "--step-ahead", "sync"], "the control-plane options do not apply"),
                          (["--ids-out", ids], "it needs --greedy N")):
            r = subprocess.run([exe, "logits", "-m", model, "--tokens", toks, "--out", out] + args, env=env,
                               capture_output=True, text=True, timeout=60)
            check(r.returncode == 2 and why in r.stderr, "refused: " + " ".join(args[:2]), r.stderr[-300:])
    finish()


main()
