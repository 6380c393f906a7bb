"""Limits of the protobuf port (issue 36 item 2) on a real `mlaserve serve` with the tiny-deepseek3
fixture: idle connections are closed, a frame not completed in time gets BAD_FRAME, frames
before a Hello with the key are small (FRAME_TOO_LARGE at once, nothing buffered), large frames
work after the Hello, a wrong per-request key ends the connection, and many idle connections
do not lock other clients out for good.
Usage: test_pb_limits.py MLASERVE_EXE WORKER_EXE FIXTURES_DIR. Exit 77 when the fixture is missing."""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbutil as pb  # noqa: E402
from mlatest import FAILS, check, summary  # noqa: E402,F401

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
model, ref = pb.fixture_paths(fixtures)
KEY = "k3y"


def header(kind, payload_len):
    return struct.pack(">IB", payload_len + 1, (pb.VERSION << 4) | kind)


def error_of(c):
    k, f = c.read_frame()
    while k == pb.K_HELLO_REPLY:
        k, f = c.read_frame()
    return k, f.get(2, [0])[0] if k == pb.K_ERROR else None


srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "256", "--api-key", KEY,
                                                 "--idle-timeout-ms", "1500", "--request-timeout-ms", "1500",
                                                 "--max-conns", "8"])
try:
    P = srv.proto_port
    # an idle connection is closed after the idle timeout
    c = pb.Conn(P, timeout=10)
    t0 = time.time()
    check(c.closed_after(6), "idle connection closed (%.1fs)" % (time.time() - t0))
    c.close()
    # a frame that never completes: BAD_FRAME after the frame timeout
    c = pb.Conn(P, timeout=10)
    c.send(header(pb.K_HEALTH, 1000) + b"\x08\x01")
    t0 = time.time()
    try:
        k, code = error_of(c)
        check(k == pb.K_ERROR and code == pb.E["BAD_FRAME"] and time.time() - t0 < 5,
              "partial frame: BAD_FRAME in %.1fs (kind %r code %r)" % (time.time() - t0, k, code))
        check(c.closed_after(5), "partial frame: connection closed")
    except (EOFError, OSError) as e:
        check(False, "partial frame: %r" % e)
    c.close()
    # before authentication: a frame over 64 KiB is refused from its header, at once
    c = pb.Conn(P, timeout=10)
    c.send(header(pb.K_TOKENIZE, 200000))
    t0 = time.time()
    try:
        k, code = error_of(c)
        check(k == pb.K_ERROR and code == pb.E["FRAME_TOO_LARGE"] and time.time() - t0 < 1,
              "200 KB frame before the Hello: FRAME_TOO_LARGE at once (%r %r)" % (k, code))
    except (EOFError, OSError) as e:
        check(False, "pre-auth frame: %r" % e)
    c.close()
    # after a Hello with the key: the same frame is fine
    c = pb.Conn(P, timeout=30)
    c.send(pb.frame(pb.K_HELLO, pb.f_varint(1, 1) + pb.f_bytes(2, KEY)))
    k, f = c.read_frame()
    check(k == pb.K_HELLO_REPLY, "Hello with the key")
    text = "hello world " * 16000
    c.send(pb.frame(pb.K_TOKENIZE, pb.f_varint(1, 7) + pb.f_bytes(3, text) + pb.f_varint(5, 0)))
    k, f = c.read_frame()
    check(k == pb.K_TOK_RESP and f[1][0] == 7 and len(pb.packed_ints(f[2][0])) > 16000,
          "192 KB Tokenize after the Hello (kind %d)" % k)
    c.close()
    # a wrong per-request key: the error, then the connection ends
    c = pb.Conn(P, timeout=10)
    c.send(pb.frame(pb.K_MODELS, pb.f_varint(1, 5) + pb.f_bytes(2, "nope")) +
           pb.frame(pb.K_MODELS, pb.f_varint(1, 6) + pb.f_bytes(2, "nope2")))
    k, f = c.read_frame()
    check(k == pb.K_ERROR and f[1][0] == 5 and f[2][0] == pb.E["UNAUTHENTICATED"], "wrong per-request key")
    check(c.closed_after(5), "a wrong key ends the connection")
    c.close()
    # 60 idle connections (beyond --max-conns 8: the older ones make room) are all gone after
    # the idle timeout; then clients are served
    socks = [socket.create_connection(("127.0.0.1", P), timeout=10) for _ in range(60)]
    time.sleep(4)
    closed = 0
    for s in socks:
        s.settimeout(0.2)
        try:
            closed += s.recv(10) == b""
        except (socket.timeout, ConnectionResetError):
            pass
        s.close()
    check(closed == 60, "idle connections closed (%d of 60)" % closed)
    c = pb.Conn(P, timeout=10)
    c.send(pb.frame(pb.K_HEALTH, pb.f_varint(1, 9)))
    k, f = c.read_frame()
    check(k == pb.K_HEALTH_RESP, "served after the idle connections")
    c.close()
    # --max-conns 8: 8 idle connections make room for a 9th client at once
    socks = [socket.create_connection(("127.0.0.1", P), timeout=10) for _ in range(8)]
    time.sleep(0.2)
    c = pb.Conn(P, timeout=10)
    c.send(pb.frame(pb.K_HEALTH, pb.f_varint(1, 10)))
    k, f = c.read_frame()
    check(k == pb.K_HEALTH_RESP, "a 9th client is served while 8 idle connections are open (kind %d)" % k)
    c.close()
    for s in socks:
        s.close()
    # ... but 8 connections inside a frame are kept: the 9th gets UNAVAILABLE
    socks = [socket.create_connection(("127.0.0.1", P), timeout=10) for _ in range(8)]
    for s in socks:
        s.sendall(header(pb.K_HEALTH, 100))
    time.sleep(0.2)
    c = pb.Conn(P, timeout=10)
    try:
        k, code = error_of(c)
        check(k == pb.K_ERROR and code == pb.E["UNAVAILABLE"], "all connections busy: UNAVAILABLE (%r %r)" % (k, code))
    except (EOFError, OSError) as e:
        check(False, "all connections busy: %r" % e)
    c.close()
    for s in socks:
        s.close()
finally:
    rc = srv.stop()
    check(rc == 0, "clean exit %r" % rc)
    if FAILS:
        print(srv.tail())

sys.exit(summary())
