#!/usr/bin/env python3
"""bench/serve_load.py against `mlaserve serve` on the bundled tiny model (CPU workers), through the
official openai client. No timing is asserted: the counts and the fields have to be right.
- 8 requests of 32 prompt tokens and 8 output tokens at concurrency 4: no error, 64 output tokens,
  TTFT and ITL percentiles present and ordered, requests/s and tok/s positive; the server's split of
  the first token's time read from /metrics: its TTFT the sum of queue and prefill, inside the
  client's (the server's interval lies within the client's), at least 8 steps, the 256 prompt tokens
  received (the warm-up request before the point not counted); the tokens from each request's usage;
- 5 Poisson arrivals (rate 50/s) of 16 prompt tokens and 6 output tokens: no error, every asked token
  streamed;
- both again from two client processes (--procs 2): the same counts, the latencies and CPU share
  merged, each request sent once (one process: in order), the server's split (all the prompt
  tokens, each process's warm-up not among them) within the clients' time; a client process
  killed mid-point ends the point at once, exit status 2, the message naming it;
- the chat-like lengths (no server): 2000 draws within 50-4000 / 20-1000 tokens, long-tailed (the mean
  above the median), the same for the same seed;
- 3 requests longer than the model's context (4096): 3 errors, each message kept, exit status 1.
usage: test_serve_load.py MLASERVE MODEL"""
import json
import os
import signal
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "lib"))
from mlatest import ServeProcess, check, finish, set_verbose  # noqa: E402
set_verbose(os.environ.get("V") == "1")

exe, model = sys.argv[1], sys.argv[2]
tool = os.path.join(here, "..", "..", "bench", "serve_load.py")
srv = ServeProcess([exe, "serve", "-m", model, "--port", "0"], ["--max-seqs", "8"], timeout=120, prefix="serve_load_")


def load(*args):
    r = subprocess.run([sys.executable, tool, "--base-url", "http://127.0.0.1:%d/v1" % srv.port, "--vocab", "2048",
                        *args], capture_output=True, text=True, timeout=600)
    try:
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr
    except (ValueError, IndexError):
        return r.returncode, None, r.stdout + r.stderr


try:
    rc, j, err = load("--concurrency", "4", "--requests", "8", "--shape", "32-8")
    check(rc == 0 and j is not None, "fixed shape at concurrency 4: exit 0", err[-500:])
    if j:
        check(j["requests"] == 8 and j["errors"] == 0, "8 requests, no error", j)
        check(j["output_tokens"] == 64 == j["expected_output_tokens"] and j["prompt_tokens"] == 256,
              "64 output tokens, 256 prompt tokens", j)
        t, i = j["ttft_ms"], j["itl_ms"]
        check(all(v is not None and v > 0 for v in (t["p50"], t["p90"], t["p99"], i["p50"], i["p99"])) and
              t["p50"] <= t["p90"] <= t["p99"] and i["p50"] <= i["p90"] <= i["p99"], "TTFT / ITL percentiles", j)
        check(j["requests_per_s"] > 0 and j["output_tok_per_s"] > 0 and j["mode"] == "concurrency 4",
              "throughput fields", j)
        sv = j["server"]
        check(sv is not None and abs(sv["ttft"] - sv["queue"] - sv["prefill"]) <= 1e-3 * sv["ttft"] + 1e-3 and
              0 < sv["ttft"] <= t["mean"] and sv["steps"] >= 8, "the server's TTFT split", j)
        check(sv is not None and sv["prompt_tokens"] == 256, "the server received the 256 prompt tokens (the "
              "warm-up request's not among them)", j)
        check(j["tokens_from_usage"] == 8 and j["warmup"] == 1 and 0 < j["client_cpu"] < 4 and j["client_procs"] == 1,
              "tokens from every request's usage; one warm-up; the client's CPU share; one process (4 in flight)", j)
        check(j["sent"] == list(range(8)), "one process sends the requests in their order", j["sent"])
    rc, j, err = load("--rate", "50", "--requests", "5", "--shape", "16-6", "--seed", "7")
    check(rc == 0 and j is not None and j["errors"] == 0 and j["mode"] == "rate 50/s", "Poisson arrivals: no error",
          (j, err[-500:]))
    if j:
        check(j["output_tokens"] == j["expected_output_tokens"] == 30, "every asked token streamed", j)
    # two client processes: the same requests, the workers split between them, one queue
    rc, j, err = load("--concurrency", "4", "--requests", "8", "--shape", "32-8", "--procs", "2")
    check(rc == 0 and j is not None and j["errors"] == 0 and j["requests"] == 8 and j["client_procs"] == 2,
          "two client processes at concurrency 4: 8 requests, no error", (j, err[-500:]))
    if j:
        check(j["output_tokens"] == 64 and j["tokens_from_usage"] == 8 and j["ttft_ms"]["p50"] and j["itl_ms"]["p99"]
              and j["wall_s"] > 0 and 0 < j["client_cpu"] <= j["client_cpu_total"] < 8,
              "their tokens, latencies and CPU shares (the busiest, all) merged", j)
        check(sorted(j["sent"]) == list(range(8)), "every request sent once from the shared queue", j["sent"])
        sv = j["server"]
        check(sv is not None and sv["prompt_tokens"] == 256 and 0 < sv["ttft"] <= j["ttft_ms"]["mean"],
              "the server saw the 256 prompt tokens, inside the clients' time", j)
    rc, j, err = load("--rate", "50", "--requests", "5", "--shape", "16-6", "--seed", "7", "--procs", "2")
    check(rc == 0 and j is not None and j["errors"] == 0 and j["client_procs"] == 2 and j["output_tokens"] == 30 and
          j["requests"] == 5 and sorted(j["sent"]) == list(range(5)),
          "Poisson arrivals from two client processes: every request once, every asked token", (j, err[-500:]))
    if j:
        check((j["server"] or {}).get("prompt_tokens") == 80, "the server saw their 80 prompt tokens (each process's "
              "warm-up request before the point)", j)
    sys.path.insert(0, os.path.dirname(tool))
    import random
    import statistics
    import serve_load
    rnd = random.Random(11)
    draws = [serve_load.shape_of("chat", rnd) for _ in range(2000)]
    ps, os_ = [p for p, _ in draws], [o for _, o in draws]
    check(min(ps) >= 50 and max(ps) <= 4000 and min(os_) >= 20 and max(os_) <= 1000, "chat lengths within bounds")
    check(statistics.mean(ps) > statistics.median(ps) and statistics.mean(os_) > statistics.median(os_),
          "chat lengths long-tailed", (statistics.mean(ps), statistics.median(ps)))
    rnd = random.Random(11)
    check([serve_load.shape_of("chat", rnd) for _ in range(2000)] == draws, "chat lengths seeded")
    rc, j, err = load("--concurrency", "2", "--requests", "3", "--shape", "5000-4")
    check(rc == 1 and j is not None and j["errors"] == 3 and len(j["first_errors"]) == 3 and
          all("4096" in e for e in j["first_errors"]), "too long for the context: 3 errors named, exit 1", (rc, j))
    # a client process killed mid-point: the point ends at once, naming it (exit status 2), no hang
    pr = subprocess.Popen([sys.executable, tool, "--base-url", "http://127.0.0.1:%d/v1" % srv.port, "--vocab", "2048",
                           "--concurrency", "2", "--requests", "40", "--shape", "32-64", "--procs", "2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids, t_end = [], time.time() + 60
    while len(kids) < 2 and time.time() < t_end and pr.poll() is None:
        time.sleep(0.2)
        kids = []
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and int(open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()[1]) == pr.pid and \
                        b"spawn_main" in open("/proc/%s/cmdline" % d, "rb").read():
                    kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    time.sleep(2)  # into the point: the processes warmed up, their requests streaming
    check(len(kids) == 2 and pr.poll() is None, "two client processes running", (kids, pr.poll()))
    if kids and pr.poll() is None:
        os.kill(kids[1], signal.SIGKILL)
        t_kill = time.time()
        try:
            _, err = pr.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pr.kill()
            _, err = pr.communicate()
        check(pr.returncode == 2 and "client process" in err and "without its" in err and time.time() - t_kill < 20,
              "a killed client process ends the point at once, named (%.1f s)" % (time.time() - t_kill), err[-500:])
    else:
        pr.kill()
        pr.communicate()
finally:
    srv.stop()
finish("serve_load: ")
