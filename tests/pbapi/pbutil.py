"""Helpers for the protobuf API tests: start `mlaserve serve` on the tiny-deepseek3 fixture,
and a minimal independent protobuf wire encoder/decoder (written from the protobuf encoding
spec, not from our C code) to build valid and malformed frames by hand."""
import json
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mlatest  # noqa: E402

VERSION = 1
K_HELLO, K_GENERATE, K_TOKENIZE, K_HEALTH, K_MODELS, K_CANCEL = 1, 2, 3, 4, 5, 6
K_HELLO_REPLY, K_GEN_RESP, K_TOK_RESP, K_HEALTH_RESP, K_MODELS_RESP, K_ERROR = 8, 9, 10, 11, 12, 15
# ErrorCode values (proto/api.proto)
E = dict(BAD_FRAME=1, FRAME_TOO_LARGE=2, BAD_PROTOBUF=3, UNKNOWN_KIND=4, INVALID_FIELD=5, INVALID_REQUEST=6,
         UNAUTHENTICATED=7, NOT_FOUND=8, RESOURCE_EXHAUSTED=9, UNAVAILABLE=10, INTERNAL=11, CANCELLED=12,
         DUPLICATE_ID=13)


def fixture_paths(fixtures):
    model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
    ref = os.path.join(fixtures, "tiny-deepseek3", "ref.json")
    if not os.path.exists(model) or not os.path.exists(ref):
        print("fixture missing: skipped")
        sys.exit(77)
    return model, json.load(open(ref))


class Server(mlatest.ServeProcess):
    """`mlaserve serve` at --tp N with the HTTP and protobuf ports on 127.0.0.1."""

    def __init__(self, exe, worker, model, tp=2, extra=(), port=0, proto_port=0, timeout=120):
        # sanitizer builds on a loaded 2-core machine: a worker busy in a long step must not be
        # taken for dead (the default heartbeat timeout is 1 s)
        super().__init__([exe, "serve", "-m", model, "--tp", str(tp), "--port", str(port),
                          "--proto-port", str(proto_port), "--heartbeat-timeout-ms", "20000"], extra,
                         worker=worker, proto=True, timeout=timeout, prefix="pbapi_")

    def stop(self):
        return super().stop(timeout=60, killed_rc=-999)


# ---- protobuf wire format ----

def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3 | 0) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def f_float(num, x):
    return varint(num << 3 | 5) + struct.pack("<f", x)


def f_packed(num, ints):
    body = b"".join(varint(i) for i in ints)
    return f_bytes(num, body)


def decode(buf):
    """Message bytes -> {field: [values]} (varint: int, 64-bit: bytes, len: bytes, 32-bit: bytes)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _rv(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _rv(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _rv(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def _rv(buf, i):
    v, s = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return v, i


def as_float(b):
    return struct.unpack("<f", b)[0]


def packed_ints(b):
    out, i = [], 0
    while i < len(b):
        v, i = _rv(b, i)
        if v >= 1 << 63:
            v -= 1 << 64
        out.append(v)
    return out


def frame(kind, payload, version=VERSION):
    return struct.pack(">IB", len(payload) + 1, (version << 4) | kind) + payload


def generate_msg(rid, prompt=None, max_tokens=None, temperature=None, ignore_eos=None, ids=None, logprobs=None):
    m = f_varint(1, rid) if rid is not None else b""
    if prompt is not None:
        m += f_bytes(4, prompt)
    if ids is not None:
        m += f_packed(5, ids)
    if max_tokens is not None:
        m += f_varint(8, max_tokens)
    if temperature is not None:
        m += f_float(9, temperature)
    if ignore_eos:
        m += f_varint(19, 1)
    if logprobs:
        m += f_varint(21, 1)
    return m


class Conn:
    def __init__(self, port, timeout=60):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def _need(self, n):
        while len(self.buf) < n:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("closed")
            self.buf += d

    def read_frame(self):
        """(kind, fields) of the next frame; EOFError when the server closed."""
        self._need(5)
        ln, ty = struct.unpack(">IB", self.buf[:5])
        self._need(4 + ln)
        payload = self.buf[5:4 + ln]
        self.buf = self.buf[4 + ln:]
        assert ty >> 4 == VERSION, "version nibble %x" % ty
        return ty & 15, decode(payload)

    def closed_after(self, timeout=10):
        """True when the server closes the connection (EOF) within timeout (reading the rest)."""
        self.s.settimeout(timeout)
        try:
            while True:
                d = self.s.recv(65536)
                if not d:
                    return True
        except (socket.timeout, ConnectionResetError):
            return False

    def close(self):
        self.s.close()


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
