#!/usr/bin/env python3
"""Plot decode throughput (total tokens/s) against batch size: mlaserve vs llama.cpp.

    bench/plot_decode.py --mlaserve bench.json --llama OUTDIR_OR_FILES... -o decode.png
                         [--model NAME] [--gpu NAME] [--tp N] [--title TEXT] [--ylog]

One line per context length for each engine (same colour per context; mlaserve solid
with circles, llama.cpp dashed with squares), x = batch size (log2 axis), y = total
decode tokens/s summed over the batch.  A table of the points is printed to stdout.
Only matplotlib (Agg backend) and the standard library are needed.

Inputs
------
--mlaserve FILE  (repeatable) JSON written by `mlaserve bench --json`.  The reader is
    deliberately tolerant: it walks the whole document and takes every object that has
    a batch size and a tokens/s value and is not marked as a prefill row.  The schema of
    coordinator/cmd_bench.c (make_json), of which only these keys are used:

        {"model": "/path/model.gguf", "family": "deepseek2", "backend": "cuda",
         "rows": [{"tp": 1, "phase": "decode", "batch": 8, "ctx": 4096,
                   "tok_s": 1234.5,          # total: batch x steps / time
                   "tok_s_per_seq": 154.3, ...},
                  {"tp": 1, "phase": "prefill", "batch": 1, "prompt": 512, "ctx": null, ...}]}

    The simplest accepted file is {"rows": [{"batch": B, "ctx": C, "tok_s": X}]}.

    Accepted key spellings (first match wins):
      batch : batch, batch_size, n_batch_seqs, bs, B, n_seq, seqs, concurrency, pl
      ctx   : ctx, context, n_ctx, ctx_len, context_len, depth, n_depth, kv_len, prompt, pp
              (missing -> 0)
      tok/s : tok_s, decode_tok_s, total_tok_s, tokens_per_s, tok_per_s, tps, throughput,
              speed_tg, avg_ts
      phase : phase, kind, mode, stage (rows whose value is prefill/prompt/pp are skipped;
              missing phase = decode).  If only a per-sequence rate is present
              (tok_s_per_seq / per_seq_tok_s) it is multiplied by the batch.
      tp    : tp, tp_size, world (used by --tp and in the legend when several exist)
    Model / GPU names: --model / --gpu, else top-level "model" (a path: its basename, plus
    "family" when present) and "gpu"/"device", else llama-bench's model_filename / gpu_info.

--llama PATH  (repeatable; a directory means every *.json, *.jsonl, *.md, *.txt in it)
    * llama-bench `-o json` (a JSON array; a file cut short by a timeout is repaired) or
      `-o jsonl`: rows with n_prompt == 0 and n_gen > 0 are decode at batch 1,
      ctx = n_depth, tok/s = avg_ts.  Prefill rows are ignored here.
    * llama-batched-bench `--output-format jsonl`: keys pl (batch), pp (ctx: prompt per
      sequence), speed_tg (total decode tok/s = pl*tg/t_tg).
    * llama-batched-bench markdown table (|PP|TG|B|N_KV|T_PP s|S_PP t/s|T_TG s|S_TG t/s|...).
    For the same (ctx, batch) a batched-bench point wins over a llama-bench point.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

BATCH_KEYS = ("batch", "batch_size", "n_batch_seqs", "bs", "B", "n_seq", "seqs", "concurrency", "pl")
CTX_KEYS = ("ctx", "context", "n_ctx", "ctx_len", "context_len", "depth", "n_depth", "kv_len", "prompt", "pp")
TOKS_KEYS = ("tok_s", "decode_tok_s", "total_tok_s", "tokens_per_s", "tok_per_s", "tps", "throughput",
             "speed_tg", "avg_ts")
PER_SEQ_KEYS = ("tok_s_per_seq", "per_seq_tok_s")
PHASE_KEYS = ("phase", "kind", "mode", "stage")
TP_KEYS = ("tp", "tp_size", "world")
PREFILL_WORDS = ("prefill", "prompt", "pp")


def _first(d, keys):
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------- mlaserve
def _walk(obj):
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def read_mlaserve(path):
    with open(path) as f:
        text = f.read()
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # JSON lines
        docs = [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]
    meta, rows = {}, []
    for doc in docs:
        if isinstance(doc, dict):
            for k in ("model", "model_name"):
                if isinstance(doc.get(k), str) and doc[k]:
                    name = os.path.basename(doc[k])
                    name = name[:-5] if name.endswith(".gguf") else name
                    if isinstance(doc.get("family"), str) and doc["family"] and doc["family"] not in name:
                        name += f" ({doc['family']})"
                    meta.setdefault("model", name)
            for k in ("gpu", "device", "gpu_name"):
                if isinstance(doc.get(k), str):
                    meta.setdefault("gpu", doc[k])
        for d in _walk(doc):
            phase = _first(d, PHASE_KEYS)
            if isinstance(phase, str) and phase.strip().lower() in PREFILL_WORDS:
                continue
            b = _num(_first(d, BATCH_KEYS))
            if b is None or b <= 0:
                continue
            t = _num(_first(d, TOKS_KEYS))
            if t is None:
                ps = _num(_first(d, PER_SEQ_KEYS))
                t = ps * b if ps is not None else None
            if t is None:
                continue
            c = _num(_first(d, CTX_KEYS)) or 0
            tp = _num(_first(d, TP_KEYS))
            rows.append({"batch": int(b), "ctx": int(c), "tok_s": t,
                         "tp": int(tp) if tp is not None else None})
    return meta, rows


# ---------------------------------------------------------------- llama.cpp
NAN_RE = re.compile(r"(?<=[:\[,\s])(-?)(nan|inf)\b", re.I)


def _json_objects(text):
    """JSON array, truncated JSON array, or JSON lines -> list of dicts.
    C printf's nan / -nan / inf (llama-batched-bench prints speed_pp -nan for -npp 0)
    are mapped to NaN / Infinity first."""
    s = NAN_RE.sub(lambda m: "NaN" if m.group(2).lower() == "nan" else m.group(1) + "Infinity", text).strip()
    if not s:
        return []
    try:
        v = json.loads(s)
        return [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, dict)]
    except json.JSONDecodeError:
        pass
    out, dec, i = [], json.JSONDecoder(), 0
    while True:  # scan for objects anywhere (handles `[ {...}, {...` and JSONL with log noise)
        j = s.find("{", i)
        if j < 0:
            break
        try:
            v, end = dec.raw_decode(s, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        if isinstance(v, dict):
            out.append(v)
        i = end
    return out


MD_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|"
                    r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def read_llama(path):
    meta, rows = {}, []
    with open(path, errors="replace") as f:
        text = f.read()
    for d in _json_objects(text):
        if "avg_ts" in d and "n_gen" in d:  # llama-bench
            if isinstance(d.get("gpu_info"), str) and d["gpu_info"]:
                meta.setdefault("gpu", d["gpu_info"])
            if isinstance(d.get("model_filename"), str) and d["model_filename"]:
                name = os.path.basename(d["model_filename"])
                meta.setdefault("model", name[:-5] if name.endswith(".gguf") else name)
            elif isinstance(d.get("model_type"), str):
                meta.setdefault("model", d["model_type"])
            if int(d.get("n_prompt", 0)) == 0 and int(d.get("n_gen", 0)) > 0:
                rows.append({"batch": 1, "ctx": int(d.get("n_depth", 0) or 0),
                             "tok_s": float(d["avg_ts"]), "src": "llama-bench",
                             "fa": d.get("flash_attn")})
        elif "speed_tg" in d and "pl" in d:  # llama-batched-bench jsonl
            rows.append({"batch": int(d["pl"]), "ctx": int(d.get("pp", 0)),
                         "tok_s": float(d["speed_tg"]), "src": "batched-bench",
                         "fa": d.get("flash_attn")})
    if not rows:  # llama-batched-bench markdown table
        for line in text.splitlines():
            m = MD_ROW.match(line.strip())
            if m:
                pp, tg, b = int(m.group(1)), int(m.group(2)), int(m.group(3))
                rows.append({"batch": b, "ctx": pp, "tok_s": float(m.group(8)), "src": "batched-bench"})
    return meta, rows


def expand(paths, exts):
    out = []
    for p in paths:
        if os.path.isdir(p):
            for e in exts:
                out += sorted(glob.glob(os.path.join(p, "*" + e)))
        else:
            out.append(p)
    return out


def merge_llama(rows):
    best = {}
    for r in rows:
        k = (r["ctx"], r["batch"])
        old = best.get(k)
        if old is None or (old["src"] == "llama-bench" and r["src"] == "batched-bench") or \
           (old["src"] == r["src"] and r["tok_s"] > old["tok_s"]):
            best[k] = r
    return list(best.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlaserve", action="append", default=[], help="mlaserve bench --json file")
    ap.add_argument("--llama", action="append", default=[], help="llama-bench / batched-bench output file or dir")
    ap.add_argument("-o", "--out", default="decode.png")
    ap.add_argument("--model"), ap.add_argument("--gpu"), ap.add_argument("--title")
    ap.add_argument("--tp", type=int, help="only mlaserve rows with this tp")
    ap.add_argument("--ylog", action="store_true", help="log-scale y axis")
    a = ap.parse_args(argv)
    if not a.mlaserve and not a.llama:
        ap.error("give --mlaserve and/or --llama")

    meta, mrows, lrows = {}, [], []
    for p in expand(a.mlaserve, (".json", ".jsonl")):
        m, r = read_mlaserve(p)
        for k, v in m.items():
            meta.setdefault("m_" + k, v)
        mrows += r
    for p in expand(a.llama, (".json", ".jsonl", ".md", ".txt")):
        m, r = read_llama(p)
        for k, v in m.items():
            meta.setdefault("l_" + k, v)
        lrows += r
    if a.tp is not None:
        mrows = [r for r in mrows if r["tp"] in (None, a.tp)]
    lrows = merge_llama(lrows)
    if not mrows and not lrows:
        sys.exit("plot_decode: no decode rows found in the inputs")

    model = a.model or meta.get("m_model") or meta.get("l_model") or "model"
    gpu = a.gpu or meta.get("m_gpu") or meta.get("l_gpu") or "GPU"
    tps = sorted({r["tp"] for r in mrows if r["tp"] is not None})

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctxs = sorted({r["ctx"] for r in mrows + lrows})
    cmap = plt.get_cmap("tab10")
    colour = {c: cmap(i % 10) for i, c in enumerate(ctxs)}
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)

    def series(rows):
        pts = {}
        for r in rows:
            pts[r["batch"]] = max(pts.get(r["batch"], 0.0), r["tok_s"])
        xs = sorted(pts)
        return xs, [pts[x] for x in xs]

    table = []
    groups = [(tp, [r for r in mrows if r["tp"] == tp]) for tp in (tps or [None])]
    if tps and any(r["tp"] is None for r in mrows):
        groups.append((None, [r for r in mrows if r["tp"] is None]))
    styles = ["-", "-.", ":"]
    for gi, (tp, rows) in enumerate(groups):
        for c in ctxs:
            xs, ys = series([r for r in rows if r["ctx"] == c])
            if not xs:
                continue
            name = "mlaserve" + (f" TP{tp}" if len(tps) > 1 and tp is not None else "")
            ax.plot(xs, ys, styles[gi % 3], marker="o^D"[gi % 3], color=colour[c], label=f"{name} ctx {c}")
            table += [(name, c, x, y) for x, y in zip(xs, ys)]  # noqa: B023
    for c in ctxs:
        xs, ys = series([r for r in lrows if r["ctx"] == c])
        if xs:
            ax.plot(xs, ys, "--", marker="s", mfc="none", color=colour[c], label=f"llama.cpp ctx {c}")
            src = {r["batch"]: r["src"] for r in lrows if r["ctx"] == c}
            table += [(f"llama.cpp ({src[x]})", c, x, y) for x, y in zip(xs, ys)]

    ax.set_xscale("log", base=2)
    if a.ylog:
        ax.set_yscale("log")
    allb = sorted({r["batch"] for r in mrows + lrows})
    ax.set_xticks(allb)
    ax.set_xticklabels([str(b) for b in allb])
    ax.set_xlabel("batch size (concurrent sequences)")
    ax.set_ylabel("decode throughput, total tokens/s")
    ax.set_title(a.title or f"Decode throughput: {model} on {gpu}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(a.out)

    print(f"| engine | ctx | batch | tok/s |\n|---|---:|---:|---:|")
    for e, c, b, y in sorted(table, key=lambda t: (t[1], t[2], t[0])):
        print(f"| {e} | {c} | {b} | {y:.1f} |")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
