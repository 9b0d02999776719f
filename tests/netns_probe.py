"""Tiny TCP endpoints run inside network namespaces by test_net_netns.py (plain sockets, no
wanspec import, so a probe starts fast). Each prints one JSON line with what it measured.

    python netns_probe.py sink HOST PORT NBYTES MARK   # accept once, time bytes MARK..NBYTES
    python netns_probe.py send HOST PORT NBYTES        # connect (retrying), send NBYTES
    python netns_probe.py echo HOST PORT               # accept once, echo until end of stream
    python netns_probe.py ping HOST PORT COUNT         # COUNT round trips of 8 bytes
"""

from __future__ import annotations

import json
import socket
import sys
import time

CONNECT_TRIES_S = 5.0


def _listen(host: str, port: int) -> socket.socket:
    server = socket.create_server((host, port))
    print(json.dumps({"ready": True}), flush=True)
    return server


def _connect(host: str, port: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TRIES_S
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=10)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sink(host: str, port: int, nbytes: int, mark: int) -> dict[str, float]:
    """Bytes MARK..NBYTES and how long they took (the first MARK bytes may ride a burst)."""
    conn, _ = _listen(host, port).accept()
    got, marked_at = 0, None
    while got < nbytes:
        data = conn.recv(1 << 16)
        if not data:
            raise SystemExit(f"sender stopped after {got} of {nbytes} bytes")
        got += len(data)
        if marked_at is None and got >= mark:
            marked_at, marked = time.monotonic(), got
    return {"bytes": got - marked, "seconds": time.monotonic() - marked_at}


def send(host: str, port: int, nbytes: int) -> dict[str, float]:
    with _connect(host, port) as conn:
        conn.sendall(bytes(nbytes))
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the sink's close, so every byte has arrived
    return {"sent": nbytes}


def echo(host: str, port: int) -> dict[str, float]:
    conn, _ = _listen(host, port).accept()
    echoed = 0
    while data := conn.recv(1 << 16):
        conn.sendall(data)
        echoed += len(data)
    return {"echoed": echoed}


def ping(host: str, port: int, count: int) -> dict[str, list[float]]:
    rtts = []
    with _connect(host, port) as conn:
        for k in range(count):
            start = time.monotonic()
            conn.sendall(k.to_bytes(8, "little"))
            back = b""
            while len(back) < 8:
                back += conn.recv(8 - len(back)) or b"!" * 8
            if back != k.to_bytes(8, "little"):
                raise SystemExit(f"ping {k} came back as {back!r}")
            rtts.append(time.monotonic() - start)
    return {"rtts": rtts}


if __name__ == "__main__":
    mode, host, port, *numbers = sys.argv[1:]
    run = {"sink": sink, "send": send, "echo": echo, "ping": ping}[mode]
    print(json.dumps(run(host, int(port), *map(int, numbers))), flush=True)
