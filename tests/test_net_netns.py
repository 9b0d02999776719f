"""Two hosts on one machine: network namespaces joined by a veth pair, with a kernel `tbf`
rate limit, and the WAN proxy adding the delay the kernel cannot (no netem here).

The recipe of docs/NETWORK.md, tested: throughput across the veth is the tbf rate, and through
`wanspec wan-proxy` the round trip gains the set RTT while the rate stays the kernel's. Only
addresses inside the namespaces this module creates are used; they are always deleted.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from wanspec.link import HEADER_BYTES, MSS

pytestmark = pytest.mark.slow

PROBE = str(Path(__file__).with_name("netns_probe.py"))
# namespace names, also the veth ends' (<= 15 chars), unique to this process (a pid has at most
# 7 digits): two test runs or xdist workers never share one. The addresses live inside the
# namespaces, so they may repeat.
TAG = f"ws{os.getpid()}"
CLOUD, EDGE = f"{TAG}c", f"{TAG}e"
CLOUD_IP, EDGE_IP = "10.77.0.1", "10.77.0.2"
UP_RATE = 2e6  # edge→cloud tbf rate, bits/s; tbf counts Ethernet, IP and TCP headers, so
GOODPUT = UP_RATE * MSS / (MSS + HEADER_BYTES + 14)  # the payload rate is ~4% lower
TRANSFER, BURST_MARK = 500_000, 64_000  # bytes sent; the first MARK may ride tbf's burst


def _missing() -> str | None:
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2 is missing ({tool} not found)"
    return None


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


def _in(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *args]


@pytest.fixture(scope="module")
def namespaces() -> Iterator[None]:
    if (reason := _missing()) is not None:
        pytest.skip(reason)
    try:
        try:
            _sh("ip", "netns", "add", CLOUD)
        except subprocess.CalledProcessError as err:
            pytest.skip(f"cannot create a network namespace: {err.stderr.decode().strip()}")
        _sh("ip", "netns", "add", EDGE)
        _sh("ip", "link", "add", CLOUD, "type", "veth", "peer", "name", EDGE)
        for ns, ip in ((CLOUD, CLOUD_IP), (EDGE, EDGE_IP)):
            _sh("ip", "link", "set", ns, "netns", ns)
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", ns, "up")
        # a queue (limit) larger than a transfer: no drops, so no TCP timeouts in the timings
        for ns, rate, burst in ((CLOUD, "10mbit", "32kb"), (EDGE, f"{UP_RATE:.0f}bit", "16kb")):
            qdisc = ["tc", "qdisc", "add", "dev", ns, "root", "tbf", "rate", rate]
            _sh(*_in(ns, *qdisc, "burst", burst, "limit", "1mb"))
        yield
    finally:
        for ns in (CLOUD, EDGE):  # deleting a namespace deletes its veth end, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", CLOUD], capture_output=True, timeout=10)


def _start(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_in(ns, sys.executable, *args), stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> str:
    """The next line the process prints, failing instead of hanging past `timeout_s` (a guard
    only: `wanspec wan-proxy` imports the whole CLI first, 10 s here, more on a loaded machine)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from {proc.args} within {timeout_s} s"
    return proc.stdout.readline()


def _finish(proc: subprocess.Popen[str], timeout_s: float = 15.0) -> dict[str, object]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def _transfer(host: str, port: int, via: tuple[str, int] | None = None) -> float:
    """Bits/s of a TRANSFER-byte upload from the edge to a sink in the cloud (after the burst)."""
    sink = _start(CLOUD, PROBE, "sink", CLOUD_IP, str(port), str(TRANSFER), str(BURST_MARK))
    try:
        _line(sink)
        target = via or (host, port)
        _finish(_start(EDGE, PROBE, "send", target[0], str(target[1]), str(TRANSFER)))
        result = _finish(sink)
    finally:
        sink.kill()
    return 8 * float(result["bytes"]) / float(result["seconds"])


def test_throughput_across_the_veth_is_the_tbf_rate(namespaces: None) -> None:
    rate = _transfer(CLOUD_IP, 7070)
    assert rate == pytest.approx(GOODPUT, rel=0.10)


def test_wan_proxy_in_the_edge_namespace_adds_the_rtt_and_keeps_the_kernel_rate(
    namespaces: None,
) -> None:
    """Edge client → proxy (edge namespace, 40 ms RTT) → veth with tbf → cloud server."""
    args = ["-m", "wanspec.cli", "wan-proxy", "--listen", "127.0.0.1:7071"]
    proxy = _start(EDGE, *args, "--upstream", f"{CLOUD_IP}:7072", "--rtt", "40ms")
    try:
        assert _line(proxy).startswith("wan-proxy listening on 127.0.0.1:7071")
        echo = _start(CLOUD, PROBE, "echo", CLOUD_IP, "7072")
        _line(echo)
        rtts = _finish(_start(EDGE, PROBE, "ping", "127.0.0.1", "7071", "15"))["rtts"]
        _finish(echo)
        rate = _transfer(CLOUD_IP, 7072, via=("127.0.0.1", 7071))  # same port, now a sink
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=10)
    assert proxy.returncode == 0
    assert min(rtts) >= 0.040, rtts
    assert float(np.percentile(rtts, 25)) == pytest.approx(0.040, rel=0.10), rtts
    assert rate == pytest.approx(GOODPUT, rel=0.10)
