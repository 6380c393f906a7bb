"""Helpers for the gRPC API tests: start `mlaserve serve` on the tiny-deepseek3 fixture, the
Python gRPC stubs generated from proto/api.proto, /metrics."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mlatest  # noqa: E402

def fixture_paths(fixtures):
    model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
    ref = os.path.join(fixtures, "tiny-deepseek3", "ref.json")
    if not os.path.exists(model) or not os.path.exists(ref):
        print("fixture missing: skipped")
        sys.exit(77)
    return model, json.load(open(ref))


class Server(mlatest.ServeProcess):
    """`mlaserve serve` at --tp N with the HTTP and gRPC ports on 127.0.0.1."""

    def __init__(self, exe, worker, model, tp=2, extra=(), port=0, proto_port=0, timeout=120, env=None):
        # sanitizer builds on a loaded 2-core machine: a worker busy in a long step must not be
        # taken for dead (the default heartbeat timeout is 1 s)
        super().__init__([exe, "serve", "-m", model, "--tp", str(tp), "--port", str(port),
                          "--proto-port", str(proto_port), "--heartbeat-timeout-ms", "20000"], extra,
                         worker=worker, env=env, proto=True, timeout=timeout, prefix="pbapi_")

    def stop(self):
        return super().stop(timeout=60, killed_rc=-999)


# ---- gRPC stubs, generated from proto/*.proto with grpcio-tools (PyPI) ----

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")


def stubs(proto_dir=PROTO_DIR):
    """(api_pb2, api_pb2_grpc, grpc) generated now from proto/api.proto (exit 77 without grpcio-tools)."""
    try:
        import grpc
        from grpc_tools import protoc
    except ImportError:
        print("grpcio-tools missing (scripts/install-deps.sh --test): skipped")
        sys.exit(77)
    out = tempfile.mkdtemp(prefix="mla_grpc_stubs_")
    inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", "-I" + proto_dir, "-I" + inc, "--python_out=" + out, "--grpc_python_out=" + out,
                      os.path.join(proto_dir, "api.proto")])
    if rc != 0:
        raise RuntimeError("protoc failed on %s/api.proto" % proto_dir)
    sys.path.insert(0, out)
    import api_pb2
    import api_pb2_grpc
    return api_pb2, api_pb2_grpc, grpc


def metrics(port):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, v = line.rsplit(" ", 1)
        vals[name] = float(v)
    return vals


def metric(vals, prefix, **labels):
    """Sum of the series whose name starts with prefix and whose labels include labels."""
    tot = 0.0
    for k, v in vals.items():
        base = k.split("{")[0]
        if base != prefix:
            continue
        if all(('%s="%s"' % (a, b)) in k for a, b in labels.items()):
            tot += v
    return tot
