#!/usr/bin/env python3
"""Random texts: our tokenizer (test_tok --encode, vocabulary from the GGUF via gguf-py) against
HF `tokenizers` on the fixture's tokenizer.json (the tokenizer the reference was made with).
--pre NAME: both sides take another model's pre-tokenizer over the fixture's vocabulary and merges:
the dump's tokenizer.ggml.pre becomes NAME (what that model's GGUF files say), the tokenizer.json's
pre_tokenizer the model's own (PRE_TOKENIZERS below, as its tokenizer.json or tiktoken pattern
writes it), so that our regexes for NAME are checked against HF's engine on the model's form.
Exit 77 (skipped) when the `tokenizers` package is missing (pip install tokenizers).
usage: hf_compare.py TEST_TOK VOCAB_DUMP.json TOKENIZER.json [--pre NAME]"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer
except ImportError:
    print("tokenizers (PyPI) is not installed: skipped")
    sys.exit(77)


def _split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
# DeepSeek-V2 / DeepSeek LLM: Unicode's cased letters (Lu, Ll, Lt) as its tokenizer lists them
_DS_CASED = "".join(chr(a) if a == b else chr(a) + "-" + chr(b) for a, b in (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x376), (0x377, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F),
    (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D), (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107),
    (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149), (0x214E, 0x214E),
    (0x2183, 0x2183), (0x2184, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E),
    (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943)))
# Kimi-K2: the tiktoken pattern of its tokenization_kimi.py, class intersections (&&) as written
_KIMI = (r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "deepseek-llm": {"type": "Sequence", "pretokenizers": [
        _split("[\r\n]"), _split("\\s?[" + _DS_CASED + "]+"),
        _split("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"), _split("\\s+$"),
        _split("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), {"type": "Digits", "individual_digits": True},
        _BYTES]},
    "kimi-k2": {"type": "Sequence", "pretokenizers": [_split(_KIMI), _BYTES]},
}


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
        lambda: rng.choice(["getUserName", "iPhone", "HTTPServer", "XMLHttpRequest", "I'M", "WE'LL", "ſ", "Ǆǅǆ"]),
        lambda: chr(rng.choice([0x1F7D, 0x1FBE, 0x1FD3, 0x1FDB, 0x2126, 0x212A, 0x212B, 0x03A9, 0x1F00, 0xFF21, 0xFF41,
                                0xFF01, 0xFF1F, 0x3001, 0x3002, 0x301C, 0x2018, 0x201D, 0x0800, 0xAC00, 0x3005, 0x2E80])),
    ]
    return "".join(rng.choice(pools)() for _ in range(rng.randint(1, 40)))


def main():
    ap = argparse.ArgumentParser(description="our tokenizer against HF tokenizers on random texts")
    ap.add_argument("test_tok")
    ap.add_argument("vocab_dump")
    ap.add_argument("tokenizer_json")
    ap.add_argument("--pre", choices=sorted(PRE_TOKENIZERS))
    a = ap.parse_args()
    exe, dump, tj, pre = a.test_tok, a.vocab_dump, a.tokenizer_json, a.pre
    tjson = json.load(open(tj, encoding="utf-8"))
    if pre:  # another model's pre-tokenizer on both sides
        tjson["pre_tokenizer"] = PRE_TOKENIZERS[pre]
        vocab = json.load(open(dump, encoding="utf-8"))
        vocab["tokenizer.ggml.pre"] = pre
        fd, dump = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(vocab, fh, ensure_ascii=False)
    hf = Tokenizer.from_str(json.dumps(tjson))
    specials = [t["content"] for t in tjson["added_tokens"]]
    rng = random.Random(1234)
    texts = [rand_text(rng, specials) for _ in range(3000)]
    texts += ["", " ", "  ", "\n", "a  b", "a\n\n b", "x" * 3000, " " * 500 + "y", "1" * 50]
    res = subprocess.run([exe, "--encode", dump], input=json.dumps(texts).encode(), capture_output=True)
    if pre:
        os.unlink(dump)
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
    print(f"{len(texts) - bad}/{len(texts)} texts agree with HF tokenizers" + (f" (pre-tokenizer {pre})" if pre else ""))
    return 1 if bad or len(ours) != len(texts) else 0


if __name__ == "__main__":
    sys.exit(main())
