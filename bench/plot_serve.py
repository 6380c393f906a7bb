#!/usr/bin/env python3
"""Tables and plots of scripts/gpu_serve_bench.sh's results (one serve-<model>.json a model).

  plot_serve.py SERVE.json [SERVE2.json ...] [--md OUT.md] [--png OUT.png]

For each model: a markdown table with a row a point (concurrency cN, Poisson rate rN) and, for each
server, output tok/s, requests/s, TTFT p50 / p99 and ITL p50 / p99 (ms) and errors; then the ratio
mlaserve / llama-server of each point: output tok/s (above 1: mlaserve faster), p99 ITL and p50 TTFT
(below 1: mlaserve lower); mlaserve's mean time to first token as the server counted it (queue and
prefill, serve_load.py's `server`) beside the client's, and `mlaserve bench`'s prompt step of one sequence
alone (its --prefill rows) below them. Where llama-server ran with FlashAttention on and off at every point,
the better of the two (output tok/s) is taken at each point and named. The FA probe points
(`probe-llama-fa*`) are listed separately. --png draws output tok/s against p99 ITL, one line a
server, points labelled by concurrency or rate (needs matplotlib; with several files, one panel a
model). Without --md the tables go to stdout."""
import argparse
import json
import sys

OURS = "mlaserve"


def fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def point_label(p, rates):
    name = p["point"]
    if name.startswith("c"):
        return name
    try:
        return f"{name} ({rates[int(name[1:]) - 1]:.3g}/s)"
    except (IndexError, ValueError):
        return name


def ok(p):
    return p is not None and "error" not in p and p.get("output_tok_per_s") is not None


def llama_best(model):
    """{point: (server key, point)} the better llama-server run of each point (output tok/s)."""
    best = {}
    for key, srv in model["servers"].items():
        if not key.startswith("llama"):
            continue
        for p in srv["points"]:
            cur = best.get(p["point"])
            if cur is None or (ok(p) and (not ok(cur[1]) or p["output_tok_per_s"] > cur[1]["output_tok_per_s"])):
                best[p["point"]] = (key, p)
    return best


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def cell(p):
    if p is None:
        return ["not run"] + [""] * 6
    if "error" in p:
        return [f"failed: {p['error']}"] + [""] * 6
    t, i = p["ttft_ms"], p["itl_ms"]
    return [fmt(p["output_tok_per_s"]), fmt(p["requests_per_s"], 2), fmt(t["p50"]), fmt(t["p99"]), fmt(i["p50"], 2),
            fmt(i["p99"], 2), f"{p['errors']}/{p['requests']}"]


def host_line(model):
    """the host's CPU and cores (and llama.cpp's build time there), where the JSON has them"""
    h = model.get("host") or {}
    if not h.get("cpu"):
        return ""
    built = model.get("llama_build_s")
    return f" Host CPU: {h['cpu']}, {h.get('cores')} cores" + (f"; llama.cpp built in {built} s." if built else ".")


def table(model):
    rates = model.get("rates") or []
    desc = (model.get("mkmodel") or model["family"]).replace("mkmodel: ", "", 1)
    out = [f"### {model['model']}: {desc}", "",
           f"{model.get('gpu')}, {model.get('date')}, commit {model.get('commit')}; concurrency points "
           f"{model.get('shape_concurrency')}, rate points {model.get('shape_rate')}, seed {model.get('seed')}."
           + host_line(model), ""]
    ours = {p["point"]: p for p in model["servers"].get(OURS, {}).get("points", [])}
    lb = llama_best(model)
    names = list(ours) + [n for n in lb if n not in ours]
    hdr = ["tok/s", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "errors"]
    fa = sorted({k for k, _ in lb.values()})
    out.append("| point | server | " + " | ".join(hdr) + " |")
    out.append("|---|---|" + "---|" * len(hdr))
    for n in names:
        lab = point_label(ours.get(n) or lb[n][1], rates)
        out.append(f"| {lab} | mlaserve | " + " | ".join(cell(ours.get(n))) + " |")
        if lb:
            key, p = lb.get(n, ("llama-server", None))
            out.append(f"| {lab} | {key.replace('llama-fa', 'llama-server FA ')} | " + " | ".join(cell(p)) + " |")
    if lb:
        out += ["", "mlaserve / llama-server" + (f" (the better of {', '.join(fa)} at each point)" if len(fa) > 1 else ""),
                "", "| point | output tok/s | ITL p99 | TTFT p50 |", "|---|---|---|---|"]
        for n in names:
            a, b = ours.get(n), lb.get(n, (None, None))[1]
            if ok(a) and ok(b) and (a.get("errors") or b.get("errors")):  # the ratio of unequal work: none
                out.append(f"| {point_label(a, rates)} | failed requests: {a.get('errors') or 0} / {b.get('errors') or 0}"
                           " | - | - |")
            elif ok(a) and ok(b):
                r = [ratio(a["output_tok_per_s"], b["output_tok_per_s"]), ratio(a["itl_ms"]["p99"], b["itl_ms"]["p99"]),
                     ratio(a["ttft_ms"]["p50"], b["ttft_ms"]["p50"])]
                out.append(f"| {point_label(a, rates)} | " + " | ".join("-" if x is None else f"{x:.2f}x" for x in r) + " |")
            else:
                out.append(f"| {n} | - | - | - |")
    split = [(n, ours[n]) for n in ours if ok(ours[n]) and ours[n].get("server")]
    if split:
        out += ["", "mlaserve's time to first token as the server counted it (/metrics, means in ms): arrival to "
                "first scheduled step (queue) and on to the first token (prefill); the client's mean beside it", "",
                "| point | client TTFT | server TTFT | queue | prefill | steps |", "|---|---|---|---|---|---|"]
        for n, p in split:
            sv = p["server"]
            out.append(f"| {point_label(p, rates)} | {fmt(p['ttft_ms'].get('mean'))} | {fmt(sv['ttft'])} | "
                       f"{fmt(sv['queue'])} | {fmt(sv['prefill'])} | {sv['steps']} |")
    probes = [(k, p) for k, s in model["servers"].items() if k.startswith("probe-") for p in s["points"]]
    if probes:
        out += ["", "FlashAttention probe (llama-server): " + "; ".join(
            f"{k[len('probe-llama-'):]} {p['point']}: " + (f"{p['output_tok_per_s']:.1f} tok/s" if ok(p) else
                                                           f"failed ({p.get('error') or p.get('first_errors')})")
            for k, p in probes) + (f"; every point with FA {model['llama_fa_chosen']}" if model.get("llama_fa_chosen") else "")]
    b = model.get("bench")
    if isinstance(b, dict):
        for r in b.get("rows") or []:
            if r.get("phase") == "prefill":
                out += ["", f"Prompt step of {r['prompt']} tokens, one sequence alone (`mlaserve bench`): "
                        f"{fmt(r.get('ms_best'))} ms best, {fmt(r.get('ms_mean'))} ms mean"
                        + (f", {r['tflops']:.0f} TFLOP/s" if r.get("tflops") else "")]
        for r in b.get("rows") or []:
            if r.get("phase") == "decode":
                frac = r.get("bw_frac")
                out += ["", f"Batch-{r['batch']} step at context {r.get('ctx')} (`mlaserve bench`): {fmt(r.get('ms_best'), 3)} ms "
                        f"best, {fmt(r.get('ms_mean'), 3)} ms mean, {fmt(r.get('tok_s'))} tok/s, {fmt(r.get('gb_s'))} GB/s"
                        + (f" = {100 * frac:.1f}% of {b.get('bw_gbs'):.0f} GB/s" if frac is not None else "")
                        + (f" ({model['bw_source']})" if frac is not None and model.get("bw_source") else "")]
        if b.get("error"):
            out += ["", f"`mlaserve bench`: {b['error']}"]
    n = model.get("ncu")
    if isinstance(n, dict) and n.get("families"):
        out += ["", f"Batch-1 decode step by kernel family (Nsight Compute, {n['step_us']:.0f} us of kernels):", "",
                "| family | launches | us | share |", "|---|---|---|---|"]
        out += [f"| {f['family']} | {f['launches']} | {f['us']:.1f} | {100 * f['share']:.1f}% |" for f in n["families"]]
    if model.get("notes"):
        out += ["", "Notes: " + "; ".join(model["notes"])]
    return "\n".join(out) + "\n"


def plot(models, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5), squeeze=False)
    for ax, m in zip(axes[0], models):
        rates = m.get("rates") or []
        for key, srv in m["servers"].items():
            if key.startswith("probe-"):
                continue
            pts = [p for p in srv["points"] if ok(p) and p["itl_ms"]["p99"] is not None]
            for kind, style in (("c", "-o"), ("r", "--s")):
                sel = [p for p in pts if p["point"].startswith(kind)]
                if not sel:
                    continue
                xs = [p["itl_ms"]["p99"] for p in sel]
                ys = [p["output_tok_per_s"] for p in sel]
                name = key.replace("llama-fa", "llama-server FA ")
                ax.plot(xs, ys, style, label=f"{name} ({'concurrency' if kind == 'c' else 'rate'})")
                for p, x, y in zip(sel, xs, ys):
                    ax.annotate(point_label(p, rates), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("ITL p99 (ms)")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"{m['model']} ({m.get('gpu')}, {m.get('commit')})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--md")
    ap.add_argument("--png")
    a = ap.parse_args()
    models = []
    for f in a.json:
        with open(f) as fh:
            models.append(json.load(fh))
    text = "\n".join(table(m) for m in models)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.png:
        try:
            plot(models, a.png)
        except ImportError:
            print("plot_serve: no matplotlib, no plot (the table is written)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
