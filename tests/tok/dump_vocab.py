#!/usr/bin/env python3
"""Writes the tokenizer metadata of a GGUF file as JSON, read with gguf-py (an independent GGUF
reader), so that the C tokenizer tests can build a vocabulary without our own GGUF reader.
usage: dump_vocab.py MODEL.gguf OUT.json"""
import json
import sys

import gguf


def main():
    r = gguf.GGUFReader(sys.argv[1])
    out = {}
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        v = f.contents()
        out[k] = v
    with open(sys.argv[2], "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False)


if __name__ == "__main__":
    main()
