#!/usr/bin/env python3
"""docs/commands.md: every command's options as the build's `--help` prints them.
Usage: gen_commands_md.py MLASERVE MLASERVE_WORKER [--check DOC]
  writes the document to stdout; --check DOC compares it with DOC instead and exits 1 (naming the
  first differing line) where they differ. Regenerate after changing an option:
    scripts/gen_commands_md.py build/coordinator/mlaserve build/worker/mlaserve-worker > docs/commands.md
The help text is the same in every build (CPU or CUDA, with or without developer switches)."""
import itertools
import subprocess
import sys

COMMANDS = ["serve", "generate", "logits", "bench", "inspect", "client", "keygen", "mkmodel"]


def help_of(args):
    r = subprocess.run(args + ["--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit("gen_commands_md: %s --help: exit status %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return r.stdout.rstrip("\n") + "\n"


def render(exe, worker):
    out = ["# Commands\n",
           "\n",
           "Every command of `mlaserve` and the worker program, with each option's meaning and default as\n",
           "`--help` prints it. Generated from the build by `scripts/gen_commands_md.py`; `make test` checks\n",
           "that it matches. Serving and its limits are explained in [deploy.md](deploy.md), the HTTP API\n",
           "in [api.md](api.md), the `MLA_*` environment switches in [switches.md](switches.md).\n",
           "\n",
           "## mlaserve\n",
           "\n```\n", help_of([exe]), "```\n"]
    for c in COMMANDS:
        out += ["\n## mlaserve %s\n" % c, "\n```\n", help_of([exe, c]), "```\n"]
    out += ["\n## mlaserve-worker\n",
            "\n",
            "`mlaserve serve` starts the workers itself; run one by hand only with `--workers-external`\n",
            "(see [deploy.md](deploy.md)).\n",
            "\n```\n", help_of([worker]), "```\n"]
    return "".join(out)


def main():
    a = sys.argv[1:]
    if len(a) not in (2, 4) or (len(a) == 4 and a[2] != "--check"):
        sys.exit(__doc__)
    text = render(a[0], a[1])
    if len(a) == 2:
        sys.stdout.write(text)
        return
    have = open(a[3]).read()
    if have == text:
        print("%s matches the build's --help" % a[3])
        return
    for i, (x, y) in enumerate(itertools.zip_longest(have.splitlines(), text.splitlines())):
        if x != y:
            sys.exit("%s differs from the build's --help at line %d:\n  doc:   %r\n  build: %r\n"
                     "regenerate it: see scripts/gen_commands_md.py" % (a[3], i + 1, x, y))
    sys.exit("%s differs from the build's --help in its line ends; regenerate it: see scripts/gen_commands_md.py" % a[3])


main()
