#!/usr/bin/env python3
"""Rewrites the table in docs/switches.md from `mlaserve env` of a test build (developer switches
included), run with no MLA_* variable set.

usage: scripts/switches_doc.py BUILD/coordinator/mlaserve [docs/switches.md]"""
import os
import re
import subprocess
import sys

exe = sys.argv[1]
doc = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "docs", "switches.md")
env = {k: v for k, v in os.environ.items() if not k.startswith("MLA_")}
out = subprocess.run([exe, "env"], env=env, capture_output=True, text=True, check=True).stdout
if "MLA_DEV_SWITCHES=OFF" in out:
    sys.exit("switches_doc.py: %s was built without developer switches; use a test build" % exe)
text = open(doc).read()
new, n = re.subn(r"(<!-- mlaserve env: begin -->\n```\n).*?(```\n<!-- mlaserve env: end -->)",
                 lambda m: m.group(1) + out + m.group(2), text, flags=re.S)
if n != 1:
    sys.exit("switches_doc.py: no table markers in %s" % doc)
open(doc, "w").write(new)
