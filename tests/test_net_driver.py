"""The asyncio driver with scripted machines over real loopback sockets (no models).

Each scripted machine answers events with actions given by the test; the peer is a raw socket the
test reads and writes frame by frame, so every rule of the driver is checked against real bytes.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nethelpers import run, socket_pair
from wanspec import wire
from wanspec.net.driver import DriverLimits, PeerGone, SendStalled, drive
from wanspec.net.framing import MessageStream, read_message, write_message
from wanspec.protocols.base import (
    Cancel,
    Compute,
    ComputeDone,
    Emit,
    ErrorCode,
    Finish,
    MessageReceived,
    ProtocolError,
    Send,
    Start,
)

Script = Callable[[Any], list[Any]]


class Scripted:
    """A machine whose answer to each event is `script(event)`; it records every event."""

    side = "cloud"

    def __init__(self, script: Script) -> None:
        self.script, self.seen = script, []

    def handle(self, event: Any) -> list[Any]:
        self.seen.append(event)
        return self.script(event)


def _job(seconds: float, log: list[tuple[str, int, float]]) -> Callable[[Any], Any]:
    """A job runner that sleeps `seconds / (job + 1)` and logs when each job starts and ends."""

    def run_job(job: int) -> int:
        log.append(("start", job, time.monotonic()))
        time.sleep(seconds / (job + 1))
        log.append(("end", job, time.monotonic()))
        return job * 10

    return run_job


def test_results_come_back_in_job_order_one_job_at_a_time() -> None:
    """Even on a 4-thread executor, a side's jobs run one by one in the order asked for."""
    log: list[tuple[str, int, float]] = []

    def script(event: Any) -> list[Any]:
        if isinstance(event, Start):
            return [Compute(job, job, "work") for job in range(4)]  # type: ignore[arg-type]
        if isinstance(event, ComputeDone) and event.job_id == 3:
            return [Finish("done")]
        return []

    async def scenario() -> Scripted:
        machine = Scripted(script)
        async with socket_pair() as (_, (sr, sw)):
            pool = ThreadPoolExecutor(4)
            await drive(machine, MessageStream(sr, sw), _job(0.08, log), pool)
            pool.shutdown()
        return machine

    machine = run(scenario())
    done = [(e.job_id, e.result) for e in machine.seen if isinstance(e, ComputeDone)]
    assert done == [(0, 0), (1, 10), (2, 20), (3, 30)]
    stamps = [e.at for e in machine.seen if isinstance(e, ComputeDone)]
    assert stamps == sorted(stamps) and stamps[-1] >= 0.08 * (1 + 1 / 2 + 1 / 3 + 1 / 4)
    starts = [t for what, _, t in log if what == "start"]
    ends = [t for what, _, t in log if what == "end"]
    assert all(end <= nxt for end, nxt in zip(ends, starts[1:], strict=False))  # no overlap


def test_messages_are_handled_while_a_job_runs() -> None:
    """Network I/O overlaps model work: a message arriving mid-job reaches the machine first."""
    started = threading.Event()

    def slow(job: Any) -> str:
        started.set()
        time.sleep(0.4)
        return "logits"

    def script(event: Any) -> list[Any]:
        if isinstance(event, Start):
            return [Compute(0, "job", "verify")]  # type: ignore[arg-type]
        if isinstance(event, ComputeDone):
            return [Finish("done")]
        return []

    async def scenario() -> Scripted:
        machine = Scripted(script)
        async with socket_pair() as ((_, cw), (sr, sw)):
            task = asyncio.create_task(drive(machine, MessageStream(sr, sw), slow))
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
            await write_message(cw, wire.Close("while you compute"))
            await task
        return machine

    kinds = [type(e).__name__ for e in run(scenario()).seen]
    assert kinds == ["Start", "MessageReceived", "ComputeDone"]


def test_a_cancelled_job_never_runs_and_a_running_ones_result_is_dropped() -> None:
    log: list[tuple[str, int, float]] = []

    def script(event: Any) -> list[Any]:
        if isinstance(event, Start):
            jobs = [Compute(job, job, "work") for job in range(3)]  # type: ignore[arg-type]
            return [*jobs, Cancel(2)]
        if isinstance(event, MessageReceived):  # arrives while job 0 runs
            return [Cancel(0)]
        if isinstance(event, ComputeDone):
            return [Finish("done")]
        return []

    async def scenario() -> Scripted:
        machine = Scripted(script)
        async with socket_pair() as ((_, cw), (sr, sw)):
            await write_message(cw, wire.Close("cancel job 0"))
            await drive(machine, MessageStream(sr, sw), _job(0.3, log), ThreadPoolExecutor(1))
        return machine

    machine = run(scenario())
    assert [e.job_id for e in machine.seen if isinstance(e, ComputeDone)] == [1]
    assert {job for what, job, _ in log if what == "start"} == {0, 1}


@pytest.mark.parametrize(
    ("garbage", "code", "words"),
    [
        (b"\x00\xffnot a frame", ErrorCode.PROTOCOL, "bad magic"),
        (bytes([0xA0 | wire.WIRE_VERSION, 37, 0x80, 0x80, 0x80, 0x08]), ErrorCode.LIMIT, "exceeds"),
        (bytes([0xA0 | wire.WIRE_VERSION, 99]), ErrorCode.PROTOCOL, "unknown message type"),
    ],
)
def test_a_malformed_frame_is_answered_with_an_error(garbage: bytes, code: int, words: str) -> None:
    async def scenario() -> tuple[Any, str]:
        machine = Scripted(lambda event: [])
        async with socket_pair() as ((cr, cw), (sr, sw)):
            cw.write(garbage)
            result, _ = await drive(machine, MessageStream(sr, sw), _job(0, []))
            return await read_message(cr), result.finish_reason

    error, reason = run(scenario())
    assert isinstance(error, wire.Error) and error.code == code and words in error.message
    assert reason.startswith("error:") and words in reason


def test_a_silent_peer_hits_the_idle_timeout_but_not_while_this_side_computes() -> None:
    def script(event: Any) -> list[Any]:
        if isinstance(event, Start):
            return [Compute(0, "job", "verify")]  # type: ignore[arg-type]
        if isinstance(event, ComputeDone):
            return [Emit((1,))]  # then wait for the peer, which never speaks
        return []

    async def scenario() -> tuple[Any, Any, float]:
        limits = DriverLimits(idle_timeout_s=0.3)
        async with socket_pair() as ((cr, _), (sr, sw)):
            began = time.monotonic()
            stream = MessageStream(sr, sw)
            result, _ = await drive(
                Scripted(script), stream, lambda job: time.sleep(0.6), limits=limits
            )
            return result, await read_message(cr), time.monotonic() - began

    result, error, took = run(scenario())
    assert result.tokens == [1]  # the 0.6 s job outlived the 0.3 s idle timeout unharmed
    assert error.code == ErrorCode.LIMIT and "no message from the peer for 0.3 s" in error.message
    assert 0.85 <= took < 3.0


def test_a_peer_sending_without_waiting_for_answers_is_cut_off() -> None:
    async def scenario() -> Any:
        limits = DriverLimits(max_unanswered=5)
        async with socket_pair() as ((cr, cw), (sr, sw)):
            for i in range(8):
                await write_message(cw, wire.Close(f"flood {i}"))
            await drive(Scripted(lambda e: []), MessageStream(sr, sw), _job(0, []), limits=limits)
            return await read_message(cr)

    error = run(scenario())
    assert error.code == ErrorCode.LIMIT and "more than 5 messages" in error.message


@pytest.mark.parametrize("raiser", ["inspect", "machine"])
def test_a_protocol_error_outside_a_machines_policy_reaches_the_peer_with_its_code(
    raiser: str,
) -> None:
    """One raised by `inspect`, or let out of `handle` by a machine that keeps no error policy,
    ends the run as the driver's own do: its Error frame, and its finish reason here."""
    refusal = ProtocolError("temperature=-1 is refused here", ErrorCode.BAD_SETTINGS)

    def refuse(event_or_msg: Any) -> list[Any]:
        if isinstance(event_or_msg, Start):
            return []
        raise refusal  # at the peer's message

    async def scenario() -> tuple[Any, str]:
        machine = Scripted(refuse if raiser == "machine" else lambda event: [])
        inspect = refuse if raiser == "inspect" else None
        async with socket_pair() as ((cr, cw), (sr, sw)):
            await write_message(cw, wire.StartRequest(0, "hi", {"temperature": -1}))
            stream = MessageStream(sr, sw)
            result, _ = await drive(machine, stream, _job(0, []), inspect=inspect)
            return await read_message(cr), result.finish_reason

    error, reason = run(scenario())
    assert error == wire.Error(int(ErrorCode.BAD_SETTINGS), "temperature=-1 is refused here")
    assert reason == "error: temperature=-1 is refused here"


def test_a_peer_that_never_reads_stalls_the_send_with_bounded_buffering() -> None:
    """Back-pressure: the driver waits for the drain, so the transport holds at most its
    high-water mark plus one frame, and gives up after the write timeout."""
    big = wire.Error(1, "x" * 60_000)  # one 60 kB frame

    def script(event: Any) -> list[Any]:
        return [Send(big) for _ in range(2000)] if isinstance(event, Start) else []

    async def scenario() -> tuple[float, MessageStream]:
        accepted: asyncio.Queue[Any] = asyncio.Queue()
        server = await asyncio.start_server(lambda r, w: accepted.put_nowait((r, w)), "127.0.0.1")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(server.sockets[0].getsockname())
        _, cw = await asyncio.open_connection(sock=sock)  # never reads
        sr, sw = await accepted.get()
        sw.transport.set_write_buffer_limits(high=16 << 10)
        stream = MessageStream(sr, sw)
        began = time.monotonic()
        with pytest.raises(SendStalled, match=r"read nothing for 0\.5 s"):
            limits = DriverLimits(write_timeout_s=0.5)
            await drive(Scripted(script), stream, _job(0, []), limits=limits)
        took = time.monotonic() - began
        sw.transport.abort()
        cw.close()
        server.close()
        return took, stream

    took, stream = run(scenario())
    frame = len(wire.encode(big))
    assert stream.sent.messages < 200  # the kernel buffers took a few, then nothing more
    assert 0 < stream.sent.peak_buffered_bytes <= (16 << 10) + frame
    assert 0.5 <= took < 5.0


def test_a_vanished_peer_ends_the_run_with_peer_gone() -> None:
    async def scenario() -> None:
        machine = Scripted(lambda e: [])
        async with socket_pair() as ((_, cw), (sr, sw)):
            cw.transport.abort()
            with pytest.raises(PeerGone):
                await drive(machine, MessageStream(sr, sw), _job(0, []))

    run(scenario())


def test_the_peers_error_frame_is_reported() -> None:
    def script(event: Any) -> list[Any]:
        if isinstance(event, MessageReceived) and isinstance(event.msg, wire.Error):
            return [Finish(f"error: peer says {event.msg.message}")]
        return []

    async def scenario() -> Any:
        async with socket_pair() as ((_, cw), (sr, sw)):
            await write_message(cw, wire.Error(int(ErrorCode.BUSY), "busy"))
            return await drive(Scripted(script), MessageStream(sr, sw), _job(0, []))

    result, peer_error = run(scenario())
    assert peer_error == wire.Error(int(ErrorCode.BUSY), "busy")
    assert result.finish_reason == "error: peer says busy"


def test_a_half_closed_peer_still_gets_the_answer_to_its_last_message() -> None:
    """A clean end of stream only means the peer sends no more: the work it asked for is done
    and sent; the peer is gone only once the machine would wait for it."""

    def script(event: Any) -> list[Any]:
        if isinstance(event, MessageReceived):
            return [Compute(0, "job", "verify")]  # type: ignore[arg-type]
        if isinstance(event, ComputeDone):
            return [Send(wire.Tokens((7,), finished=True))]  # then waits for more: none comes
        return []

    async def scenario() -> Any:
        async with socket_pair() as ((cr, cw), (sr, sw)):
            await write_message(cw, wire.Close("last words"))
            cw.write_eof()
            with pytest.raises(PeerGone, match="closed the connection"):
                await drive(Scripted(script), MessageStream(sr, sw), lambda job: time.sleep(0.2))
            return await read_message(cr)

    assert run(scenario()) == wire.Tokens((7,), finished=True)
