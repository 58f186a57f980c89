"""FlowControl: a resume only after a pause, nothing asked of a closing transport."""

from __future__ import annotations

from exporter.tap.flow import FlowControl


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
