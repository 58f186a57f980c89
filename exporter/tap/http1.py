"""HTTP/1.1 message framing for the tap, without I/O: heads and chunked bodies (RFC 9112).

The tap relays bytes on raw transports instead of a web framework because a framework's
per-request and per-write work was most of its added latency. It needs only this much of
HTTP/1.1: split a head into its start line and fields, tell how the body is delimited, and
decode a chunked body incrementally while knowing exactly which input bytes it consumed (so
an unchanged body can be relayed as the very bytes that arrived, framing included).

Parsing is strict where leniency enables request smuggling (whitespace before a colon,
obsolete line folding, conflicting Content-Length, Transfer-Encoding other than chunked)
and each refusal says why, since the tap answers it with a 400 the client can read.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4096
CRLF = b"\r\n"
HEAD_END = b"\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"

Fields = list[tuple[bytes, bytes]]  # (name as sent, value), in order

# RFC 9110 7.6.1: connection-specific fields a proxy must not forward.
HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
        b"trailer", b"trailers", b"transfer-encoding", b"upgrade",
    }
)


class BadMessage(Exception):
    """A message the tap will not relay; the text says what was wrong."""


@dataclass(slots=True)
class RequestHead:
    method: bytes
    target: bytes  # as sent: path and query, percent-encoding untouched
    version: bytes  # b"1.1" or b"1.0"
    fields: Fields

    def get(self, name: bytes) -> bytes | None:
        return get_field(self.fields, name)

    @property
    def path(self) -> bytes:
        return origin_form(self.target).split(b"?", 1)[0]


@dataclass(slots=True)
class ResponseHead:
    version: bytes
    status: int
    reason: bytes
    fields: Fields

    def get(self, name: bytes) -> bytes | None:
        return get_field(self.fields, name)


def origin_form(target: bytes) -> bytes:
    """The path and query of a request target: a client that treats the tap as a forward proxy
    sends `http://host/path` (absolute form), which the engine behind it must not see."""
    if target[:7].lower() == b"http://" or target[:8].lower() == b"https://":
        path = target[target.index(b"//") + 2 :]
        slash = path.find(b"/")
        return path[slash:] if slash >= 0 else b"/"
    return target


def field_text(value: bytes | None) -> str:
    """A field's value (or a path) as text for logs and records: latin-1, "" when absent."""
    return "" if value is None else value.decode("latin-1")


def get_field(fields: Fields, name: bytes) -> bytes | None:
    """The first value of a field, by case-insensitive name (`name` is lower case)."""
    for k, v in fields:
        if k.lower() == name:
            return v
    return None


def connection_tokens(fields: Fields) -> set[bytes]:
    """The lower-cased options of every Connection field (e.g. {b"close"}, {b"keep-alive", b"x-foo"})."""
    tokens: set[bytes] = set()
    for k, v in fields:
        if k.lower() == b"connection":
            tokens.update(t.strip().lower() for t in v.split(b",") if t.strip())
    return tokens


def _split_lines(head: bytes) -> list[bytes]:
    """The lines of a head. A CR or LF that is not part of a CRLF, or a NUL, is refused: passed on,
    a bare LF is a line break to some servers and not to others, which is how requests are smuggled."""
    crlf = head.count(CRLF)
    if head.count(b"\r") != crlf or head.count(b"\n") != crlf or b"\x00" in head:
        raise BadMessage("a bare CR, LF or NUL in the head")
    return head.split(CRLF)


def _fields(lines: list[bytes]) -> Fields:
    fields: Fields = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise BadMessage("obsolete line folding in a header field")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name or b"\t" in name:
            raise BadMessage(f"malformed header line {line[:60]!r}")
        fields.append((name, value.strip(b" \t")))
    return fields


# RFC 9112 3.2 and RFC 3986: a request target is visible ASCII (anything else is percent-encoded), as h11 and
# uvicorn require. A control character, DEL or a raw non-ASCII byte passed on reaches logs, the engine's router
# and whatever reads its logs; some servers cut the target at them, which is how paths are smuggled.
_TARGET_BYTES = bytes(range(0x21, 0x7F))
# RFC 9110 5.1 and 5.5: a request's field names are tokens, its values visible ASCII, space, tab and obs-text
# (0x80-0xFF); a control character or DEL in a value is refused as h11 refuses it (it would reach the engine's
# logs and the tap's own).
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789" + bytes(range(0x41, 0x5B)) + bytes(range(0x61, 0x7B))
_VALUE_BYTES = b" \t" + bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100))
_HEAD_BYTES = _VALUE_BYTES + CRLF  # a head whose every byte is one of these has no bad byte in a value


def parse_request_head(head: bytes) -> RequestHead:
    """`head` is everything before the blank line that ends it."""
    lines = _split_lines(head)
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise BadMessage(f"malformed request line {lines[0][:60]!r}")
    method, target, proto = parts
    bad = target.translate(None, _TARGET_BYTES)
    if bad:
        raise BadMessage(f"byte {bad[:1]!r} in the request target (only visible ASCII: percent-encode the rest)")
    if proto not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadMessage(f"unsupported protocol {proto[:20]!r} (the tap speaks HTTP/1.1 and HTTP/1.0)")
    fields = _fields(lines[1:])
    # Most heads are clean: one pass over all the values and one over all the names; else find the culprit.
    if head.translate(None, _HEAD_BYTES) or b"".join([name for name, _ in fields]).translate(None, _TOKEN_BYTES):
        for name, value in fields:
            bad = value.translate(None, _VALUE_BYTES)
            if bad or name.translate(None, _TOKEN_BYTES):
                raise BadMessage(f"byte {(bad or name.translate(None, _TOKEN_BYTES))[:1]!r} in header field "
                                 f"{name[:40]!r} (names are tokens; values visible ASCII, space, tab or obs-text)")
    return RequestHead(method, target, proto[5:], fields)


def parse_response_head(head: bytes) -> ResponseHead:
    lines = _split_lines(head)
    proto, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not proto.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise BadMessage(f"malformed status line {lines[0][:60]!r}")
    return ResponseHead(proto[5:], int(code), reason, _fields(lines[1:]))


def request_body_length(head: RequestHead) -> int | None:
    """The body's length from Content-Length (0 when neither field is sent); None when chunked."""
    te: list[bytes] = []
    lengths: set[bytes] = set()
    for k, v in head.fields:  # one pass, one lower() per field
        name = k.lower()
        if name == b"content-length":
            lengths.add(v)
        elif name == b"transfer-encoding":
            te.append(v)
    if te:
        if lengths:
            raise BadMessage("both Transfer-Encoding and Content-Length are set")
        if b",".join(te).strip().lower() != b"chunked":
            raise BadMessage(f"Transfer-Encoding {b','.join(te)[:40]!r} is not supported (only chunked)")
        return None
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise BadMessage("conflicting Content-Length values")
    (value,) = lengths
    if not value.isdigit():
        raise BadMessage(f"Content-Length {value[:20]!r} is not a number")
    return int(value)


CHUNKED = -1  # response_body_length(): the body is chunked
UNTIL_CLOSE = -2  # response_body_length(): the body ends when the connection closes


def response_body_length(head: ResponseHead, request_method: bytes) -> int:
    """Bytes of body that follow the head: a length, CHUNKED or UNTIL_CLOSE (RFC 9112 6.3)."""
    if request_method == b"HEAD" or head.status < 200 or head.status in (204, 304):
        return 0
    te = head.get(b"transfer-encoding")
    if te is not None:
        return CHUNKED if te.lower().rstrip().endswith(b"chunked") else UNTIL_CLOSE
    length = head.get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise BadMessage(f"Content-Length {length[:20]!r} is not a number")
        return int(length)
    return UNTIL_CLOSE


class BodyMode(enum.Enum):
    """How the client gets a response body."""

    RAW = "raw"  # the upstream's body bytes exactly as they arrived (its framing included)
    CHUNKS = "chunks"  # re-framed in chunks of our own (the body changed, or the upstream delimits it by closing)
    PLAIN = "plain"  # decoded bytes, the end marked by closing (an HTTP/1.0 client, or one that asked to close)


@dataclass(frozen=True, slots=True)
class ClientFraming:
    """The client's framing of one response: how its body goes out and which framing field its head carries."""

    mode: BodyMode
    field: bytes  # a Transfer-Encoding field line for the client's head, or b""
    keep_length: bool  # whether the upstream's Content-Length stays in the client's head


_AS_IS = ClientFraming(BodyMode.RAW, b"", True)
_AS_IS_CHUNKED = ClientFraming(BodyMode.RAW, b"Transfer-Encoding: chunked\r\n", False)
_PLAIN = ClientFraming(BodyMode.PLAIN, b"", False)
_OWN_CHUNKS = ClientFraming(BodyMode.CHUNKS, b"Transfer-Encoding: chunked\r\n", False)


def client_framing(framing: int, client_close: bool, rewritten: bool) -> ClientFraming:
    """How to frame a response for the client, from the upstream's framing (a length, CHUNKED or
    UNTIL_CLOSE), whether the client's connection closes after it, and whether the tap changes the
    body (`rewritten`: an event taken out of a stream).

    - no body: as it is;
    - a closing client and a body whose end is not its length as sent: plain bytes, ended by the close;
    - a changed body, or one the upstream ends by closing: chunks of the tap's own;
    - otherwise the upstream's bytes as they came, chunked framing included (a Content-Length next to
      Transfer-Encoding is dropped, RFC 9112 6.3: the chunks decide).
    """
    if framing == 0:
        return _AS_IS
    if client_close and (framing < 0 or rewritten):
        return _PLAIN
    if rewritten or framing == UNTIL_CLOSE:
        return _OWN_CHUNKS
    return _AS_IS_CHUNKED if framing == CHUNKED else _AS_IS


REASONS = {
    400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large",
    429: "Too Many Requests", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}


def simple_response(status: int, text: str, close: bool, retry_after: int | None = None) -> bytes:
    """A complete plain-text response of the tap's own (its refusals and errors)."""
    return _own_response(status, b"text/plain; charset=utf-8", text.encode(), close, retry_after)


def json_error_response(status: int, message: str, kind: str, code: str, close: bool,
                        retry_after: int | None = None) -> bytes:
    """The tap's own error on the OpenAI API, as an OpenAI client expects it: `{"error": {"message", "type",
    "param", "code"}}` (clients read the message and type from there, not from a text body)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    return _own_response(status, b"application/json", body, close, retry_after)


def _own_response(status: int, content_type: bytes, body: bytes, close: bool, retry_after: int | None) -> bytes:
    extra = (b"Connection: close\r\n" if close else b"") + (
        b"Retry-After: %d\r\n" % retry_after if retry_after is not None else b""
    )
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
        % (status, REASONS.get(status, "Error").encode(), content_type, len(body), extra)
    ) + body


def chunk(payload: bytes) -> bytes:
    """One chunk of a chunked body (payload must not be empty: an empty chunk ends the body)."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Decodes a chunked body fed in pieces as they arrive.

    `feed` returns the payload bytes the piece completed and how many of its bytes belonged to
    this body (fewer than all only once the body has ended). `at_boundary` tells whether the
    input so far ends exactly between two chunks: then the bytes fed since the previous boundary
    are whole chunks that can be relayed as they are.
    """

    __slots__ = ("_state", "_left", "_line", "done")

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0
        self._line = b""
        self.done = False

    @property
    def at_boundary(self) -> bool:
        return (self._state == _SIZE and not self._line) or self._state == _DONE

    def whole_chunk(self, data: bytes) -> bytes | None:
        """The payload of `data` when the decoder is at a boundary and `data` is exactly one whole, non-empty
        chunk without extensions (most reads of a token stream); else None. Nothing changes either way: after
        such a chunk the decoder is at a boundary again, so the caller that takes the payload need not `feed`."""
        if self._state != _SIZE or self._line:
            return None
        eol = data.find(CRLF, 0, 18)  # at most 16 hex digits, as _chunk_size allows
        if eol <= 0:
            return None
        digits = data[:eol]
        if digits.strip(_HEX):
            return None  # extensions, blanks or junk: feed decides
        end = eol + 2 + int(digits, 16)
        if end == eol + 2 or len(data) != end + 2 or not data.endswith(CRLF):
            return None
        return data[eol + 2 : end]

    def feed(self, data: bytes) -> tuple[bytes, int]:
        out: list[bytes] = []
        pos, n = 0, len(data)
        if self._state == _SIZE and not self._line:
            pos = _whole_chunks(data, out)  # most reads: whole chunks, one `find` each
            if pos == n:
                return (out[0] if len(out) == 1 else b"".join(out)), n  # (b"", 0) for no data
        while pos < n and self._state != _DONE:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _DATA_END
            elif state == _DATA_END:
                # The CRLF after a chunk's data, possibly split across reads.
                need = 2 - len(self._line)
                self._line += data[pos : pos + need]
                pos += min(need, n - pos)
                if len(self._line) == 2:
                    if self._line != CRLF:
                        raise BadMessage("chunk data not followed by CRLF")
                    self._line = b""
                    self._state = _SIZE
            else:  # _SIZE or _TRAILER: one line at a time
                eol = data.find(b"\n", pos)
                if eol < 0:
                    self._line += data[pos:]
                    pos = n
                    if len(self._line) > MAX_CHUNK_LINE_BYTES:
                        raise BadMessage("chunk size line too long")
                    break
                line = (self._line + data[pos:eol]).rstrip(b"\r")
                if len(line) > MAX_CHUNK_LINE_BYTES:
                    raise BadMessage("chunk size line too long")
                self._line = b""
                pos = eol + 1
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                        self.done = True
                    continue
                size = _chunk_size(line)
                if size:
                    self._left = size
                    self._state = _DATA
                else:
                    self._state = _TRAILER
        return b"".join(out), pos


def _whole_chunks(data: bytes, out: list[bytes]) -> int:
    """Append the payloads of the whole, non-empty chunks at the start of `data` (which starts at a chunk
    boundary) to `out`; return where they end. What the state machine of ChunkedDecoder.feed would do with
    them, in one `find` per chunk: it goes on from there (a partial chunk, the last chunk, its trailers)."""
    pos, n = 0, len(data)
    while pos < n:
        eol = data.find(b"\n", pos, pos + MAX_CHUNK_LINE_BYTES + 1)
        if eol < 0:
            break
        size = _chunk_size(data[pos:eol].rstrip(b"\r"))
        start = eol + 1
        end = start + size
        if not size or end + 2 > n:
            break
        if data[end : end + 2] != CRLF:
            raise BadMessage("chunk data not followed by CRLF")
        out.append(data[start:end])
        pos = end + 2
    return pos


def _chunk_size(line: bytes) -> int:
    if 0 < len(line) <= 16 and not line.strip(_HEX):
        return int(line, 16)  # a bare size, as engines send: what the general way below makes of it
    text = line.split(b";", 1)[0].strip(b" \t")
    if not text or len(text) > 16 or text.strip(_HEX):
        raise BadMessage(f"malformed chunk size {line[:40]!r}")
    return int(text, 16)


_HEX = b"0123456789abcdefABCDEF"
