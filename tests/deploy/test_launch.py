"""Launchers: deploy/launch.sh (one node: coordinator + one worker per device, CPU backend here)
and deploy/slurm/mlaserve.sbatch (dry run, then a run under a fake srun/scontrol that starts the
tasks on this machine). Checks the generated commands, that generation works, the per-process
logs, that launch.sh starts a killed worker again under --on-worker-failure restart (the group
serves again), and that Ctrl-C / SIGTERM stops everything (no orphans).
Usage: test_launch.py MLASERVE WORKER FIXTURES SOURCE_DIR CASE (launch | slurm)"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from dlib import alive, check, finish, free_port, model_path, wait_for  # noqa: E402
from mlatest import http_get, http_post  # noqa: E402

exe, worker, fixtures, src, case = sys.argv[1:6]
model = model_path(fixtures)
bindir = os.path.dirname(os.path.abspath(exe))
workdir = os.path.dirname(os.path.abspath(worker))
here = os.path.dirname(os.path.abspath(__file__))


def post(port, body):
    return http_post(port, "/v1/completions", body, timeout=60)


get = http_get


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    st = open("/proc/%s/stat" % d).read()
                except OSError:
                    continue
                if int(st[st.rindex(")") + 2:].split()[1]) == p:
                    out.append(int(d))
                    todo.append(int(d))
    return out


def kill_all(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def case_launch():
    d = tempfile.mkdtemp(prefix="mla_launch_")
    logs = os.path.join(d, "logs")
    script = os.path.join(src, "deploy", "launch.sh")
    r = subprocess.run([script, "-m", model, "-n", "2", "--cpu", "--dry-run", "--bin", bindir, "--logs", logs],
                       capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and len(lines) == 3 and "--tp 2" in lines[0] and "--workers-external" in lines[0],
          "launch.sh --dry-run: the coordinator command", r.stdout)
    check(all("--rank %d --world 2" % k in lines[k + 1] for k in range(2)), "launch.sh --dry-run: one worker per rank")
    check(all(lines[k + 1].split(":", 1)[1].split()[:3] == ["env", "-u", "MLASERVE_API_KEY"] for k in range(2)),
          "launch.sh --dry-run: the workers start without the API key", lines[1:3])
    check(not os.path.exists(logs), "launch.sh --dry-run: no logs folder made")
    r = subprocess.run([script, "-m", model, "-n", "2", "--dry-run", "--bin", bindir, "--logs", logs],
                       capture_output=True, text=True, timeout=30)
    check("CUDA_VISIBLE_DEVICES=1 " in r.stdout and "--backend cuda --device cuda:1" in r.stdout,
          "launch.sh --dry-run: CUDA_VISIBLE_DEVICES per worker", r.stdout)
    # a mask given to the launcher is kept: worker i gets its i-th device, -n defaults to its length
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5")
    r = subprocess.run([script, "-m", model, "--dry-run", "--bin", bindir, "--logs", logs],
                       capture_output=True, text=True, timeout=30, env=env)
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and len(lines) == 3 and "--tp 2" in lines[0]
          and lines[1].startswith("worker 0: CUDA_VISIBLE_DEVICES=3 ")
          and lines[2].startswith("worker 1: CUDA_VISIBLE_DEVICES=5 "),
          "launch.sh --dry-run: CUDA_VISIBLE_DEVICES=3,5 kept (worker 0 -> 3, worker 1 -> 5)", r.stdout)
    r = subprocess.run([script, "-m", model, "-n", "3", "--dry-run", "--bin", bindir, "--logs", logs],
                       capture_output=True, text=True, timeout=30, env=env)
    check(r.returncode == 2 and "lists 2 device" in r.stderr, "launch.sh: -n beyond the mask refused", r.stderr)
    # values the launcher would misread or trip over later (the grace period at SIGTERM; 010 as
    # octal): refused up front, as is an option without its value
    for args, want in ((["-n", "010"], "bad -n '010'"), (["-n", "08"], "bad -n '08'"),
                       (["--grace", "abc"], "bad --grace 'abc'"), (["--grace", "-1"], "bad --grace '-1'"),
                       (["--port"], "--port needs a value")):
        r = subprocess.run([script, "-m", model, "--cpu", "--dry-run", "--bin", bindir, "--logs", logs] + args,
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr and not r.stdout, "launch.sh %s refused" % " ".join(args), r.stderr)
    # a coordinator that fails at start: the launcher says why, from its log
    r = subprocess.run([script, "-m", os.path.join(d, "none.gguf"), "-n", "1", "--cpu", "--bin", bindir, "--logs",
                        os.path.join(d, "logs-bad")], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "coordinator.log:" in r.stderr and "none.gguf" in r.stderr,
          "launch.sh: a failed start quotes the coordinator's log", r.stderr[-400:])
    port = free_port()
    p = subprocess.Popen([script, "-m", model, "-n", "2", "--cpu", "--bin", bindir, "--logs", logs, "--port", str(port),
                          "--", "--max-context", "256", "--max-seqs", "2", "--kv-memory", "8M",
                          "--on-worker-failure", "restart", "--heartbeat-timeout-ms", "1000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = []
    try:
        check(wait_for(lambda: os.path.exists(os.path.join(logs, "port")) or p.poll() is not None, 90, 0.1)
              and p.poll() is None, "launch.sh: server ready")
        procs = descendants(p.pid)
        st, body = post(port, {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
        check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, "launch.sh: generation", body[:200])
        for f in ("coordinator.log", "worker-0.log", "worker-1.log"):
            check(os.path.getsize(os.path.join(logs, f)) > 0, "launch.sh: %s written" % f)
        check("registered" in open(os.path.join(logs, "worker-1.log")).read(), "launch.sh: worker 1 log has its lines")
        # --on-worker-failure restart: a worker killed is started again, and the group serves again
        first = open(os.path.join(logs, "pids")).read().split()
        os.kill(int(first[2]), signal.SIGKILL)
        check(wait_for(lambda: get(port, "/health")[0] != 200, 15, 0.1), "launch.sh: the kill seen (/health 503)")
        again = wait_for(lambda: get(port, "/health")[0] == 200, 90, 0.2)
        now = open(os.path.join(logs, "pids")).read().split()
        check(again and now[0] == first[0] and now[2] != first[2], "launch.sh restart: the worker started again, "
              "the group healthy", (first, now))
        st, body = post(port, {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
        check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, "launch.sh restart: generation",
              body[:200])
        clog = open(os.path.join(logs, "coordinator.log")).read()
        warned = [l for l in clog.splitlines() if "send to worker 1: " in l and "further failures not logged" in l]
        check(len(warned) == 1 and clog.count("send to worker 1: ") <= 2,
              "launch.sh restart: one warning for the sends to the killed worker that failed (not one a heartbeat)",
              [l for l in clog.splitlines() if "send to worker" in l][:6])
        procs = sorted(set(procs) | set(descendants(p.pid)))
        p.send_signal(signal.SIGINT)  # Ctrl-C
        out = p.communicate(timeout=60)[0]
        check(p.returncode == 0, "launch.sh: exit 0 after Ctrl-C", out[-300:])
        check(wait_for(lambda: not any(alive(x) for x in procs), 10), "launch.sh: no orphans",
              [x for x in procs if alive(x)])
        check(len(procs) >= 3, "launch.sh: started 3 processes", procs)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        kill_all([x for x in procs if alive(x)])


def sbatch_env(extra):
    env = dict(os.environ)
    env.update({"PATH": os.path.join(here, "fakeslurm") + ":" + env["PATH"], "SLURM_NTASKS": "2",
                "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "77", "MLASERVE_MODEL": model,
                "MLASERVE_BIN": bindir})
    env.update(extra)
    return env


def case_slurm():
    d = tempfile.mkdtemp(prefix="mla_slurm_")
    script = os.path.join(src, "deploy", "slurm", "mlaserve.sbatch")
    keys = os.path.join(d, "keys")
    check(subprocess.run([exe, "keygen", keys], capture_output=True, timeout=30).returncode == 0, "keygen")
    r = subprocess.run([script], capture_output=True, text=True, timeout=30,
                       env=sbatch_env({"FAKE_SLURM_HOSTS": "gpu-a gpu-b", "MLASERVE_DRY_RUN": "1",
                                       "NCCL_SOCKET_IFNAME": "ib0", "MLASERVE_CURVE_DIR": keys}))
    out = r.stdout
    check(r.returncode == 0 and "coordinator on gpu-a" in out and "--tp 2" in out and "--workers-external" in out
          and "tcp://\\*:29555" in out and "--curve-dir " + keys in out, "sbatch dry run: coordinator command", out)
    check("MLASERVE_COORD=tcp://gpu-a:29555" in out and "--ntasks=2" in out and "--gpus-per-task=1" in out
          and "--export=ALL" in out and "SLURM_PROCID" in out, "sbatch dry run: srun command", out)
    check("unset\\ MLASERVE_API_KEY\\;\\ " in out, "sbatch dry run: each task drops the API key", out)
    check("passed: NCCL_SOCKET_IFNAME=ib0" in out, "sbatch dry run: NCCL_* passed through", out)
    check("--cpus-per-task" not in out, "sbatch dry run: no --cpus-per-task when the job has none", out)
    r = subprocess.run([script], capture_output=True, text=True, timeout=30,
                       env=sbatch_env({"FAKE_SLURM_HOSTS": "gpu-a gpu-b", "MLASERVE_DRY_RUN": "1",
                                       "SLURM_CPUS_PER_TASK": "8", "MLASERVE_CURVE_DIR": keys}))
    check(r.returncode == 0 and "--cpus-per-task=8" in r.stdout,
          "sbatch dry run: srun passes the job's --cpus-per-task (srun does not inherit it)", r.stdout)
    r = subprocess.run([script], capture_output=True, text=True, timeout=30,
                       env=sbatch_env({"FAKE_SLURM_HOSTS": "gpu-a gpu-b", "MLASERVE_DRY_RUN": "1",
                                       "MLASERVE_BACKEND": "cpu", "MLASERVE_CURVE_DIR": keys}))
    check(r.returncode == 0 and "srun" in r.stdout and "--gpus-per-task" not in r.stdout,
          "sbatch dry run: CPU workers ask for no GPU", r.stdout)
    r = subprocess.run([script], capture_output=True, text=True, timeout=30,
                       env=sbatch_env({"MLASERVE_DRY_RUN": "1", "MLASERVE_GRACE": "soon", "MLASERVE_CURVE_DIR": keys}))
    check(r.returncode == 2 and "MLASERVE_GRACE 'soon'" in r.stderr, "sbatch: a bad MLASERVE_GRACE refused", r.stderr)
    # a dry run off a Slurm host (no scontrol on the PATH) names this host
    env = sbatch_env({"MLASERVE_DRY_RUN": "1", "MLASERVE_CURVE_DIR": keys})
    env["PATH"] = os.pathsep.join(x for x in os.environ["PATH"].split(os.pathsep)
                                  if not os.path.exists(os.path.join(x, "scontrol")))
    r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30, env=env)
    check(r.returncode == 0 and "coordinator on %s:" % socket.gethostname() in r.stdout,
          "sbatch dry run without scontrol", r.stdout + r.stderr)
    r = subprocess.run([script], capture_output=True, text=True, timeout=30,
                       env=sbatch_env({"MLASERVE_DRY_RUN": "1"}))
    check(r.returncode == 2 and "MLASERVE_CURVE_DIR" in r.stderr, "sbatch: refuses to run without keys", r.stderr)
    # a real run under the fake srun: every task on this machine, coordinator reached as localhost
    port, cport = free_port(), free_port()
    logs = os.path.join(d, "logs")
    slog = os.path.join(d, "srun.log")
    # the worker binary sits in another folder of a build tree: point MLASERVE_BIN at a folder
    # with both
    both = os.path.join(d, "bin")
    os.mkdir(both)
    os.symlink(os.path.abspath(exe), os.path.join(both, "mlaserve"))
    os.symlink(os.path.abspath(worker), os.path.join(both, "mlaserve-worker"))
    env = sbatch_env({"FAKE_SLURM_HOSTS": "localhost", "MLASERVE_CURVE_DIR": keys, "MLASERVE_BIN": both,
                      "MLASERVE_COORD_PORT": str(cport), "MLASERVE_PORT": str(port), "MLASERVE_LOGS": logs,
                      "FAKE_SLURM_LOG": slog, "MLASERVE_BACKEND": "cpu", "SLURM_CPUS_PER_TASK": "3", "MLASERVE_SERVE_ARGS": "--max-context 256 --max-seqs 2 --kv-memory 8M"})
    p = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    procs = []
    try:
        ok = wait_for(lambda: os.path.exists(os.path.join(logs, "port")) or p.poll() is not None, 90, 0.1)
        check(ok and p.poll() is None, "sbatch under fake srun: server ready",
              open(os.path.join(logs, "coordinator.log")).read()[-500:] if os.path.exists(logs) else "")
        procs = descendants(p.pid)
        st, body = post(port, {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
        check(st == 200, "sbatch under fake srun: generation over tcp + CURVE", body[:200])
        check("ntasks=2" in open(slog).read(), "sbatch: srun asked for one task per GPU")
        check("cpus-per-task=3" in open(slog).read(), "sbatch: srun got --cpus-per-task", open(slog).read())
        for k in range(2):
            txt = open(os.path.join(logs, "worker-%d.log" % k)).read()
            check("rank %d of 2, CURVE" % k in txt, "sbatch: worker %d registered with CURVE" % k, txt[-200:])
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        check(p.returncode == 0, "sbatch: exit 0 after SIGTERM")
        check(wait_for(lambda: not any(alive(x) for x in procs), 15), "sbatch: no orphans",
              [x for x in procs if alive(x)])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        kill_all([x for x in procs if alive(x)])


{"launch": case_launch, "slurm": case_slurm}[case]()
finish()
