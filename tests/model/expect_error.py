#!/usr/bin/env python3
"""Runs a command that must fail: exits 0 only when it exits non-zero and its stderr contains
the expected message.  expect_error.py 'MESSAGE' CMD [ARGS...]"""
import subprocess
import sys

msg, cmd = sys.argv[1], sys.argv[2:]
r = subprocess.run(cmd, capture_output=True, text=True)
err = r.stderr.strip().splitlines()
print('\n'.join(l for l in err if ' info: ' not in l))
if r.returncode == 0:
    sys.exit('FAIL: the command succeeded')
if msg not in r.stderr:
    sys.exit(f'FAIL: stderr lacks {msg!r}')
print(f'ok: exit {r.returncode} with {msg!r}')
