"""Refused clients' turns at the admission gate: when each may come back, and who is owed the next seat.

A client the gate refuses is told when a seat is expected (Retry-After, exporter.tap.admission) and remembered
until then. A request from it before that time is refused again with the time left (admission_retry_early), so
retrying faster gains nothing: a client retrying every 0.2 s next to one honouring a fixed 1 s took 4x its
admissions (issue 34). A client keeps the place in line of its first refusal while it comes back as told; one
that comes back early goes to the back. From LEAD_S before its time (Retry-After is rounded up to whole seconds,
so the seat was expected up to a second earlier) until GRACE_S after it, a client's turn holds a seat: the gate
counts it as admitted when it decides for anyone behind it, so a seat that frees goes to the earliest-refused
client that waited as told, not to whoever asks first. A turn not taken by then lapses.

Clients are told apart by `ClientKeys`: the peer address (an IPv6 one by its /64, what one host is usually
given), or, only when the operator names a header to trust (`--admission-client-header`), a keyed hash of that
header's value. Clients behind one proxy or ingress share its address, and so one turn. The line holds at most
`max_clients`: a newcomer to a full line takes the place of the client at its back, so a flood of addresses
churns the back and never pushes out the clients owed longest.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
from collections import OrderedDict, deque

MAX_CLIENTS = 1024  # turns kept (each a key and a time); a decision reads those ahead of its client
LEAD_S = 1.0
GRACE_S = 2.0
# A client back this little before its time is taken to have waited (its clock, or its reading of the header,
# rounds): the gate measures from its decision, the client from the response's arrival.
EARLY_SLACK_S = 0.05
# The line's pace: admissions of clients in line over the last LINE_WINDOW_S (at least LINE_MIN_MOVES of them)
LINE_WINDOW_S = 60.0
LINE_MIN_MOVES = 2


_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def header_name(value: str) -> str:
    """`--admission-client-header`: a field name (an RFC 9110 token)."""
    if not value or len(value) > 100 or not set(value.encode("utf-8", "replace")) <= _TOKEN:
        raise argparse.ArgumentTypeError(f"{value!r} is not a header name (letters, digits and -, e.g. x-user-id)")
    return value


class ClientKeys:
    """Who a request is from, as the turns count clients (the module's docstring)."""

    def __init__(self, header: str = "") -> None:
        self.header = header.lower().encode() or None  # the trusted header, or None: the peer address only
        self._secret = os.urandom(16)  # the key of the header's hash: the table never holds a credential

    def key(self, peer: object, value: bytes | None = None) -> str:
        """The client of a request from `peer` (a transport's peername) whose trusted header is `value`; "" when
        neither tells (a unix socket): such requests have no turn."""
        if value:
            return "h:" + hashlib.blake2b(value, key=self._secret, digest_size=16).hexdigest()
        host = peer[0] if isinstance(peer, tuple) and peer else None
        if not isinstance(host, str) or not host:
            return ""
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return "a:" + host
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                return "a:" + str(address.ipv4_mapped)
            return "a:" + str(ipaddress.ip_network(f"{address}/64", strict=False))
        return "a:" + str(address)


class Turns:
    """The refused clients in line, each with the time it may come back (the module's docstring)."""

    def __init__(self, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        self._line: OrderedDict[str, float] = OrderedDict()  # client -> not before, in order of place
        self._moved: deque[float] = deque()  # when a client in line was admitted, within LINE_WINDOW_S

    def early(self, client: str, now: float) -> float:
        """Seconds until `client` may come back, 0 when it may now; a client that came early goes to the back."""
        not_before = self._line.get(client)
        if not_before is None or now >= not_before - EARLY_SLACK_S:
            return 0.0
        self._line.move_to_end(client)
        return not_before - now

    def ahead(self, client: str, now: float) -> tuple[int, int]:
        """The turns ahead of `client` (all of them for a client not in line) that hold a seat now, and all the
        live turns ahead of it; turns that lapsed are dropped on the way."""
        holding = waiting = 0
        lapsed = []
        for other, not_before in self._line.items():
            if other == client:
                break
            if now > not_before + GRACE_S:
                lapsed.append(other)
                continue
            waiting += 1
            holding += now >= not_before - LEAD_S
        for other in lapsed:
            del self._line[other]
        return holding, waiting

    def refused(self, client: str, now: float, seconds: float) -> None:
        """`client` was refused and told to come back in `seconds`: it keeps its place if it came as told."""
        line = self._line
        not_before = line.get(client)
        if not_before is not None and now > not_before + GRACE_S:
            del line[client]  # its turn lapsed: a place in line is kept only by coming back
            not_before = None
        if not_before is None and len(line) >= self.max_clients:
            line.popitem(last=True)
        line[client] = now + seconds

    def admitted(self, client: str, now: float) -> None:
        if self._line.pop(client, None) is not None:
            self._moved.append(now)

    def pace(self, ahead: int, now: float) -> float:
        """Seconds until the `ahead` turns before a client are taken, at the pace the line moved (the gate's own
        record of seats freeing for the refused, which its prediction from the page can overrate); 0 while it
        has moved too little to tell."""
        moved = self._moved
        while moved and moved[0] < now - LINE_WINDOW_S:
            moved.popleft()
        if len(moved) < LINE_MIN_MOVES or now <= moved[0]:
            return 0.0
        return ahead * (now - moved[0]) / len(moved)

    def __len__(self) -> int:
        return len(self._line)
