#!/usr/bin/env python3
"""Random texts: our tokenizer (test_tok --encode, vocabulary from the GGUF via gguf-py) against
HF `tokenizers` on the fixture's tokenizer.json (the tokenizer the reference was made with).
Exit 77 (skipped) when the `tokenizers` package is missing (pip install tokenizers).
usage: hf_compare.py TEST_TOK VOCAB_DUMP.json TOKENIZER.json"""
import json
import random
import subprocess
import sys

try:
    from tokenizers import Tokenizer
except ImportError:
    print("tokenizers (PyPI) is not installed: skipped")
    sys.exit(77)


def rand_text(rng, specials):
    pools = [
        lambda: rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 3),
        lambda: rng.choice(["the", "The", "THE", "don't", "I'll", "we've", "it's", "'s", "'S"]),
        lambda: " " * rng.randint(1, 5),
        lambda: rng.choice(["\n", "\n\n", "\r\n", "\t", " \n ", "\t\t"]),
        lambda: str(rng.randint(0, 10 ** rng.randint(1, 8))),
        lambda: rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") * rng.randint(1, 3),
        lambda: chr(rng.randint(0xA0, 0x24F)),
        lambda: "e" + chr(rng.randint(0x300, 0x36F)),
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(rng.randint(1, 4))),
        lambda: "".join(chr(rng.randint(0x3040, 0x30FF)) for _ in range(rng.randint(1, 4))),
        lambda: chr(rng.randint(0x1F300, 0x1F64F)),
        lambda: chr(rng.randint(0x10000, 0x10FFFF)),
        lambda: rng.choice(["—", "–", "…", "“", "”", "‘", "’", "，", "。", "✓", "€", "½", "²", "Ⅻ", "٣", "१"]),
        lambda: rng.choice(specials) if specials else "x",
        lambda: chr(rng.choice([0x3000, 0x00A0, 0x2028, 0x200B, 0xFEFF, 0x0085])),
        lambda: rng.choice(["Привет", "مرحبا", "שלום", "γειά", "नमस्ते", "안녕하세요", "ไทย"]),
    ]
    return "".join(rng.choice(pools)() for _ in range(rng.randint(1, 40)))


def main():
    exe, dump, tj = sys.argv[1:4]
    hf = Tokenizer.from_file(tj)
    specials = [t["content"] for t in json.load(open(tj, encoding="utf-8"))["added_tokens"]]
    rng = random.Random(1234)
    texts = [rand_text(rng, specials) for _ in range(3000)]
    texts += ["", " ", "  ", "\n", "a  b", "a\n\n b", "x" * 3000, " " * 500 + "y", "1" * 50]
    res = subprocess.run([exe, "--encode", dump], input=json.dumps(texts).encode(), capture_output=True)
    if res.returncode != 0:
        print(res.stderr.decode(errors="replace"))
        return 1
    ours = json.loads(res.stdout)
    bad = 0
    for t, o in zip(texts, ours):
        ref = hf.encode(t, add_special_tokens=False).ids
        if ref != o:
            bad += 1
            if bad <= 5:
                print("MISMATCH", repr(t))
                print("  hf  ", ref)
                print("  ours", o)
    print(f"{len(texts) - bad}/{len(texts)} texts agree with HF tokenizers")
    return 1 if bad or len(ours) != len(texts) else 0


if __name__ == "__main__":
    sys.exit(main())
