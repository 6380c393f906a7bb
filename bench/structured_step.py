#!/usr/bin/env python3
"""Step time of a batch with and without structured-output rows, against a running mlaserve.

  structured_step.py --port PORT [--host 127.0.0.1] [--rows 1,4,16] [--constrained 0,1,4]
                     [--tokens 64] [--kinds json,sampled] [--json OUT.json]

For each N in --rows and K in --constrained: N unconstrained completions (greedy, ignore_eos,
--tokens tokens each) and K json_schema completions (an array of strings that cannot end within
--tokens tokens, so the row stays constrained throughout, seeded temperature 1) are sent at once,
streamed. --kinds sampled sends the K rows without response_format (the same seeded temperature 1),
top_p the same at temperature 0.6 and top_p 0.95: a sampled row, constrained or not, against the
constrained one. Reported per (N, K, kind): the median gap between tokens of the unconstrained rows (the step
time they see), the wall time of the batch over --tokens, and the workers' own step time
(mlaserve_worker_step_seconds_total / mlaserve_worker_steps_total over the run, /metrics). No
timing is asserted; docs/structured-output.md has the numbers and the exact commands."""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time

SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 1000, "maxItems": 1000}


def stream(host, port, body, out):
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    r = c.getresponse()
    times = []
    err = None
    if r.status != 200:
        err = "%d %s" % (r.status, r.read()[:300])
    else:
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: ") and ev[6:].strip() != b"[DONE]":
                    d = json.loads(ev[6:])
                    if d.get("choices") and d["choices"][0].get("text"):
                        times.append(time.monotonic())
    c.close()
    out.append((times, err))


def metric(host, port, name):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    txt = c.getresponse().read().decode()
    c.close()
    return sum(float(l.split()[-1]) for l in txt.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


def run(a, n, k, kind="json"):
    free_out, cons_out = [], []
    ths = []
    for i in range(n):
        body = {"prompt": "Write a long story about the sea, number %d." % i, "max_tokens": a.tokens,
                "temperature": 0, "ignore_eos": True}
        ths.append(threading.Thread(target=stream, args=(a.host, a.port, body, free_out)))
    for i in range(k):
        body = {"prompt": "List names as JSON, set %d:" % i, "max_tokens": a.tokens, "temperature": 1.0, "seed": i}
        if kind == "json":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "names", "schema": SCHEMA}}
        elif kind in ("sampled", "top_p"):
            body["ignore_eos"] = True
            if kind == "top_p":  # the settings DeepSeek's model cards recommend
                body.update(temperature=0.6, top_p=0.95)
        else:
            raise SystemExit("unknown kind %r (json, sampled, top_p)" % kind)
        ths.append(threading.Thread(target=stream, args=(a.host, a.port, body, cons_out)))
    s0, t0 = metric(a.host, a.port, "mlaserve_worker_step_seconds_total"), metric(a.host, a.port, "mlaserve_worker_steps_total")
    w0 = time.monotonic()
    [t.start() for t in ths]
    [t.join() for t in ths]
    wall = time.monotonic() - w0
    s1, t1 = metric(a.host, a.port, "mlaserve_worker_step_seconds_total"), metric(a.host, a.port, "mlaserve_worker_steps_total")
    errs = [e for _, e in free_out + cons_out if e]
    gaps = [y - x for ts, _ in free_out for x, y in zip(ts, ts[1:])]
    cgaps = [y - x for ts, _ in cons_out for x, y in zip(ts, ts[1:])]
    return {"unconstrained": n, "constrained": k, "kind": kind, "errors": errs[:3],
            "free_itl_ms_p50": round(statistics.median(gaps) * 1e3, 3) if gaps else None,
            "constrained_itl_ms_p50": round(statistics.median(cgaps) * 1e3, 3) if cgaps else None,
            "wall_ms_per_step": round(wall / a.tokens * 1e3, 3),
            "worker_ms_per_step": round((s1 - s0) / (t1 - t0) * 1e3, 3) if t1 > t0 else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--constrained", default="0,1,4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kinds", default="json", help="json, sampled, top_p (comma-separated)")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = []
    run(a, 1, 0)  # warm-up
    print("%5s %5s %8s %14s %14s %14s %14s" % ("free", "other", "kind", "free_itl_ms", "other_itl_ms", "wall_ms/step",
                                              "worker_ms/step"))
    for n in [int(x) for x in a.rows.split(",")]:
        for k in [int(x) for x in a.constrained.split(",")]:
            for kind in a.kinds.split(",") if k else ["-"]:
                r = run(a, n, k, kind)
                res.append(r)
                print("%5d %5d %8s %14s %14s %14s %14s %s" % (n, k, kind, r["free_itl_ms_p50"], r["constrained_itl_ms_p50"],
                                                             r["wall_ms_per_step"], r["worker_ms_per_step"],
                                                             ("errors: %s" % r["errors"]) if r["errors"] else ""))
                sys.stdout.flush()
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    return 1 if any(r["errors"] for r in res) else 0


if __name__ == "__main__":
    sys.exit(main())
