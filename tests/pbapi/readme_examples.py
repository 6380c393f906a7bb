"""The API examples of docs/api.md ("HTTP API" and "gRPC API") work as printed: every ```sh block of
those sections runs with bash (-e -o pipefail) in a folder where build/ is this build and models/
holds the bundled model, with PORT / PROTO_PORT set (8080 / 8081 when free, else free ports:
the examples read ${PORT:-8080}). The block that starts `mlaserve serve` runs in the background
until the others are done. Answers are checked against the fixture's reference (ref.json)
where the example's prompt is a reference prompt.
Usage: readme_examples.py README BUILD_DIR MODELS_DIR FIXTURES_DIR. Exit 77 when the fixture is missing."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import FAILS, check, summary  # noqa: E402

readme, build_dir, models_dir, fixtures = sys.argv[1:5]
ref_path = os.path.join(fixtures, "tiny-deepseek3", "ref.json")
if not os.path.exists(ref_path):
    print("fixture missing: skipped")
    sys.exit(77)
ref = json.load(open(ref_path))
EOS_TEXT = "<｜end▁of▁sentence｜>"


def sections(text, names):
    out, cur = [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            cur = line[3:].strip() if line[3:].strip() in names else None
            continue
        if cur:
            out.append(line)
    return "".join(out)


def free_port(prefer):
    for port in (prefer, 0):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
    raise SystemExit("no free port")


text = open(readme, encoding="utf-8").read()
body = sections(text, {"HTTP API", "gRPC API"})
blocks = re.findall(r"```sh\n(.*?)```", body, re.S)
check(len(blocks) >= 6, "the sections have their sh examples (%d)" % len(blocks))
serve_blocks = [b for b in blocks if "mlaserve serve" in b]
check(len(serve_blocks) == 1, "one block starts the server")
if FAILS:
    sys.exit(1)

work = tempfile.mkdtemp(prefix="readme_")
os.symlink(os.path.abspath(build_dir), os.path.join(work, "build"))
model_file = "tiny-deepseek3-bf16.gguf"
if os.path.exists(os.path.join(models_dir, model_file)):
    os.symlink(os.path.abspath(models_dir), os.path.join(work, "models"))
else:  # the bundled copy is the fixture file
    os.mkdir(os.path.join(work, "models"))
    os.symlink(os.path.join(fixtures, "tiny-deepseek3", model_file), os.path.join(work, "models", model_file))
env = dict(os.environ)
env.pop("MLASERVE_API_KEY", None)
env["PORT"] = str(free_port(8080))
env["PROTO_PORT"] = str(free_port(8081))
port = int(env["PORT"])
log = open(os.path.join(work, "serve.log"), "w+")
srv = subprocess.Popen(["bash", "-c", "exec " + serve_blocks[0].replace("\\\n", " ").strip()
                        # sanitizer builds: long steps are not a dead worker
                        + " --heartbeat-timeout-ms 20000"], cwd=work, env=env,
                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def health_ok():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        c.close()
        return r.status == 200
    except OSError:
        return False


def by_prompt(prompt):
    for p in ref["prompts"]:
        if p["text"] == prompt:
            return p
    return None


def by_chat(content):
    for p in ref["prompts"]:
        if "<｜User｜>%s<｜Assistant｜>" % content in p["text"]:
            return p
    return None


try:
    deadline = time.time() + 120
    while not health_ok():
        if srv.poll() is not None or time.time() > deadline:
            log.seek(0)
            print(log.read()[-3000:])
            raise SystemExit("the README's server did not come up")
        time.sleep(0.2)
    for b in blocks:
        if b in serve_blocks:
            continue
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b], cwd=work, env=env, capture_output=True,
                           timeout=120)
        out = r.stdout.decode("utf-8", "replace")
        check(r.returncode == 0 and out.strip(), "example ran: %s -> rc %d %r %r" %
              (b.strip()[:80], r.returncode, out[:200], r.stderr[:300]))
        m = re.search(r"-d '(\{.*\})'", b, re.S)
        req = json.loads(m.group(1)) if m else {}
        try:
            j = json.loads(out) if not req.get("stream") else {}
        except ValueError:
            j = {}
        if "choices" in j and "prompt" in req and by_prompt(req["prompt"]):
            p = by_prompt(req["prompt"])
            got = j["choices"][0]["text"]
            full = req["max_tokens"] >= len(p["greedy"])
            check(got == p["greedy_text"] if full else (got and p["greedy_text"].startswith(got)),
                  "README completion answer %r" % got)
        if j.get("type") == "message" and "messages" in req and by_chat(req["messages"][-1]["content"]):
            p = by_chat(req["messages"][-1]["content"])
            texts = [c["text"] for c in j["content"] if c["type"] == "text"]
            check(j["stop_reason"] == "end_turn" and texts == [p["greedy_text"].replace(EOS_TEXT, "")],
                  "README Messages answer %r" % texts)
        if "choices" in j and "messages" in req and by_chat(req["messages"][-1]["content"]):
            p = by_chat(req["messages"][-1]["content"])
            check(j["choices"][0]["message"]["content"] == p["greedy_text"].replace(EOS_TEXT, ""),
                  "README chat answer %r" % j["choices"][0]["message"]["content"])
        if j.get("object") == "response" and isinstance(req.get("input"), str) and by_chat(req["input"]):
            p = by_chat(req["input"])
            texts = [c["text"] for it in j["output"] if it["type"] == "message" for c in it["content"]]
            check(j["status"] == "completed" and texts == [p["greedy_text"].replace(EOS_TEXT, "")],
                  "README Responses answer %r" % texts)
        if req.get("stream"):
            check(out.rstrip().endswith("data: [DONE]"), "README stream ends with [DONE]")
            p = by_prompt(req["prompt"])
            txt = "".join(json.loads(e[6:])["choices"][0]["text"] for e in out.split("\n\n")
                          if e.startswith("data: {"))
            check(p is not None and p["greedy_text"].startswith(txt) and txt, "README stream text %r" % txt)
        if "mlaserve client" in b:
            lines = out.splitlines()
            for cm in re.finditer(r'generate -p "([^"]*)"', b):
                p = by_prompt(cm.group(1))
                check(p is not None and p["greedy_text"] in lines, "client generate answer in %r" % lines)
            for cm in re.finditer(r'tokenize "([^"]*)"', b):
                p = by_prompt(cm.group(1))
                check(p is not None and " ".join(map(str, p["tokens"])) in lines, "client tokenize ids in %r" % lines)
            for cm in re.finditer(r'generate --chat -p "([^"]*)"', b):
                p = by_chat(cm.group(1))
                check(p is not None and p["greedy_text"].replace(EOS_TEXT, "") in lines, "client chat answer")
            check("ok" in lines, "client health")
finally:
    if srv.poll() is None:
        os.killpg(srv.pid, signal.SIGTERM)
        try:
            rc = srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            rc = srv.wait()
        check(rc == 0, "the README's server exits cleanly (%r)" % rc)
    if FAILS:
        log.seek(0)
        print(log.read()[-3000:])
sys.exit(summary())
