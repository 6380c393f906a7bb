#!/usr/bin/env python3
"""`mlaserve env` and the start-up check of the MLA_* switches (common/mla_switch.h).

usage: test_env.py MLASERVE MLASERVE_WORKER DOCS_SWITCHES_MD

Checks: `mlaserve env` prints one row a switch (name, type, default, value, meaning) and shows a
value set in the environment; docs/switches.md holds the table this build prints (test builds:
developer switches included); an unknown MLA_* variable (a typo) and a bad value make
`mlaserve env` exit 1 and fail the start of mlaserve and of mlaserve-worker with a message
naming the variable."""
import os
import re
import subprocess
import sys

mlaserve, worker, doc = sys.argv[1:4]
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails += 1


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLA_")}
    env.update(extra)
    return env


def run(args, **extra):
    return subprocess.run(args, env=clean_env(**extra), capture_output=True, text=True, timeout=60)


r = run([mlaserve, "env"])
check(r.returncode == 0, "mlaserve env exits 0 in a clean environment (%d: %s)" % (r.returncode, r.stderr.strip()))
lines = r.stdout.splitlines()
check(lines and lines[0].split() == ["NAME", "TYPE", "DEFAULT", "VALUE", "MEANING"], "header: " + (lines[0] if lines else ""))
rows = {l.split()[0]: l for l in lines[1:] if l.startswith("MLA_")}
dev = "MLA_WORKER_STEP_DELAY_MS" in rows
check(dev or "MLA_DEV_SWITCHES=OFF" in r.stdout, "a build without developer switches says so")
check(len([n for n, l in rows.items() if "[dev]" not in l]) <= 12, "at most 12 switches outside the developer ones")
for name, line in rows.items():
    f = line.split()
    check(len(f) >= 5 and f[2 + (1 if f[1] in ("int", "enum") else 0) + 1] == "-",
          "%s: value column '-' when unset" % name)

if dev:
    # the documented table is this build's table
    text = open(doc).read()
    m = re.search(r"<!-- mlaserve env: begin -->\n```\n(.*?)```\n<!-- mlaserve env: end -->", text, re.S)
    check(m is not None, "docs/switches.md holds the table between its markers")
    if m:
        want = [l.rstrip() for l in m.group(1).splitlines()]
        got = [l.rstrip() for l in lines]
        check(want == got, "docs/switches.md matches `mlaserve env` (regenerate it: see the file)")
        if want != got:
            for a, b in zip(want + [""] * len(got), got + [""] * len(want)):
                if a != b:
                    print("  doc: %r\n  got: %r" % (a, b))
                    break
    r = run([mlaserve, "env"], MLA_WORKER_STEP_DELAY_MS="7")
    row = [l for l in r.stdout.splitlines() if l.startswith("MLA_WORKER_STEP_DELAY_MS ")]
    check(r.returncode == 0 and row and row[0].split()[4] == "7", "a set value shows in the VALUE column: %s" % row)
    bad = dict(MLA_LOCAL_LINK="2")
    bad_msg = "MLA_LOCAL_LINK=2: expected 0 or 1"
else:
    bad = dict(MLA_WORKER_STEP_DELAY_MS="7")
    bad_msg = "MLA_WORKER_STEP_DELAY_MS: unknown variable"

r = run([mlaserve, "env"], MLA_FIXTURES="/x")
check(r.returncode == 0, "MLA_FIXTURES (the tests' fixtures folder) is not an error")

for extra, msg in ((dict(MLA_STEP_TRACEE="/tmp"), "MLA_STEP_TRACEE: unknown variable"),
                   (dict(MLA_BACKEND="cpu"), "MLA_BACKEND: unknown variable"),
                   (bad, bad_msg)):
    r = run([mlaserve, "env"], **extra)
    check(r.returncode == 1 and msg in r.stderr, "mlaserve env with %s: exit 1 naming it (%d: %s)"
          % (extra, r.returncode, r.stderr.strip()))
    r = run([mlaserve, "inspect", "/nonexistent.gguf"], **extra)
    check(r.returncode == 2 and msg in r.stderr, "mlaserve inspect with %s: refused at start (%d: %s)"
          % (extra, r.returncode, r.stderr.strip()))
    r = run([worker, "--coord", "tcp://127.0.0.1:9", "--rank", "0", "--world", "1", "-m", "/nonexistent.gguf"], **extra)
    check(r.returncode == 2 and msg in r.stderr, "mlaserve-worker with %s: refused at start (%d: %s)"
          % (extra, r.returncode, r.stderr.strip()))

print("%s" % ("FAILED %d" % fails if fails else "all passed"))
sys.exit(1 if fails else 0)
