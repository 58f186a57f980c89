"""What the tap does with a timed response body as it flows past: time it, and take out what it added.

A relay is fed the decoded body bytes of each read from the upstream, with the time the read
completed, and returns what the client should get for it: None for "these bytes, unchanged"
(the common case, which lets the connection relay the upstream's own framing untouched), or
replacement bytes when the injected usage event had to be held back or taken out. `finish`
returns whatever is still held when the body ends.
"""

from __future__ import annotations

import json
import logging
import re

from exporter.logs import TAP_LOGGER, event
from exporter.tap.sse import EventTooLarge, SseSplitter
from exporter.tap.timing import (
    RequestTiming,
    carries_output,
    completion_tokens,
    has_finish_reason,
    is_usage_only,
    prompt_tokens,
)

MAX_PARSED_RESPONSE_BYTES = 8 * 1024 * 1024  # a non-streamed body larger than this is not kept whole to parse
TAIL_BYTES = 64 * 1024  # of a larger body, what is kept to find its usage (engines write it last)
_COMPLETION_TOKENS = re.compile(rb'"usage"\s*:\s*\{[^{}]*"completion_tokens"\s*:\s*(\d+)')
_DONE = b"[DONE]"
_USAGE_KEY = b'"usage"'
_ERROR_KEY = b'"error"'
_FINISH_KEYS = (b'"finish_reason":"', b'"finish_reason": "')  # a finish_reason that is a string, not null


class SseRelay:
    """A streamed completion: each event timed as the read that completes it arrives.

    Without `strip`, every read goes out as it came. With `strip` (the tap injected
    `include_usage`), only complete events go out, minus the injected usage event and the
    `"usage":null` members the injection added.
    """

    __slots__ = ("timing", "strip", "error_event", "_splitter")

    def __init__(self, timing: RequestTiming, strip: bool) -> None:
        self.timing = timing
        self.strip = strip
        self.error_event = False  # the stream carried an error event: the engine gave up mid-stream
        self._splitter: SseSplitter | None = SseSplitter()

    @property
    def following(self) -> bool:
        """Whether the stream's events are still parsed (not relayed blindly after an oversized event)."""
        return self._splitter is not None

    def steady(self, data: bytes, t: float) -> bool:
        """Time `data` and return True when it is a steady read: after the first token, at an event boundary,
        exactly one one-line `data:` event ending in LF LF whose data needs no parsing (no `[DONE]`, no
        `"usage"` key, which also rules out the `"usage":null` tail `_without_null_usage` strips, no `"error"`
        key). Most reads of a stream are such a token event: it goes to the client as it came, and neither the
        splitter nor the event list is needed (fed to the empty splitter, it would come back as that one event,
        whole, and leave it empty). Else False, with nothing done. `find` rather than `in` throughout: `in` on
        bytes first tries its operand as an int, and formats the TypeError it then drops."""
        timing = self.timing
        splitter = self._splitter
        if timing.first_token_at is None or splitter is None or splitter.buf:
            return False
        if not (data.startswith(b"data:") and data.endswith(b"\n\n")):
            return False
        if data.find(b"\n", 5, -2) >= 0 or data.find(b"\r") >= 0 or data.find(_USAGE_KEY) >= 0 \
                or data.find(_ERROR_KEY) >= 0:
            return False
        start = 6 if data[5:6] == b" " else 5
        if data.startswith(_DONE, start) and len(data) - 2 - start == len(_DONE):
            return False
        data = data[start:-2]
        if _looks_like_output(data):
            timing.last_token_at = t  # on_output_event, the first token being known
            timing.output_events += 1
        if _has_finish(data):
            timing.finished = True
            timing.answered_at = t
        return True

    def feed(self, chunk: bytes, t: float) -> bytes | None:
        splitter = self._splitter
        if splitter is None:  # gave up following the stream: relay blindly, watching for its end only
            self._watch_end(chunk, t)
            return None
        if self.steady(chunk, t):
            return None  # the common read: one token, nothing to parse or strip
        timing = self.timing
        held = splitter.pending()  # fed earlier, not let out yet (with strip)
        whole = not held  # this read starts at an event boundary
        try:
            events = splitter.feed(chunk)
        except EventTooLarge:
            event("tap_stream_unparseable", logging.WARNING, logger=TAP_LOGGER, reason="event_too_large")
            self._splitter = None
            return held + chunk if self.strip else None
        strip = self.strip
        out: list[bytes] = []
        changed = False
        done = False
        was_delivered = timing.delivered
        for ev in events:
            data = ev.data
            done = done or data == _DONE
            if data is not None and data != _DONE:
                # After the first token only the last token's time and the count are still
                # open, so parse only events that may carry usage or an error.
                if timing.first_token_at is None or _USAGE_KEY in data or _ERROR_KEY in data:
                    if not _quiet(data) and self._parsed(data, t):
                        changed = True
                        continue  # the injected usage event: not for the client
                else:
                    if _looks_like_output(data):
                        timing.on_output_event(t)
                    if _has_finish(data):
                        timing.finished = True
            if strip:
                raw = _without_null_usage(ev.raw)
                changed = changed or raw is not ev.raw
                out.append(raw)
        if done:
            timing.on_end(t)
            timing.delivered = True
        if timing.complete and not was_delivered and any(ev.data is not None for ev in events):
            timing.answered_at = t  # an event of the complete answer; after [DONE] nothing moves it
        if not strip or (whole and not changed and not splitter.pending()):
            return None  # nothing held back or dropped: the read as it came
        return b"".join(out)

    def _parsed(self, data: bytes, t: float) -> bool:
        """Time one event from its parsed data; True for the injected usage event (to be taken out)."""
        try:
            payload = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return False
        if not isinstance(payload, dict):
            return False
        timing = self.timing
        if carries_output(payload):
            timing.on_output_event(t)
        if has_finish_reason(payload):
            timing.finished = True
        n = completion_tokens(payload)
        if n is not None:
            timing.on_usage(n, prompt_tokens(payload))
            if self.strip and is_usage_only(payload):
                return True
        if payload.get("error"):
            self.error_event = True
        return False

    def _watch_end(self, chunk: bytes, t: float) -> None:
        """A blindly relayed read: only whether it carries the stream's end, and when."""
        timing = self.timing
        if timing.delivered:
            return
        if _DONE in chunk:
            timing.delivered = True
            timing.answered_at = t
        elif _has_finish(chunk):
            timing.finished = True
            timing.answered_at = t

    def finish(self, t: float) -> bytes:
        self.timing.on_end(t)
        if self.strip and self._splitter is not None:
            return self._splitter.pending()  # an unterminated tail: relay it as it came
        return b""


class BodyRelay:
    """A timed, non-streamed response: relayed as it comes, then read for usage (E2E only).

    A body up to MAX_PARSED_RESPONSE_BYTES is parsed whole; of a larger one only the last
    TAIL_BYTES are kept, where engines write `usage`, and searched for its completion_tokens.
    """

    __slots__ = ("timing", "error_event", "parsed", "_parts", "_kept", "_over")

    def __init__(self, timing: RequestTiming) -> None:
        self.timing = timing
        self.error_event = False
        self.parsed = False  # the whole body was JSON (a body cut short by a close is not)
        self._parts: list[bytes] = []
        self._kept = 0  # bytes in _parts
        self._over = False  # the body passed MAX_PARSED_RESPONSE_BYTES: _parts holds its tail

    def feed(self, chunk: bytes, t: float) -> None:
        self._parts.append(chunk)
        self._kept += len(chunk)
        if self._kept > (2 * TAIL_BYTES if self._over else MAX_PARSED_RESPONSE_BYTES):
            self._over = True
            if self._kept > 2 * TAIL_BYTES:
                tail = b"".join(self._parts)[-TAIL_BYTES:]
                self._parts, self._kept = [tail], len(tail)
        return None

    def finish(self, t: float) -> bytes:
        self.timing.on_end(t)
        body = b"".join(self._parts)
        self._parts = []
        if not self._over:
            try:
                doc = json.loads(body)
                n, prompt = completion_tokens(doc), prompt_tokens(doc)
                self.parsed = True
            except (ValueError, UnicodeDecodeError, RecursionError):
                n = prompt = None
        else:
            prompt = None
            found = _COMPLETION_TOKENS.findall(body[-TAIL_BYTES:])
            n = int(found[-1]) if found else None
            self.parsed = n is not None  # too large to parse: a usage member at its end tells it is whole
        if n is not None:
            self.timing.on_usage(n, prompt)
        return b""


Relay = SseRelay | BodyRelay

_NULL_USAGE = (b',"usage":null}', b', "usage": null}')


def _without_null_usage(raw: bytes) -> bytes:
    """An injected stream's event as the engine would have sent it without the injection.

    Asked for usage, OpenAI's API (and the simulator) also add `"usage":null` to every chunk, as
    the top-level object's last member; that member is removed again. Only a one-line event
    whose data ends with it is touched (the brace after it closes the top-level object, so the
    member is the top level's); anything else is returned as it is, the same object.
    """
    body = raw.rstrip(b"\r\n")
    for tail in _NULL_USAGE:
        if body.endswith(tail) and body.count(b"\n") == 0 and b"\r" not in body:
            cut = len(body) - len(tail)
            return body[:cut] + b"}" + raw[len(body) :]
    return raw


# An output key, or finish_reason, as a member name whose value is anything but "" or null.
_LOUD_MEMBER = re.compile(rb'"(?:content|reasoning_content|reasoning|text|finish_reason)"[ \t\r\n]*:[ \t\r\n]*'
                          rb'(?!(?:""|null)[ \t\r\n]*[,}])')


def _quiet(data: bytes) -> bool:
    """True only for an event whose parse would find nothing to time: no output (every output key's value, and
    finish_reason's, is "" or null; no tool_calls), no usage, no error; the role-only first event of a chat
    stream. A key hidden by an escape, or any doubt, is False (parse it). A quoted key's bytes cannot occur
    inside a JSON string, whose quotes are escaped, so what is matched here is a member name."""
    return data.find(b"\\") < 0 and data.find(_USAGE_KEY) < 0 and data.find(_ERROR_KEY) < 0 \
        and data.find(b'"tool_calls"') < 0 and _LOUD_MEMBER.search(data) is None


def _looks_like_output(data: bytes) -> bool:
    """Cheap test, after the first token, for an event that carries output.

    Parsing every event costs more than relaying it; after the first token only the last
    token's time and the chunk count are still needed. An event that has a non-empty string
    value after `"content":`, `"text":`, a reasoning key, or a `"tool_calls"` key is output;
    anything else (role-only, finish-only) is not. Falls back to parsing when unsure.
    """
    for key in (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"reasoning":"'):
        i = data.find(key)
        if i >= 0 and data[i + len(key) : i + len(key) + 1] != b'"':
            return True
    if b'"tool_calls"' in data or b'": "' in data or b'":\t' in data or b'":\n' in data:
        try:
            return carries_output(json.loads(data))
        except (ValueError, UnicodeDecodeError):
            return False
    return False


def _has_finish(data: bytes) -> bool:
    """Cheap test for an event whose choice carries a finish_reason (the stream's last content event)."""
    return data.find(b'"finish_reason"') >= 0 and (data.find(_FINISH_KEYS[0]) >= 0 or data.find(_FINISH_KEYS[1]) >= 0)
