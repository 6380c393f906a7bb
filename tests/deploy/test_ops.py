"""Operations, on the real `mlaserve` + `mlaserve-worker` with the tiny fixture (CPU workers):
  startup  a slow load (MLA_LOAD_LAYER_DELAY_MS): /health answers 503 with each rank's progress
           while loading, the workers log it, the start timeout counts only time without progress
           (the load takes longer than --start-timeout-ms and still starts); then generation, the
           stats line, and /metrics (every series named, checked by promtool when installed)
  timeout  a load that stalls longer than --start-timeout-ms fails the start, naming the timeout;
           so does a group of external workers none of which registers
  cli      --version, --help with meanings and defaults (docs/commands.md the same text),
           --opt=value, unknown options named by every command, --log-level, ISO dates in log lines
Usage: test_ops.py MLASERVE WORKER FIXTURES CASE"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Server, check, finish, free_port, model_path, wait_for  # noqa: E402
from mlatest import http_get, http_post  # noqa: E402

exe, worker, fixtures, case = sys.argv[1:5]
model = model_path(fixtures)


def health(port):
    try:
        return http_get(port, "/health", timeout=5)
    except OSError:
        return None, None


def case_startup():
    port, pport = free_port(), free_port()
    srv = Server(exe, model, ["--tp", "2", "--port", str(port), "--proto-port", str(pport), "--start-timeout-ms", "4500",
                              "--stats-interval", "1"],
                 env_extra={"MLA_LOAD_LAYER_DELAY_MS": "2000", "MLA_WORKER_STEP_DELAY_MS": "40"}, worker=worker,
                 wait=False, timeout=120)
    try:
        seen = []

        def loading_seen():
            st, body = health(port)
            if st == 503 and body:
                j = json.loads(body)
                seen.append(j)
                return j.get("status") == "loading" and any(0 < r.get("bytes_done", 0) < r.get("bytes_total", 0)
                                                            for r in j.get("ranks", []))
            return False

        check(wait_for(loading_seen, 60, 0.1), "/health: 503 with load progress while loading",
              seen[-1:] or srv.tail(2000))
        j = seen[-1]
        check(len(j["ranks"]) == 2 and all(r["state"] in ("starting", "registered", "loading", "loaded")
                                           for r in j["ranks"]), "/health: both ranks listed", j)
        sized = [x for x in j["ranks"] if "bytes_total" in x]
        check(j.get("ranks_counted") == len(sized) and j["bytes_total"] == sum(x["bytes_total"] for x in sized),
              "/health: the top-level total is that of the ranks counted, and says how many", j)
        r = [x for x in j["ranks"] if x.get("bytes_done", 0) > 0][0]
        check(r["bytes_total"] > r["bytes_done"] and "bytes_per_second" in r and r["eta_seconds"] > 0,
              "/health: bytes, rate and ETA of a loading rank", r)
        # a generation meanwhile: 503 with its own code (a client retries it; not a failed group)
        st, body = http_post(port, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        err = json.loads(body).get("error", {}) if body else {}
        check(st == 503 and err.get("code") == "model_loading" and "loading" in err.get("message", ""),
              "a generation while loading: 503 model_loading", (st, body[:300]))
        # the context served is not known before the workers take their cache pools: left out
        st, body = http_get(port, "/v1/models")
        m = json.loads(body)["data"][0] if st == 200 else {}
        check(st == 200 and m.get("id") and "max_model_len" not in m, "/v1/models while loading: no max_model_len",
              (st, body[:300]))
        st, body = http_get(port, "/metrics")
        check(st == 200 and b"mlaserve_model_info{" not in body, "/metrics while loading: no mlaserve_model_info")
        st, body = http_post(port, "/tokenize", {"prompt": "hi"})
        check(st == 200 and "max_model_len" not in json.loads(body) and json.loads(body)["count"] > 0,
              "/tokenize while loading: the tokens, no max_model_len", (st, body[:300]))
        r = subprocess.run([exe, "client", "--port", str(pport), "models"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 0 and r.stdout.split()[1:] == ["loading"], "client models while loading: no context",
              (r.stdout, r.stderr))
        # from then until ready, every 503 is the loading body (also between the last rank's load
        # and the scheduler taking the pools), never an error
        bodies = []

        def ready_seen():
            st, body = health(port)
            if st != 200:
                bodies.append(json.loads(body) if body else {})
            return st == 200
        check(wait_for(ready_seen, 90, 0.005), "/health: 200 after the load")
        check(all(b.get("status") == "loading" for b in bodies), "/health: loading until ready",
              [b for b in bodies if b.get("status") != "loading"][:2])
        t0 = time.time()
        srv.wait_ready(timeout=90)
        took = time.time() - t0
        log = srv.text()
        check("the workers are ready; serving" in log, "serve: ready after the load", log[-1500:])
        # the access log: a line for each response, the refused ones too (503 while loading)
        check(re.search(r'info: http: 127\.0\.0\.1:[0-9]+ "POST /v1/completions" 503, [0-9]+ ms', log) and
              re.search(r'info: http: 127\.0\.0\.1:[0-9]+ "GET /health" 200, [0-9]+ ms', log),
              "the access log: a line a response", log[-2000:])
        check(re.search(r"loaded: [0-9.]+ of [0-9.]+ MiB \(100%\), [0-9.]+ MiB/s in [0-9.]+ s", log),
              "worker log: the load's size, rate and time", log[-2000:])
        # 3 layer gaps of 2 s: about 6 s of loading against a 4.5 s start timeout
        load_s = [float(x) for x in re.findall(r"loaded: .* in ([0-9.]+) s", log)]
        check(load_s and max(load_s) > 4.5, "the load took longer than --start-timeout-ms and still started",
              (load_s, took))
        st, body = health(port)
        check(st == 200, "/health: 200 once loaded", body)
        st, body = http_get(port, "/v1/models")
        check(st == 200 and json.loads(body)["data"][0].get("max_model_len", 0) > 0, "/v1/models: max_model_len once "
              "loaded", body[:300])
        st, body = http_post(port, "/tokenize", {"prompt": "hi"})
        check(st == 200 and json.loads(body).get("max_model_len", 0) > 0, "/tokenize: max_model_len once loaded",
              body[:300])
        t_gen = time.time()
        st, body = srv.post("/v1/completions", {"prompt": "What is 7 plus 5?", "max_tokens": 40, "ignore_eos": True})
        t_gen = time.time() - t_gen
        check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 40, "generation", body[:300])
        check(wait_for(lambda: re.search(r"stats: \d+ running, \d+ waiting, KV cache \d+ of \d+ blocks "
                                         r"\([0-9.]+%\), prompt [0-9.]+ tok/s, generation [0-9.]+ tok/s",
                                         srv.text()), 10), "the stats line while busy", srv.tail(1500))
        time.sleep(0.3)  # a heartbeat after the steps
        st, metrics = http_get(port, "/metrics", timeout=10)
        metrics = metrics.decode()
        check(st == 200, "/metrics")
        for name in ("mlaserve_build_info{", "mlaserve_model_info{", "mlaserve_request_queue_time_seconds_count",
                     "mlaserve_request_prefill_time_seconds_count", "mlaserve_request_decode_time_seconds_count",
                     "mlaserve_request_prompt_tokens_bucket", "mlaserve_request_generation_tokens_bucket",
                     'mlaserve_worker_steps_total{rank="1"}', 'mlaserve_worker_step_seconds_total{rank="0"}',
                     'mlaserve_worker_allreduce_seconds_total{rank="1"}', 'mlaserve_worker_heartbeat_age_seconds{rank="0"}',
                     'mlaserve_worker_load_bytes{rank="0"}', "mlaserve_kv_cache_blocks{"):
            check(name in metrics, "/metrics has " + name)
        check("mlaserve_kv_cache_blocks_total" not in metrics, "/metrics: the block gauge has no counter's name")
        check("mlaserve_worker_device_memory_free_bytes{" not in metrics, "/metrics: no device memory on CPU workers")
        check("mlaserve_worker_backend_info{" not in metrics, "/metrics: no kernel configuration on CPU workers")

        def value(pat):
            m = re.search(pat + r" ([0-9.e+-]+)$", metrics, re.M)
            return float(m.group(1)) if m else None

        check((value(r'mlaserve_request_queue_time_seconds_count\{model="[^"]*"\}') or 0) >= 1
              and (value(r'mlaserve_request_decode_time_seconds_count\{model="[^"]*"\}') or 0) >= 1,
              "/metrics: the request's queue and decode times observed")
        check((value(r'mlaserve_request_generation_tokens_sum\{model="[^"]*"\}') or 0) >= 40,
              "/metrics: the generation length observed")
        # the injected 40 ms come before the timed part of a step (run_plan): the time only has to
        # be counted, not to hold the delay (how long rank 1 waits for rank 0 varies)
        check((value(r'mlaserve_worker_steps_total\{rank="1"\}') or 0) >= 40
              and (value(r'mlaserve_worker_step_seconds_total\{rank="1"\}') or 0) > 0,
              "/metrics: rank 1's steps and their time",
              (value(r'mlaserve_worker_steps_total\{rank="1"\}'), value(r'mlaserve_worker_step_seconds_total\{rank="1"\}')))
        # 39 of the 40 tokens come from one-token steps (the step ahead's among them), each timed
        # by the CPU engine: within the request's time, the only one that decoded
        dsteps, dsec = (value(r'mlaserve_worker_decode_steps_total\{rank="1"\}'),
                        value(r'mlaserve_worker_decode_seconds_total\{rank="1"\}'))
        check((dsteps or 0) >= 39 and 0 < (dsec or 0) < t_gen,
              "/metrics: rank 1's decode steps and their time", (dsteps, dsec, t_gen))
        check((value(r'mlaserve_worker_allreduces_total\{rank="0"\}') or 0) > 0,
              "/metrics: rank 0's all-reduces on the host collective")
        age = value(r'mlaserve_worker_heartbeat_age_seconds\{rank="0"\}')
        check(age is not None and 0 <= age < 5, "/metrics: heartbeat age", age)
        r = run([exe, "client", "--port", str(pport), "info"])
        ver = run([exe, "--version"]).stdout.strip()
        check(r.returncode == 0 and r.stdout.startswith(ver + " model "), "gRPC Info: the build", (r.stdout, ver))
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True, text=True,
                               timeout=60)
            check(r.returncode == 0, "promtool check metrics: no problem", (r.stdout + r.stderr)[-2000:])
        else:
            print("promtool not installed (scripts/install-deps.sh --test installs it): names not linted")
    finally:
        rc = srv.stop()
    check(rc == 0, "SIGTERM: exit 0", rc)


def case_timeout():
    port = free_port()
    srv = Server(exe, model, ["--tp", "2", "--port", str(port), "--start-timeout-ms", "2000"],
                 env_extra={"MLA_LOAD_LAYER_DELAY_MS": "6000"}, worker=worker, wait=False, timeout=60)
    try:
        check(wait_for(lambda: srv.proc.poll() is not None, 40), "a stalled load ends the server")
        log = srv.text()
        check(srv.proc.returncode == 1, "exit status 1", srv.proc.returncode)
        check("no start-up progress" in log and "--start-timeout-ms" in log and "(loading)" in log,
              "the message names the timeout and the ranks still loading", log[-1500:])
        check("starting 2 workers: " in log, "the message says what the start did", log[-1500:])
    finally:
        srv.stop(timeout=10)
    # external workers that never come: the message says the server waited for them
    port = free_port()
    srv = Server(exe, model, ["--tp", "1", "--workers-external", "--port", str(port), "--start-timeout-ms", "1500"],
                 wait=False, timeout=60)
    try:
        check(wait_for(lambda: srv.proc.poll() is not None, 30), "no external worker: the start ends")
        log = srv.text()
        check(srv.proc.returncode == 1 and "waiting for 1 external worker: " in log and " 1 workers" not in log
              and "missing ranks: 0" in log, "no external worker: the message says whom the server waited for",
              log[-1500:])
    finally:
        srv.stop(timeout=10)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def case_cli():
    r = run([exe, "--version"])
    check(r.returncode == 0 and re.match(r"mlaserve \d+\.\d+\.\d+ \(commit \S+, \S+, (CPU only|CUDA sm_\S+)\)$",
                                         r.stdout.strip()), "mlaserve --version", r.stdout)
    r = run([worker, "--version"])
    check(r.returncode == 0 and r.stdout.startswith("mlaserve-worker "), "mlaserve-worker --version", r.stdout)
    r = run([exe, "serve", "--help"])
    out = r.stdout
    check(r.returncode == 0 and "--tp N" in out and "(default: 1)" in out and "--log-level" in out
          and "--start-timeout-ms N" in out and "--stats-interval S" in out, "serve --help", out[:500])
    opts = [ln for ln in out.splitlines() if ln.startswith("  -")]
    check(len(opts) >= 30 and all(len(ln) > 33 and ln[31:].strip() for ln in opts if len(ln) <= 31 + 200),
          "serve --help: every option has a meaning", [ln for ln in opts if len(ln) <= 33])
    for cmd in (["serve"], ["generate"], ["logits"], ["bench"], ["inspect"], ["keygen"], ["client"], ["mkmodel"]):
        r = run([exe] + cmd + ["--help"])
        check(r.returncode == 0 and "--log-level" in r.stdout, "%s --help" % cmd[0], r.stdout[:300] + r.stderr)
        r = run([exe] + cmd + ["--no-such-option=1"])
        check(r.returncode == 2 and "unknown option '--no-such-option'" in r.stderr, "%s: unknown option named" % cmd[0],
              r.stderr)
    gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gen_commands_md.py")
    doc = os.path.join(os.path.dirname(gen), "..", "docs", "commands.md")
    r = run([sys.executable, gen, exe, worker, "--check", doc])
    check(r.returncode == 0, "docs/commands.md is every command's --help", r.stdout + r.stderr)
    r = run([worker, "--no-such-option"])
    check(r.returncode == 2 and "unknown option '--no-such-option'" in r.stderr, "worker: unknown option named", r.stderr)
    r = run([worker, "--help"])
    check(r.returncode == 0 and "--backend cpu|cuda" in r.stdout and "(default: cuda where a GPU is visible" in r.stdout,
          "worker --help", r.stdout[:400])
    # --opt=value and --opt value mean the same
    a = run([exe, "inspect", model, "--tp", "2", "--json"])
    b = run([exe, "inspect", "--tp=2", "--json", "-m", model])
    check(a.returncode == 0 and a.stdout == b.stdout and json.loads(a.stdout), "inspect: --tp=2 as --tp 2")
    r = run([exe, "inspect", model, "--tp=0"])
    check(r.returncode == 2 and "--tp" in r.stderr, "inspect: --tp=0 refused naming it", r.stderr)
    r = run([exe, "inspect", model, "--tp", "65"])  # serve's bound too (WIRE_MAX_WORLD)
    check(r.returncode == 2 and "--tp" in r.stderr, "inspect: --tp 65 refused naming it", r.stderr)
    # CUDA settings the CPU backend would not honour: refused by name before the workers start
    for a in (["--nccl", "on"], ["--cuda-precision", "bf16"]):  # (--allreduce oneshot: allreduce_oneshot_cpu_refused)
        r = run([exe, "generate", "-m", model, "-p", "Hi", "-n", "1", "--worker-exe", worker, "--backend", "cpu"] + a)
        check(r.returncode != 0 and " ".join(a) + " is a CUDA setting" in r.stderr and "registered" not in r.stderr,
              "generate --backend cpu %s refused" % " ".join(a), r.stderr[-300:])
    # sizes: digits, a fraction only before a suffix; not strtod's hex, exponents or blanks
    for v in ("1.5", "0x10", "1e3", " 1G", "1.G", "0", "-1G"):
        r = run([exe, "serve", "-m", model, "--kv-memory", v, "--port", "-1"])
        check(r.returncode == 2 and "--kv-memory" in r.stderr and "not a size" in r.stderr,
              "serve: --kv-memory %r refused naming it" % v, r.stderr[-300:])
    # log level and ISO dates
    gen = [exe, "generate", "-m", model, "-p", "Hi", "-n", "2", "--worker-exe", worker]
    r = run(gen + ["--log-level=info"])
    lines = [ln for ln in r.stderr.splitlines() if "] info: " in ln]
    check(r.returncode == 0 and lines and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[", ln) for ln in lines),
          "--log-level info: info lines with ISO dates", r.stderr[-600:])
    check(any(ln.split("] ")[0].endswith("[worker 0") for ln in lines), "the workers log at the level given",
          r.stderr[-600:])
    r = run(gen + ["--log-level", "debug"])
    check(r.returncode == 0 and "] debug: " in r.stderr, "--log-level debug", r.stderr[-400:])
    r = run(gen + ["--log-level", "error"])
    check(r.returncode == 0 and "] info: " not in r.stderr and "] warn: " not in r.stderr, "--log-level error",
          r.stderr[-400:])
    r = run(gen + ["--log-level", "loud"])
    check(r.returncode == 2 and "'loud'" in r.stderr, "--log-level: a bad level named", r.stderr)
    # every command's --help answers without a server or a model
    for cmd in (["client", "generate", "--help"], ["env", "--help"], ["version", "--help"]):
        r = run([exe] + cmd)
        check(r.returncode == 0 and "usage: mlaserve" in r.stdout, "%s: usage, status 0" % " ".join(cmd), r.stderr[-200:])
    # env and version take nothing else: an argument is refused, not ignored
    for cmd in (["env", "--bogus"], ["version", "--bogus"]):
        r = run([exe] + cmd)
        check(r.returncode == 2 and "takes no arguments (--bogus)" in r.stderr, "%s refused" % " ".join(cmd), r.stderr)
    # an empty tokens file: an error, not an empty output; --max-context 1: refused before the workers start
    empty = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mla_empty_tokens_%d" % os.getpid())
    open(empty, "w").close()
    r = run([exe, "logits", "-m", model, "--tokens", empty, "--out", empty + ".f32", "--worker-exe", worker])
    check(r.returncode == 1 and "no prompt" in r.stderr, "logits: an empty tokens file refused", r.stderr[-300:])
    os.unlink(empty)
    r = run([exe, "serve", "-m", model, "--max-context", "1", "--worker-exe", worker])
    check(r.returncode != 0 and "--max-context 1" in r.stderr and "started worker" not in r.stderr,
          "serve: --max-context 1 refused before the workers", r.stderr[-300:])
    # a prompt and -n past the model's context (4096): refused before any worker starts
    r = run([exe, "generate", "-m", model, "-p", "Hi", "-n", "5000", "--worker-exe", worker])
    check(r.returncode == 1 and "context length 4096" in r.stderr, "generate: past the context refused", r.stderr[-300:])


{"startup": case_startup, "timeout": case_timeout, "cli": case_cli}[case]()
finish()
