"""The cache pool under pressure, through `mlaserve serve` on the tiny-deepseek3 fixture.

Server B has the default pool, one-shot prefill and no prefix cache; server A a pool of BLOCKS
blocks (--kv-memory: BLOCKS x the block bytes B reports), 8 sequences a step, prompts prefilled in
chunks of 32 tokens and the prefix cache on. 64 greedy completions whose prompts share prefixes (4
bases) are sent to each all at once: A must preempt and evict, and every answer (text and token
logprobs) must equal B's. A runs no step until all 64 have arrived (MLA_SCHED_HOLD, a developer
switch): on a loaded host the clients' requests can come spread out enough that the pool never
fills, so without the hold whether A is pressured would depend on the host's speed. Then, on A: a request longer than the whole pool is a 400 naming its
length and the capacity, and /metrics shows preemptions, prefix-cache hits and the pool.
Usage: test_serve_pool.py SERVE_EXE WORKER_EXE FIXTURES_DIR [BLOCKS (12)] [LOGPROB_TOL (1e-5)]
[REPEATS (2): a prompt holds its base 1..REPEATS times] [MIN_TOKENS (8): max_tokens from MIN_TOKENS to
MIN_TOKENS + 6: outputs long enough that 8 sequences at once outgrow the pool]; MLASERVE_TEST_SERVE_ARGS adds arguments to both
servers (e.g. --backend cuda: blocks of 64 positions, so BLOCKS 6, REPEATS 8 and MIN_TOKENS 70 for
sequences that cross blocks, and LOGPROB_TOL 2e-2: other batch shapes take other kernels there). Exit 77 when the fixture is
missing."""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import ServeProcess, check, http_get, http_post as post, summary  # noqa: E402

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
blocks = int(sys.argv[4]) if len(sys.argv) > 4 else 12
tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-5
repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 2
min_tokens = int(sys.argv[7]) if len(sys.argv) > 7 else 8
extra = os.environ.get("MLASERVE_TEST_SERVE_ARGS", "").split()
model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)
ref = json.load(open(os.path.join(fixtures, "tiny-deepseek3", "ref.json")))
bases = [p["text"] for p in ref["prompts"] if "<｜" not in p["text"]][:4]
words = "one two three four five six seven eight nine ten eleven twelve".split()
reqs = []
for i in range(64):
    base = bases[i % len(bases)]
    prompt = (base + " ") * (1 + i % repeats) + " ".join(words[: 1 + i % 12])
    reqs.append({"prompt": prompt, "max_tokens": min_tokens + i % 7, "temperature": 0, "logprobs": 1})


def run_all(port):
    out = {}

    def go(i):
        out[i] = post(port, "/v1/completions", reqs[i], timeout=600)
    ths = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
    [t.start() for t in ths]
    [t.join(900) for t in ths]
    return out


def metric(text, name):
    tot = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            tot += float(line.split()[-1])
    return tot


common = ["--max-context", "1024"] + extra
big = ServeProcess([exe, "-m", model, "--port", "0"],
                   common + ["--max-seqs", "64", "--max-prefill-tokens", "2048", "--no-prefix-cache",
                             "--long-prefill-tokens", "2000"],
                   worker=worker, timeout=120, prefix="serve_pool_b_")
small = None
try:

    st, m0 = http_get(big.port, "/metrics")
    m0 = m0.decode() if isinstance(m0, bytes) else m0
    bsize, bbytes = int(metric(m0, "mlaserve_kv_cache_block_size")), int(metric(m0, "mlaserve_kv_cache_block_bytes"))
    cap = blocks * bsize
    print("blocks of %d positions, %d bytes: pool A %d blocks = %d positions" % (bsize, bbytes, blocks, cap))
    small = ServeProcess([exe, "-m", model, "--port", "0"],
                         common + ["--kv-memory", str(blocks * bbytes), "--max-seqs", "8", "--max-prefill-tokens", "32"],
                         worker=worker, timeout=120, prefix="serve_pool_a_",
                         env={"MLA_SCHED_HOLD": str(len(reqs))})
    ra, rb = run_all(small.port), run_all(big.port)
    # said once the workers were ready: the default long-prompt threshold, 4 x the step's 32
    # tokens at most half the context the pool serves (A); one past the context (B: none is long)
    ctx_a = min(1024, cap)
    check("a prompt long past %d tokens left" % min(4 * 32, ctx_a // 2) in small.text(),
          "A: the default long-prompt threshold within the context (%d)" % ctx_a)
    check("--long-prefill-tokens 2000 is not below the context (1024 tokens)" in big.text() and
          "a prompt long past 2000 tokens left" in big.text(), "B: the long-prompt threshold past the context")
    same = 0
    for i in range(len(reqs)):
        sa, da = ra.get(i, (0, b""))
        sb, db = rb.get(i, (0, b""))
        check(sa == 200 and sb == 200, "request %d: %s / %s %r" % (i, sa, sb, (da or db)[:200]))
        if sa != 200 or sb != 200:
            continue
        ca, cb = json.loads(da)["choices"][0], json.loads(db)["choices"][0]
        la, lb = ca["logprobs"]["token_logprobs"], cb["logprobs"]["token_logprobs"]
        ok = ca["text"] == cb["text"] and len(la) == len(lb) and all(abs(x - y) <= tol for x, y in zip(la, lb))
        check(ok, "request %d under pressure equals the unpressured run: %r vs %r" % (i, ca["text"], cb["text"]))
        same += ok
    print("%d of %d answers equal" % (same, len(reqs)))
    st, m = http_get(small.port, "/metrics")
    m = m.decode() if isinstance(m, bytes) else m
    check(st == 200, "metrics")
    pre, hits, q = (metric(m, "mlaserve_preemptions_total"), metric(m, "mlaserve_prefix_cache_hits_total"),
                    metric(m, "mlaserve_prefix_cache_queries_total"))
    print("pool A: preemptions %d, prefix cache %d of %d prompt tokens" % (pre, hits, q))
    check(pre > 0, "the small pool preempted (it was under pressure)")
    check(0 < hits <= q, "the prefix cache hit (%d of %d tokens)" % (hits, q))
    check(metric(m, "mlaserve_kv_cache_blocks") == blocks, "blocks total %d" % blocks)
    check(metric(m, "mlaserve_kv_cache_rank_blocks") == blocks and "rank=\"0\"" in m, "the rank's pool")
    check(metric(m, "mlaserve_kv_cache_block_bytes") == bbytes, "block bytes")
    check(metric(m, "mlaserve_kv_cache_blocks_used") == 0, "nothing held once every request finished")
    st, m2 = http_get(big.port, "/metrics")
    m2 = m2.decode() if isinstance(m2, bytes) else m2
    check(metric(m2, "mlaserve_prefix_cache_queries_total") == 0, "--no-prefix-cache looks nothing up")
    # a load shorter than a progress report still reports its bytes (the last one, at the end)
    lb, lt = metric(m2, "mlaserve_worker_load_bytes"), metric(m2, "mlaserve_worker_load_total_bytes")
    check(lb > 0 and lb == lt, "the load's bytes in /metrics (%s of %s)" % (lb, lt))
    # a request the whole pool cannot hold: a 400 naming its length and the capacity
    st, data = post(small.port, "/v1/completions", {"prompt": bases[0] * (cap // 4), "max_tokens": 4})
    msg = json.loads(data)["error"]["message"] if st == 400 else data[:200]
    check(st == 400 and str(cap) in msg and "tokens" in msg, "too long for the pool: 400 %r" % msg)
    # the server is still serving
    st, data = post(small.port, "/v1/completions", reqs[0])
    check(st == 200 and json.loads(data)["choices"][0]["text"] == json.loads(ra[0][1])["choices"][0]["text"],
          "still serving after the refusal")
finally:
    if small:
        small.stop()
    big.stop()
sys.exit(summary("serve_pool: "))
