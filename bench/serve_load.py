#!/usr/bin/env python3
"""A served-load generator for any OpenAI-compatible server (mlaserve, llama-server, vLLM), through the
official `openai` async client.

  serve_load.py --base-url http://127.0.0.1:8080/v1 --vocab 129280 \\
      [--concurrency 8 | --rate 4.0] [--requests 64] [--shape chat|1k-256|8k-1k|IN-OUT] [--seed 1]
      [--warmup 1] [--procs N] [--model NAME] [--api-key KEY] [--json OUT.json] [--label TEXT]

Arrivals: a fixed number of requests in flight (--concurrency), or Poisson arrivals at --rate
requests a second (each at its own time from the start). Shapes: `chat` draws prompt and output
lengths from a long-tailed (log-normal) distribution clipped to 50-4000 prompt tokens and 20-1000
output tokens; `1k-256` and `8k-1k` (or any `IN-OUT`) are fixed. Prompts are lists of token ids drawn
from [256, --vocab) (the completions API takes them, so any tokenizer does), seeded; outputs run to
their length (`ignore_eos`, temperature 0). --warmup requests of the same shape (their own seed) go
first from each client process, one at a time, and are not counted. Every request is streamed: time
to first token (TTFT) and the gaps between later text chunks (ITL) are measured here; output tokens
are what each server's `usage` says (`stream_options.include_usage`; the text chunks where a server
sends none: `tokens_from_usage` counts the requests that had it), expected_output_tokens what the
successful requests asked for. Prints one JSON object (also to --json): requests, errors,
requests/s, output tok/s, TTFT and ITL p50/p90/p99 (TTFT also the mean) in ms, `client_cpu` (the
busiest client process's CPU time over the wall time: near 1, the client, not the server, sets the
pace) and `client_cpu_total` (all of them), `client_procs`, `sent` (the request indices in the
order they were sent) and the first error messages. The client runs as --procs processes
(default: one a 32 requests in flight, 4 for Poisson arrivals, at most half the CPUs it may use),
each with its own `openai` client and event loop, warmed up, then from one start: at a fixed
concurrency they share the workers and take the requests from one queue in order; with Poisson
arrivals process i sends every --procs-th request at its time. Against mlaserve, `server` also
splits the point's time to first token as the server saw it, from its /metrics read before and
after (means in ms over the point's requests): `ttft` (arrival to first token), `queue` (arrival to
first scheduled step) and `prefill` (first scheduled step to first token), `steps` (model steps
run) and `prompt_tokens` (received); the client's mean TTFT less the server's is what HTTP and the
client add. `server` is null where /metrics has no mlaserve series (llama-server, vLLM) or another
client shared the point. Exit status 1 when a request failed, 2 when a client process failed or
exited without its results (the point has none; the message names it)."""
import argparse
import asyncio
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import sys
import time
import urllib.request

from openai import AsyncOpenAI


def shape_of(name, rnd):
    """(prompt tokens, output tokens) for one request."""
    if name == "chat":
        p = int(min(4000, max(50, rnd.lognormvariate(math.log(600), 0.9))))
        o = int(min(1000, max(20, rnd.lognormvariate(math.log(150), 0.8))))
        return p, o
    fixed = {"1k-256": (1024, 256), "8k-1k": (8192, 1024)}
    if name in fixed:
        return fixed[name]
    a, b = name.split("-")
    return int(a), int(b)


# the /metrics series read around a point: (histogram or counter, key in `server`)
SERVER_SERIES = (("mlaserve_time_to_first_token_seconds", "ttft"), ("mlaserve_request_queue_time_seconds", "queue"),
                 ("mlaserve_request_prefill_time_seconds", "prefill"))


def read_metrics(base_url, api_key):
    """mlaserve's /metrics beside base_url (.../v1): {series name: value summed over its labels}, or None
    where it cannot be read or holds no mlaserve series"""
    root = base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    req = urllib.request.Request(root + "/metrics", headers={"Authorization": "Bearer " + api_key} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as f:
            text = f.read().decode()
    except (OSError, ValueError):
        return None
    vals = {}
    for line in text.splitlines():
        if not line.startswith("mlaserve_"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        try:
            vals[name] = vals.get(name, 0.0) + float(value)
        except ValueError:
            return None
    return vals or None


def server_split(before, after, n_ok):
    """the point's server-side means (ms) from two read_metrics: None unless every request of the point,
    and nothing else, was counted in between"""
    if before is None or after is None or not n_ok:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out = {}
    for series, key in SERVER_SERIES:
        n = d.get(series + "_count", 0.0)
        if n != n_ok:  # another client's requests, or a series missing
            return None
        out[key] = d.get(series + "_sum", 0.0) / n * 1e3 if n else None
    out["steps"] = int(d.get("mlaserve_steps_total", 0.0))
    out["prompt_tokens"] = int(d.get("mlaserve_prompt_tokens_total", 0.0))
    return out


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(math.ceil(q / 100.0 * len(xs))) - 1))
    return xs[k]


async def one(client, model, prompt, max_tokens, out, k=None):
    t0 = time.perf_counter()
    last, ttft, itl, n, used = None, None, [], 0, None
    try:
        # the token list goes in extra_body: as `prompt=` the client's parameter transform walks it
        # element by element, about 10 ms of a 1024-token request's TTFT on a 2-core x86 host (0.3 ms
        # is the server's), counted against every server alike; the body sent is the same JSON
        stream = await client.completions.create(model=model, prompt="", max_tokens=max_tokens, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"prompt": prompt, "ignore_eos": True})
        async for ev in stream:
            if ev.usage is not None:
                used = ev.usage.completion_tokens
            if not ev.choices or not ev.choices[0].text:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                itl.append(now - last)
            last = now
            n += 1
        out.append({"k": k, "t0": t0, "ttft": ttft, "itl": itl, "chunks": n, "tokens": n if used is None else used,
                    "usage": used, "asked": max_tokens, "e2e": time.perf_counter() - t0, "error": None})
    except Exception as e:  # every failure is counted and its message kept
        out.append({"k": k, "t0": t0, "ttft": None, "itl": [], "chunks": n, "tokens": 0, "usage": None,
                    "asked": max_tokens, "e2e": time.perf_counter() - t0, "error": str(e)[:300]})


WARM_SEED = 1000003  # the warm-up requests' seed: --seed + this (+ 1 + i for client process i)


def take_local(n):
    """next request index of a process's own queue (None when all are taken)"""
    nxt = iter(range(n))
    return lambda: next(nxt, None)


def take_shared(counter, n):
    """next request index of a queue the client processes share (multiprocessing.Value)"""
    def take():
        with counter.get_lock():
            k = counter.value
            if k >= n:
                return None
            counter.value = k + 1
            return k
    return take


async def drive(client, model, reqs, ats, mine, take, workers, t0, out):
    """this process's part of a point: Poisson arrivals of the requests `mine` at t0 + ats[k] (ats not
    None), or `workers` loops taking requests from take() (a fixed number in flight)"""
    if ats is not None:  # each at its time from the start (the client's own delays do not add up)
        tasks = []
        for k in mine:
            await asyncio.sleep(max(0.0, t0 + ats[k] - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client, model, reqs[k][0], reqs[k][1], out, k)))
        await asyncio.gather(*tasks)
        return

    async def worker():
        while (k := take()) is not None:
            await one(client, model, reqs[k][0], reqs[k][1], out, k)
    await asyncio.gather(*(worker() for _ in range(workers)))


async def warm(client, model, a, seed):
    """a.warmup requests of a.shape from their own seed, one after another, not counted: a server's first
    request pays for lazily loaded kernels and captured graphs, a client's for its connections"""
    wrnd = random.Random(seed)
    for _ in range(a.warmup):
        p, o = shape_of(a.shape, wrnd)
        await one(client, model, [wrnd.randrange(256, a.vocab) for _ in range(p)], o, [])


def child(args, model, reqs, ats, i, n, counter, conn):
    """client process i of n, talking to the parent over conn: ("ready",) once its client is made and
    warmed up; then the start time; then ("done", results, end, cpu), or ("error", message) at any point"""
    async def go():
        client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key or "none", max_retries=0, timeout=args.timeout)
        await warm(client, model, args, args.seed + WARM_SEED + 1 + i)
        out = []
        conn.send(("ready",))
        t0 = await asyncio.to_thread(conn.recv)
        c0 = time.process_time()
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        workers = args.concurrency // n + (i < args.concurrency % n)
        await drive(client, model, reqs, ats, range(i, len(reqs), n), take_shared(counter, len(reqs)), workers, t0, out)
        end, cpu = time.perf_counter(), time.process_time() - c0
        await client.close()
        return out, end, cpu
    try:
        msg = ("done",) + asyncio.run(go())
    except BaseException as e:  # the parent reports it
        msg = ("error", repr(e)[:300])
    try:
        conn.send(msg)
        conn.close()
    except OSError:  # the parent is gone
        pass


def children_wait(ps, conns, want):
    """the next message (want: its kind) of every client process, waiting on their pipes and their exits
    at once: a process that fails or exits without one stops the point at once, named"""
    got, left = {}, set(range(len(ps)))
    while left:
        ready = multiprocessing.connection.wait([conns[i] for i in left] + [ps[i].sentinel for i in left])
        for i in sorted(left):
            msg = None
            if conns[i] in ready or conns[i].poll():
                try:
                    msg = conns[i].recv()
                except EOFError:  # its end closed: it exited without a word
                    pass
            elif ps[i].sentinel not in ready:
                continue
            if msg is None:
                ps[i].join(10)
                raise RuntimeError("client process %d exited (status %s) without its %s" % (i, ps[i].exitcode, want))
            if msg[0] == "error":
                raise RuntimeError("client process %d failed: %s" % (i, msg[1]))
            if msg[0] != want:
                raise RuntimeError("client process %d sent %r where %r was due" % (i, msg[0], want))
            got[i] = msg
            left.discard(i)
    return [got[i] for i in range(len(ps))]


def procs_for(a):
    """--procs, or with 0 one client process a 32 requests in flight (Poisson: 4), at most half the CPUs
    this process may run on"""
    if a.procs:
        return a.procs
    want = 4 if a.rate > 0 else -(-a.concurrency // 32)
    return max(1, min(want, len(os.sched_getaffinity(0)) // 2))


async def run(a):
    client = AsyncOpenAI(base_url=a.base_url, api_key=a.api_key or "none", max_retries=0, timeout=a.timeout)
    model = a.model
    if not model:
        models = await client.models.list()
        model = models.data[0].id
    rnd = random.Random(a.seed)
    reqs = []
    for _ in range(a.requests):
        p, o = shape_of(a.shape, rnd)
        reqs.append(([rnd.randrange(256, a.vocab) for _ in range(p)], o))
    ats = None
    if a.rate > 0:  # arrival times from the start, from the same generator after the requests
        ats = [0.0]
        for _ in range(1, len(reqs)):
            ats.append(ats[-1] + rnd.expovariate(a.rate))
    n = min(procs_for(a), len(reqs) if a.rate > 0 else min(len(reqs), a.concurrency))
    out, ps = [], []
    try:
        if n == 1:
            await warm(client, model, a, a.seed + WARM_SEED)
            before = read_metrics(a.base_url, a.api_key)
            t0, c0 = time.perf_counter(), time.process_time()
            await drive(client, model, reqs, ats, range(len(reqs)), take_local(len(reqs)), a.concurrency, t0, out)
            wall, cpus = time.perf_counter() - t0, [time.process_time() - c0]
        else:  # client processes, each with its own client and event loop, warmed up, then one start
            ctx = multiprocessing.get_context("spawn")
            counter, pipes = ctx.Value("l", 0), [ctx.Pipe() for _ in range(n)]
            conns = [p[0] for p in pipes]
            ps = [ctx.Process(target=child, args=(a, model, reqs, ats, i, n, counter, pipes[i][1]), daemon=True)
                  for i in range(n)]
            for p in ps:
                p.start()
            for _, c in pipes:
                c.close()  # the children's ends: a child's exit closes its pipe
            await asyncio.to_thread(children_wait, ps, conns, "ready")
            before = read_metrics(a.base_url, a.api_key)
            t0 = time.perf_counter() + 0.05
            for c in conns:
                c.send(t0)
            got = await asyncio.to_thread(children_wait, ps, conns, "done")
            for g in got:
                out += g[1]
            wall, cpus = max(g[2] for g in got) - t0, [g[3] for g in got]
    finally:
        for p in ps:
            if p.is_alive():
                p.kill()
            p.join()
    await client.close()
    ok = [r for r in out if r["error"] is None]
    server = server_split(before, read_metrics(a.base_url, a.api_key), len(ok))
    ttft = [r["ttft"] * 1e3 for r in ok if r["ttft"] is not None]
    itl = [x * 1e3 for r in ok for x in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    res = {"label": a.label, "model": model, "base_url": a.base_url, "shape": a.shape, "seed": a.seed,
           "mode": ("rate %g/s" % a.rate) if a.rate > 0 else "concurrency %d" % a.concurrency,
           "requests": len(out), "errors": len(out) - len(ok), "wall_s": wall,
           "requests_per_s": len(ok) / wall if wall > 0 else None,
           "output_tok_per_s": tokens / wall if wall > 0 else None, "output_tokens": tokens,
           "expected_output_tokens": sum(r["asked"] for r in ok),
           "tokens_from_usage": sum(r["usage"] is not None for r in ok), "chunks": sum(r["chunks"] for r in ok),
           "client_cpu": max(cpus) / wall if wall > 0 else None, "client_cpu_total": sum(cpus) / wall if wall > 0 else None,
           "client_procs": n, "warmup": a.warmup, "sent": [r["k"] for r in sorted(out, key=lambda r: r["t0"])],
           "prompt_tokens": sum(len(p) for p, _ in reqs),
           "ttft_ms": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99),
                       "mean": sum(ttft) / len(ttft) if ttft else None},
           "itl_ms": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99)},
           "server": server, "first_errors": [r["error"] for r in out if r["error"]][:3]}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", help="the model name (default: the first of /v1/models)")
    ap.add_argument("--api-key", help="Authorization: Bearer KEY")
    ap.add_argument("--vocab", type=int, required=True, help="token ids are drawn from [256, VOCAB)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals at this many requests a second")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--shape", default="chat", help="chat, 1k-256, 8k-1k or IN-OUT")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="requests sent first, one at a time, not counted")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a request may take")
    ap.add_argument("--procs", type=int, default=0,
                    help="client processes (0: one a 32 requests in flight, 4 for Poisson arrivals, at most half the CPUs)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    if a.vocab <= 256 or a.requests < 1 or a.concurrency < 1 or a.rate < 0 or a.warmup < 0 or a.procs < 0:
        ap.error("--vocab above 256, --requests and --concurrency at least 1, --rate, --warmup and --procs not negative")
    try:
        res = asyncio.run(run(a))
    except RuntimeError as e:  # a client process failed: the point has no result
        print("serve_load: %s" % e, file=sys.stderr)
        return 2
    text = json.dumps(res)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
