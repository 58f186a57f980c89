"""FlowControl: a resume only after a pause, nothing asked of a closing transport; the client and the upstream side
alike."""

from __future__ import annotations

from exporter.tap.flow import FlowControl
from exporter.tap.upstream import UpstreamConnection, UpstreamPool


class Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def test_pause_and_resume_once_each() -> None:
    t = Transport()
    flow = FlowControl(t)  # type: ignore[arg-type]
    flow.resume_reading()
    flow.pause_reading()
    flow.pause_reading()
    assert flow.read_paused
    flow.resume_reading()
    flow.resume_reading()
    assert t.calls == ["pause", "resume"] and not flow.read_paused


def test_closing_transport_is_left_alone() -> None:
    t = Transport()
    flow = FlowControl(t)  # type: ignore[arg-type]
    flow.pause_reading()
    t.closing = True
    flow.resume_reading()
    flow.pause_reading()
    assert t.calls == ["pause"]


class UpstreamTransport(Transport):
    def close(self) -> None:
        self.calls.append("close")


def test_the_upstream_side_pauses_and_resumes_through_the_same_flow_control() -> None:
    """A slow client pauses reading from the engine once, however often it fills; the pool resumes a paused
    connection when it takes it back, and leaves a running one alone."""
    pool = UpstreamPool("http://engine:8000", 1.0)
    conn = UpstreamConnection(pool)
    t = UpstreamTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    assert isinstance(conn.flow, FlowControl)
    conn.flow.pause_reading()
    conn.flow.pause_reading()
    pool.release(conn, reusable=True)
    assert t.calls == ["pause", "resume"] and not conn.flow.read_paused
    conn2 = pool.take_idle()
    assert conn2 is conn
    pool.release(conn, reusable=True)
    assert t.calls == ["pause", "resume"]  # never paused this time: no resume sent
    conn.pause_writing()
    assert conn.flow.write_paused
    conn.resume_writing()
    assert not conn.flow.write_paused
