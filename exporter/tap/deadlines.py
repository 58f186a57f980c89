"""How long the tap waits for the engine, derived from the objectives it measures.

Without a deadline a hung engine never ends a request: clients give up one by one and, if
the tap counted that as the client's choice, every SLI would stay quiet through the outage.
The tap therefore ends a timed request itself (outcome `upstream_timeout`, bad for every SLI)
when the engine keeps it waiting far beyond any objective:

- first token: a streamed completion has produced no output event;
- stall: a timed response makes no progress: a stream sends no further output event, a
  non-streamed body fewer than BODY_PROGRESS_BYTES more bytes;
- response: any other request (not streamed, or not a completion) has no response head; a
  non-streamed completion has not ended.

Deadlines measure progress, not bytes. A keep-alive proves the connection, not the engine: TGI
sends an SSE comment every 15 s, so an engine hung after its first token would otherwise look
alive for ever. After the first token only an event that carries output (as exporter.tap.timing
counts them for TPOT) moves a stream's stall deadline; comments, blank lines, role- or
finish-only events and an event still arriving byte by byte do not. Once a stream's answer is whole (its
`[DONE]`, or its final finish_reason, came), no deadline fails it: the request is judged by its answer,
timed to the answer's end, and a transport held open after it is ended within ANSWERED_GRACE_S. Output events, rather than any
complete `data:` event: every token the engine makes for the user is one, and an engine that sends
only empty events for longer than the stall deadline (10x the TPOT objective, 30 s at least) is
failing its users either way. A non-streamed body has no events, so it must grow by
BODY_PROGRESS_BYTES within every stall deadline (about 136 B/s at the 30 s floor; engines write
such a body at megabytes a second, in one go), and end within the response deadline of its
arrival: whitespace dribbled at any rate cannot hold it for ever.

Defaults: FLOOR seconds, or MULTIPLE times the largest objective of that kind configured in
the SLO files, whichever is longer. Long enough that the tap does not become a stricter
timeout than the clients' own for any healthy request (a 10x miss of an objective is an
outage already, counted as bad by the latency SLIs either way); short enough that a hang
turns into bad events within a minute, inside the fastest page windows. A deadline set by
flag shorter than the objective it guards is refused: it would cut requests that were still
on time and call them the engine's failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.logs import event
from exporter.tap.classes import SloConfig

MULTIPLE = 10.0
FIRST_TOKEN_FLOOR_S = 60.0
STALL_FLOOR_S = 30.0
RESPONSE_FLOOR_S = 600.0
# How much a non-streamed body must grow within each stall deadline to count as progress.
BODY_PROGRESS_BYTES = 4096
# How long a stream whose answer is whole ([DONE], or the final finish_reason of a one-choice answer) may keep
# its connection open before the tap ends the response itself (the stall deadline, if shorter). Engines send the
# end of the body with [DONE], and the usage event and [DONE] just after the last finish_reason.
ANSWERED_GRACE_S = 2.0


class DeadlineError(ValueError):
    """A deadline flag shorter than an objective it must never cut; the message names both and the fix."""


@dataclass(frozen=True)
class Deadlines:
    first_token_s: float
    stall_s: float
    response_s: float


def _largest(values: tuple[float, ...]) -> float:
    return max(values, default=0.0)


def derive_deadlines(
    slo: SloConfig, first_token_s: float | None = None, stall_s: float | None = None, response_s: float | None = None
) -> Deadlines:
    """The deadlines to use: the flags' values where given (checked), else derived from `slo`."""
    ttft = _largest(slo.thresholds.get("ttft", ()))
    tpot = _largest(slo.thresholds.get("tpot", ()))
    e2e = _largest(slo.thresholds.get("e2e", ()))
    checks = (
        ("--first-token-timeout", first_token_s, ttft, "the largest TTFT objective", FIRST_TOKEN_FLOOR_S),
        ("--stall-timeout", stall_s, tpot, "the largest TPOT objective", STALL_FLOOR_S),
        ("--response-timeout", response_s, max(ttft, e2e), "the largest TTFT or E2E objective", RESPONSE_FLOOR_S),
    )
    out: list[float] = []
    for flag, given, objective, what, floor in checks:
        if given is None:
            out.append(max(floor, MULTIPLE * objective))
            continue
        if not given > 0:
            raise DeadlineError(f"{flag} {given}: must be more than 0 seconds")
        if given <= objective:
            raise DeadlineError(
                f"{flag} {given}: not longer than {what} ({objective:g} s) in the SLO files, so it would cut requests "
                f"that are still on time; set it above {objective:g} s, or leave it out for the default "
                f"({max(floor, MULTIPLE * objective):g} s)"
            )
        out.append(float(given))
    return Deadlines(*out)


def log_derived(slo: SloConfig, deadlines: Deadlines, logger: str) -> None:
    """One `tap_slo_class` line per class at start: its objectives and the deadlines the tap derived, so a
    threshold in the wrong unit (a TTFT of 500 s, a 5000 s first-token deadline) shows on the first line."""
    def text(values: tuple[float, ...]) -> str:
        return ",".join(f"{v:g}" for v in values) or "none"

    for cls in slo.classes:
        event("tap_slo_class", logger=logger, slo_class=cls.name,
              ttft_s="none" if cls.ttft is None else f"{cls.ttft:g}",
              tpot_s="none" if cls.tpot is None else f"{cls.tpot:g}", models=",".join(cls.models) or "*",
              first_token_deadline_s=f"{deadlines.first_token_s:g}", stall_deadline_s=f"{deadlines.stall_s:g}",
              response_deadline_s=f"{deadlines.response_s:g}", ttft_edges_s=text(slo.thresholds.get("ttft", ())),
              tpot_edges_s=text(slo.thresholds.get("tpot", ())), e2e_edges_s=text(slo.thresholds.get("e2e", ())),
              origin=cls.origin)
