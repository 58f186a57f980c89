"""The tap's HTTP/1.1 framing (exporter.tap.http1): strict where leniency lets requests be smuggled,
and exact about which bytes a chunked body consumed, since the tap relays them unchanged."""

from __future__ import annotations

import pytest

from exporter.tap import http1
from exporter.tap.http1 import (
    CHUNKED,
    UNTIL_CLOSE,
    BadMessage,
    ChunkedDecoder,
    RequestHead,
    ResponseHead,
    chunk,
    connection_tokens,
    parse_request_head,
    parse_response_head,
    request_body_length,
    response_body_length,
)

# Several chunks: an extension, upper- and lower-case hex sizes, a trailer field.
PAYLOAD = b"hello" + b"0123456789" + b"abcdefghijklmnopqrstuvwxyz" + b"!"
BODY = (
    b"5;ext=1\r\nhello\r\n"
    b"A\r\n0123456789\r\n"
    b"1a;name=\"quoted\"\r\nabcdefghijklmnopqrstuvwxyz\r\n"
    b"1\r\n!\r\n"
    b"0\r\nX-Trailer: 1\r\n\r\n"
)


def decode(pieces: list[bytes]) -> tuple[bytes, int, ChunkedDecoder]:
    d = ChunkedDecoder()
    out, used = [], 0
    for piece in pieces:
        payload, n = d.feed(piece)
        assert 0 <= n <= len(piece)
        out.append(payload)
        used += n
    return b"".join(out), used, d


# -- ChunkedDecoder ----------------------------------------------------------------------------
def test_chunked_body_fed_whole() -> None:
    payload, used, d = decode([BODY])
    assert payload == PAYLOAD and used == len(BODY) and d.done and d.at_boundary


def test_chunked_body_fed_one_byte_at_a_time() -> None:
    """Reads can end anywhere, including inside a size line or the CRLF after a chunk's data."""
    payload, used, d = decode([BODY[i : i + 1] for i in range(len(BODY))])
    assert payload == PAYLOAD and used == len(BODY) and d.done


def test_chunked_body_split_at_every_point_gives_the_same_result() -> None:
    for i in range(len(BODY) + 1):
        payload, used, d = decode([BODY[:i], BODY[i:]])
        assert (payload, used, d.done) == (PAYLOAD, len(BODY), True), f"split at {i}"


def test_bytes_after_the_last_chunk_are_not_consumed() -> None:
    """A pipelined request (or an out-of-step upstream's bytes) after the body must stay unread:
    `used` is how the tap knows where the next message starts."""
    payload, used, d = decode([BODY + b"EXTRA"])
    assert payload == PAYLOAD and used == len(BODY) and d.done
    for i in range(len(BODY) + 1):
        payload, used, d = decode([BODY[:i], BODY[i:] + b"EXTRA"])
        assert (payload, used, d.done) == (PAYLOAD, len(BODY), True), f"split at {i}"
    # Once done, nothing more is taken.
    assert d.feed(b"more") == (b"", 0)


def test_at_boundary_only_between_whole_chunks() -> None:
    """The tap relays bytes fed since the last boundary as they came only when they are whole chunks."""
    d = ChunkedDecoder()
    assert d.at_boundary
    assert d.feed(b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n") == (b"hello0123456789", 31)
    assert d.at_boundary
    for partial, payload in [(b"1", b""), (b"a\r", b""), (b"\n", b""), (b"abcdefghijklmnopqrstuvwxy", b"abcdefghijklmnopqrstuvwxy"),
                             (b"z", b"z"), (b"\r", b"")]:
        assert d.feed(partial) == (payload, len(partial))
        assert not d.at_boundary, partial
    d.feed(b"\n")
    assert d.at_boundary and not d.done
    d.feed(b"0\r\n")
    assert not d.at_boundary and not d.done  # the trailer section is still to come
    d.feed(b"X-Trailer: 1\r\n")
    assert not d.at_boundary and not d.done
    d.feed(b"\r\n")
    assert d.at_boundary and d.done


def test_fast_path_for_exactly_one_whole_chunk() -> None:
    d = ChunkedDecoder()
    data = chunk(b"data: {}\n\n")
    assert d.feed(data) == (b"data: {}\n\n", len(data))
    assert d.at_boundary and not d.done
    assert d.feed(b"3;x=y\r\nabc\r\n") == (b"abc", 12)
    assert d.feed(http1.LAST_CHUNK) == (b"", 5) and d.done


def test_chunk_round_trips() -> None:
    assert chunk(b"hello") == b"5\r\nhello\r\n"
    assert chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    payload, used, d = decode([chunk(b"a" * 300), chunk(b"b"), http1.LAST_CHUNK])
    assert payload == b"a" * 300 + b"b" and d.done


@pytest.mark.parametrize("size", [b"-5", b"0x10", b"1_0", b"zz", b"", b" ", b"1" * 17, b"+5", b"5 5"])
def test_malformed_chunk_sizes_are_refused(size: bytes) -> None:
    """int(x, 16) alone would take `0x10`, `1_0`, ` 5` or a sign; a proxy reading sizes differently
    from the upstream is how chunked smuggling works."""
    with pytest.raises(BadMessage):
        ChunkedDecoder().feed(size + b"\r\n" + b"x" * 40 + b"\r\n0\r\n\r\n")
    with pytest.raises(BadMessage):  # the same line arriving byte by byte
        d = ChunkedDecoder()
        for b in size + b"\r\n":
            d.feed(bytes([b]))


def test_sixteen_hex_digits_are_accepted() -> None:
    d = ChunkedDecoder()
    assert d.feed(b"0000000000000003\r\nabc\r\n") == (b"abc", 23)


@pytest.mark.parametrize("pieces", [[b"5\r\nhelloXY"], [b"5\r\nhello\rX"], [b"5\r\nhello", b"X", b"Y"], [b"5\r\nhelloworld\r\n"]])
def test_chunk_data_not_followed_by_crlf_is_refused(pieces: list[bytes]) -> None:
    d = ChunkedDecoder()
    with pytest.raises(BadMessage, match="CRLF"):
        for piece in pieces:
            d.feed(piece)


def test_over_long_size_line_is_refused_while_it_arrives() -> None:
    """The size line is buffered until its end: without a limit a client could grow it forever."""
    d = ChunkedDecoder()
    with pytest.raises(BadMessage, match="too long"):
        for _ in range(10):
            d.feed(b"5;" + b"x" * 1000)


def test_over_long_size_line_is_refused_however_it_is_split() -> None:
    """The same bytes must be accepted or refused whatever the read boundaries were; a limit that
    only holds when a line is split across reads depends on TCP segmentation."""
    line = b"5;ext=" + b"x" * (2 * http1.MAX_CHUNK_LINE_BYTES) + b"\r\nhello\r\n0\r\n\r\n"
    with pytest.raises(BadMessage, match="too long"):
        ChunkedDecoder().feed(line)


# -- request heads -----------------------------------------------------------------------------
def test_request_head_is_preserved_exactly() -> None:
    head = parse_request_head(
        b"POST /v1/a%2Fb/x?q=%20y&z=%C3%A9 HTTP/1.1\r\nHost: example\r\nX-MiXed-Case:  Value with  spaces \t\r\n"
        b"content-length: 0\r\nX-Empty:"
    )
    assert head.method == b"POST" and head.version == b"1.1"
    assert head.target == b"/v1/a%2Fb/x?q=%20y&z=%C3%A9" and head.path == b"/v1/a%2Fb/x"
    assert head.fields == [
        (b"Host", b"example"), (b"X-MiXed-Case", b"Value with  spaces"), (b"content-length", b"0"), (b"X-Empty", b""),
    ]
    assert head.get(b"x-mixed-case") == b"Value with  spaces" and head.get(b"absent") is None
    assert parse_request_head(b"GET / HTTP/1.0").version == b"1.0"


@pytest.mark.parametrize(
    "head, why",
    [
        (b"GET / HTTP/1.1\r\nX-A: 1\r\n continued", "folding"),
        (b"GET / HTTP/1.1\r\nX-A: 1\r\n\tcontinued", "folding"),
        (b"GET / HTTP/1.1\r\nHost : h", "header line"),
        (b"GET / HTTP/1.1\r\nHost\t: h", "header line"),
        (b"GET / HTTP/1.1\r\nNoColonHere", "header line"),
        (b"GET / HTTP/1.1\r\n: no name", "header line"),
        (b"GET / HTTP/1.1\r\nX A: 1", "header line"),
        (b"GET /", "request line"),
        (b"GET  / HTTP/1.1", "request line"),
        (b"GET / HTTP/1.1 extra", "request line"),
        (b"G3T / HTTP/1.1", "request line"),
        (b"", "request line"),
        (b"GET / HTTP/2.0", "protocol"),
        (b"GET / HTTP/0.9", "protocol"),
        (b"GET / http/1.1", "protocol"),
    ],
)
def test_malformed_request_heads_are_refused_with_a_reason(head: bytes, why: str) -> None:
    with pytest.raises(BadMessage, match=why):
        parse_request_head(head)


@pytest.mark.parametrize("byte", [
    *(bytes([b]) for b in range(0x00, 0x20) if b not in (0x0A, 0x0D)),  # C0 (CR, LF: a bare CR or LF, refused apart)
    b"\x7f",  # DEL
    *(bytes([b]) for b in (0x80, 0x9B, 0x9F, 0xA0, 0xC3, 0xFF)),  # C1 controls and any other non-ASCII byte
])
def test_a_request_target_with_a_control_del_or_non_ascii_byte_is_refused(byte: bytes) -> None:
    with pytest.raises(BadMessage, match="request target|bare CR, LF or NUL"):
        parse_request_head(b"GET /v1/models" + byte + b"x?q=1 HTTP/1.1\r\nHost: tap")


@pytest.mark.parametrize("target", [
    b"/v1/a%2Fb/x?q=%20y&z=%C3%A9%1B%7F",  # percent-encoded controls, DEL and UTF-8 pass as they were sent
    b"/v1/models?a=b&c=~-._!$'()*+,;=:@/?",
    b"*", b"http://engine:8000/v1/models", b"engine:443",
])
def test_request_targets_of_visible_ascii_pass_as_sent(target: bytes) -> None:
    assert parse_request_head(b"GET " + target + b" HTTP/1.1\r\nHost: tap").target == target


def test_response_head() -> None:
    head = parse_response_head(b"HTTP/1.1 404 Not Found Here\r\nContent-Length: 3")
    assert (head.version, head.status, head.reason, head.fields) == (b"1.1", 404, b"Not Found Here", [(b"Content-Length", b"3")])
    assert parse_response_head(b"HTTP/1.0 200").reason == b""
    for bad in (b"HTTP/1.1 20 OK", b"HTTP/1.1 abc OK", b"ICY 200 OK", b"HTTP/1.1 200 OK\r\nBad Name: x"):
        with pytest.raises(BadMessage):
            parse_response_head(bad)


# -- body lengths ------------------------------------------------------------------------------
def req(*fields: tuple[bytes, bytes]) -> RequestHead:
    return RequestHead(b"POST", b"/", b"1.1", list(fields))


def test_request_body_length() -> None:
    assert request_body_length(req()) == 0
    assert request_body_length(req((b"Content-Length", b"42"))) == 42
    assert request_body_length(req((b"content-length", b"7"), (b"Content-Length", b"7"))) == 7  # repeated, equal
    assert request_body_length(req((b"Transfer-Encoding", b"chunked"))) is None
    assert request_body_length(req((b"transfer-encoding", b"Chunked"))) is None


@pytest.mark.parametrize(
    "fields, why",
    [
        ([(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"5")], "both"),
        ([(b"Content-Length", b"5"), (b"transfer-encoding", b"chunked")], "both"),
        ([(b"Content-Length", b"5"), (b"Content-Length", b"6")], "conflicting"),
        ([(b"Content-Length", b"abc")], "not a number"),
        ([(b"Content-Length", b"-1")], "not a number"),
        ([(b"Content-Length", b"+5")], "not a number"),
        ([(b"Content-Length", b"5, 5")], "not a number"),
        ([(b"Transfer-Encoding", b"gzip")], "not supported"),
        ([(b"Transfer-Encoding", b"gzip, chunked")], "not supported"),
        ([(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")], "not supported"),
    ],
)
def test_ambiguous_request_bodies_are_refused(fields: list[tuple[bytes, bytes]], why: str) -> None:
    """The tap and the engine must agree on where a request ends, or one can hide a second request in the body."""
    with pytest.raises(BadMessage, match=why):
        request_body_length(req(*fields))


def resp(status: int, *fields: tuple[bytes, bytes]) -> ResponseHead:
    return ResponseHead(b"1.1", status, b"X", list(fields))


def test_response_body_length() -> None:
    cl = (b"Content-Length", b"42")
    te = (b"Transfer-Encoding", b"chunked")
    assert response_body_length(resp(200, cl), b"HEAD") == 0
    assert response_body_length(resp(200, te), b"HEAD") == 0
    for status in (100, 101, 103, 204, 304):
        assert response_body_length(resp(status, cl), b"GET") == 0, status
    assert response_body_length(resp(200, te), b"POST") == CHUNKED
    assert response_body_length(resp(200, (b"transfer-encoding", b"gzip, Chunked")), b"GET") == CHUNKED
    assert response_body_length(resp(200, te, cl), b"GET") == CHUNKED  # RFC 9112 6.3: chunked wins
    assert response_body_length(resp(200, cl), b"GET") == 42
    assert response_body_length(resp(404, (b"content-length", b"0")), b"GET") == 0
    assert response_body_length(resp(200), b"GET") == UNTIL_CLOSE
    assert response_body_length(resp(200, (b"Transfer-Encoding", b"gzip")), b"GET") == UNTIL_CLOSE
    with pytest.raises(BadMessage):
        response_body_length(resp(200, (b"Content-Length", b"x")), b"GET")


def test_connection_tokens_from_every_connection_field() -> None:
    fields = [
        (b"Connection", b"Keep-Alive, X-Drop-Me"), (b"Host", b"h"), (b"connection", b" CLOSE ,, "),
        (b"X-Connection", b"not-a-token"),
    ]
    assert connection_tokens(fields) == {b"keep-alive", b"x-drop-me", b"close"}
    assert connection_tokens([]) == set()


@pytest.mark.parametrize("target, origin", [
    (b"/v1/models?x=1", b"/v1/models?x=1"),
    (b"http://engine:8000/v1/chat/completions", b"/v1/chat/completions"),
    (b"HTTPS://engine/a%2Fb?q=1", b"/a%2Fb?q=1"),
    (b"http://engine", b"/"),
    (b"*", b"*"),
])
def test_absolute_form_targets_become_origin_form(target: bytes, origin: bytes) -> None:
    """A client using the tap as a forward proxy sends absolute-form targets; the engine gets the path."""
    assert http1.origin_form(target) == origin
    assert http1.RequestHead(b"GET", target, b"1.1", []).path == origin.split(b"?")[0]


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\nX: a\nTransfer-Encoding: chunked",  # a bare LF: a header line to some servers
    b"GET / HTTP/1.1\r\nX: a\rTransfer-Encoding: chunked",
    b"GET / HTTP/1.1\r\nX: a\x00b",
    b"GET /\n HTTP/1.1\r\nHost: t",
])
def test_bare_cr_lf_or_nul_in_a_head_is_refused(head: bytes) -> None:
    """Forwarded as they are, such bytes let a request carry a header the tap never saw."""
    with pytest.raises(BadMessage, match="bare CR, LF or NUL"):
        http1.parse_request_head(head)
    with pytest.raises(BadMessage, match="bare CR, LF or NUL"):
        http1.parse_response_head(head.replace(head.split(b"\r\n", 1)[0].replace(b"\n", b""), b"HTTP/1.1 200 OK", 1))


def test_client_framing_table() -> None:
    """The client's framing of a response, chosen from the upstream's framing, the client's close and a rewrite."""
    from exporter.tap.http1 import CHUNKED, UNTIL_CLOSE, BodyMode, client_framing

    te = b"Transfer-Encoding: chunked\r\n"
    table = {
        # (upstream framing, client closes, body rewritten): (mode, framing field, Content-Length kept)
        (0, False, False): (BodyMode.RAW, b"", True),
        (0, True, True): (BodyMode.RAW, b"", True),
        (10, False, False): (BodyMode.RAW, b"", True),
        (10, True, False): (BodyMode.RAW, b"", True),
        (10, False, True): (BodyMode.CHUNKS, te, False),
        (10, True, True): (BodyMode.PLAIN, b"", False),
        (CHUNKED, False, False): (BodyMode.RAW, te, False),
        (CHUNKED, False, True): (BodyMode.CHUNKS, te, False),
        (CHUNKED, True, False): (BodyMode.PLAIN, b"", False),
        (UNTIL_CLOSE, False, False): (BodyMode.CHUNKS, te, False),
        (UNTIL_CLOSE, True, False): (BodyMode.PLAIN, b"", False),
        (UNTIL_CLOSE, True, True): (BodyMode.PLAIN, b"", False),
    }
    for args, want in table.items():
        f = client_framing(*args)
        assert (f.mode, f.field, f.keep_length) == want, args


def test_simple_response() -> None:
    from exporter.tap.http1 import simple_response

    assert simple_response(429, "full\n", close=False, retry_after=1) == (
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n"
        b"Retry-After: 1\r\n\r\nfull\n"
    )
    assert simple_response(418, "", close=True).startswith(b"HTTP/1.1 418 Error\r\n")
    assert b"Connection: close\r\n\r\n" in simple_response(418, "", close=True)


@pytest.mark.parametrize("line", [
    b"X-Note: a\x1b[31mred", b"X-Note: del\x7f", b"X-Note: bell\x07", b"X(Note): v", b"X-N\xc3\xa9: v",
])
def test_a_request_header_with_a_control_byte_or_a_name_outside_tokens_is_refused(line: bytes) -> None:
    with pytest.raises(BadMessage, match="in header field"):
        parse_request_head(b"GET / HTTP/1.1\r\nHost: a\r\n" + line)


def test_header_values_with_tabs_spaces_and_obs_text_pass() -> None:
    head = parse_request_head(b"GET / HTTP/1.1\r\nHost: a\r\nX-Note: a\tb c \xc3\xa9!~\r\nX-Y_z.1: v")
    assert head.fields[1] == (b"X-Note", b"a\tb c \xc3\xa9!~")


def _decode(pieces: list[bytes]) -> tuple[bytes, int, bool, str]:
    """What a decoder makes of `pieces` fed in turn: payload, bytes used, done; or only the refusal (a read
    that raises returns nothing)."""
    d, out, used = ChunkedDecoder(), [], 0
    try:
        for piece in pieces:
            payload, n = d.feed(piece)
            out.append(payload)
            used += n
    except BadMessage as e:
        return b"", 0, False, str(e)
    return b"".join(out), used, d.done, ""


def test_whole_chunks_in_one_read_decode_as_the_state_machine_does() -> None:
    """Reads of several whole chunks take a shortcut (one find per chunk); fed one byte at a time, the same bytes
    go through the state machine alone. Both agree on payload, bytes used, the end and every refusal, on
    random bodies cut at random places, well-formed or damaged (a bare LF, bad data ends, junk sizes)."""
    import random

    rng = random.Random(36)
    parts = [b"5\r\nhello\r\n", b"a;x=1\r\n0123456789\r\n", b"1\n!\r\n", b"3\r\nabcXY", b"zz\r\nab\r\n",
             b"0\r\n\r\n", b"0\r\nT: 1\r\n\r\n", b"2\r\n\r\n\r\n", b"\r\n", b"0000000000000001\r\nq\r\n"]
    for _ in range(3000):
        body = b"".join(rng.choice(parts) for _ in range(rng.randint(1, 6))) + b"tail"
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 3))))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        assert _decode(pieces) == _decode([body[i : i + 1] for i in range(len(body))]), pieces


def test_a_head_is_checked_in_one_pass_as_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """parse_request_head checks a clean head's bytes in two passes over the whole head; with that pass made to
    fail always (the field-by-field check then runs on every head), every head, clean or with a stray byte put
    anywhere, gets the same fields or the same refusal."""
    import random

    rng = random.Random(36)
    base = (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"X-Note: caf\xc3\xa9 \t ok\r\nContent-Length: 12\r\nContent-Length: 12")
    strays = [b"\x00", b"\x01", b"\x7f", b"\x1b", b"\xe9", b" ", b"\t", b":", b"(", b"\r", b"\n", b"\r\n ", b"a"]

    def outcome(head: bytes) -> object:
        try:
            parsed = parse_request_head(head)
            return parsed, request_body_length(parsed)
        except BadMessage as e:
            return str(e)

    heads = [base]
    for _ in range(600):
        at = rng.randrange(len(base))
        heads.append(base[:at] + rng.choice(strays) + base[at:])
    fast = [outcome(h) for h in heads]
    monkeypatch.setattr(http1, "_HEAD_BYTES", b"")
    assert fast == [outcome(h) for h in heads]
    assert sum(isinstance(o, str) for o in fast) > 100 and not isinstance(fast[0], str)
    assert fast[0][1] == 12  # type: ignore[index]  # the same Content-Length twice is one length
