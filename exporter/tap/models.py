"""Which model names may become label values: the ones the upstream serves, or the classes' globs.

The `model` of a request is whatever its client wrote, so it cannot be a label value as it is:
64 requests with 1 MiB model names once made the tap's /metrics 67 MB (and the node exporter
dropped the whole target), and the first 64 made-up names pushed the real model out to
`__other__`. A name becomes a label value only when

- it is label-worthy: at most MAX_LABEL_CHARS characters, all printable (no control or
  unpaired surrogate characters, which would corrupt or break the page), and
- the upstream serves it: it is an `id` in the engine's `GET /v1/models` (OpenAI format;
  vLLM lists its LoRA adapters there too), read by ServedModels every `refresh_s` seconds;
  or a configured class's `models` globs match it (exporter.tap.classes).

Everything else is counted under `__other__` (exporter.tap.metrics.OVERFLOW_MODEL), which also
takes the names past TapMetrics' MAX_MODELS. Before the first successful read of the list, only
glob matches are admitted; a failed read keeps the last good list. The read is one small HTTP
request on the tap's event loop with a timeout, reading at most MAX_LIST_BYTES; its JSON is
decoded in a worker thread (as the admission gate parses the engine's /metrics), one entry at a
time, keeping at most MAX_IDS ids of at most MAX_ENTRIES entries (a list with more is refused),
so a slow, dead, garbled or huge answer costs the relay nothing. (Decoded on the loop in slices, a
1 MiB answer of empty entries once delayed relayed chunks by 454 ms with `--models-refresh 1`.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import ssl
import time
from collections.abc import Iterator

import aiohttp

from exporter.logs import TAP_LOGGER, event
from exporter.tap.background import cancel_and_wait
from exporter.tap.classes import SloConfig

MAX_LABEL_CHARS = 200  # longer names are never label values, even when a glob matches
# 30 s: /v1/models is a cheap call for the engine, and a LoRA adapter loaded at run time is counted
# under its own name within about one Prometheus scrape interval (15-30 s) of its first request.
DEFAULT_REFRESH_S = 30.0
RETRY_S = 5.0  # after a failed read (e.g. an engine still loading its weights), sooner than refresh_s
FETCH_TIMEOUT_S = 5.0
START_WAIT_S = 2.0  # how long TapServer.start waits for the first read before serving without it
MAX_LIST_BYTES = 1 << 20
MAX_IDS = 1024
# Entries of the list, label-worthy or not: an answer of hundreds of thousands of tiny entries is not a
# model list (vLLM lists one entry per model and LoRA adapter), and its decoding time is bounded by this.
MAX_ENTRIES = 4 * MAX_IDS
ENTRIES_PER_SLICE = 64  # list entries decoded between two yields of None (a caller may let others run)

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def refresh_seconds(value: str) -> float:
    """`--models-refresh`: 0 (never read the list) or at least 1 second."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or not (seconds == 0 or seconds >= 1):
        raise argparse.ArgumentTypeError(f"{value!r} is not 0 or a number of seconds of at least 1")
    return seconds


def label_worthy(name: str) -> bool:
    """Short enough and printable: fit to be a label value if the upstream serves it or a glob matches."""
    return 0 < len(name) <= MAX_LABEL_CHARS and name.isprintable()


class ModelListError(ValueError):
    """The upstream's answer to /v1/models is not an OpenAI model list."""


def iter_model_ids(text: str, max_ids: int = MAX_IDS, max_entries: int = MAX_ENTRIES) -> Iterator[str | None]:
    """The label-worthy `id`s of an OpenAI model list ({"data": [{"id": ...}, ...]}), decoded one
    entry at a time; yields None every ENTRIES_PER_SLICE entries so that a caller can let others
    run. Stops after max_ids ids. Raises ModelListError when the text is not such a list, or when
    its list has more than max_entries entries."""
    try:
        i = _skip(text, 0)
        if text[i : i + 1] != "{":
            raise ModelListError("not a JSON object")
        i = _skip(text, i + 1)
        found_data = False
        kept = 0
        while text[i : i + 1] != "}":
            key, i = _DECODER.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or text[i : i + 1] != ":":
                raise ModelListError("not a JSON object")
            i = _skip(text, i + 1)
            if key != "data":
                _, i = _DECODER.raw_decode(text, i)
            else:
                if text[i : i + 1] != "[":
                    raise ModelListError('"data" is not a list')
                found_data = True
                i = _skip(text, i + 1)
                n = 0
                while text[i : i + 1] != "]":
                    if n >= max_entries:
                        raise ModelListError(f"more than {max_entries} entries in the list")
                    entry, i = _DECODER.raw_decode(text, i)
                    model_id = entry.get("id") if isinstance(entry, dict) else None
                    if isinstance(model_id, str) and label_worthy(model_id):
                        yield model_id
                        kept += 1
                        if kept >= max_ids:
                            return
                    n += 1
                    if n % ENTRIES_PER_SLICE == 0:
                        yield None
                    i = _after(text, i, "]")
                i += 1
            i = _after(text, i, "}")
        if not found_data:
            raise ModelListError('no "data" list')
        if _skip(text, i + 1) != len(text):
            raise ModelListError("bytes after the JSON object")
    except ModelListError:
        raise
    except (ValueError, IndexError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
        raise ModelListError(f"not JSON: {type(e).__name__}: {e}") from None


def _skip(text: str, i: int) -> int:
    """Past the JSON whitespace at i."""
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # it matches the empty string too


def _after(text: str, i: int, close: str) -> int:
    """Past the whitespace and the comma after a member or element: at the next one, or at `close`."""
    i = _skip(text, i)
    if text[i : i + 1] == close:
        return i
    if text[i : i + 1] != ",":
        raise ModelListError(f"expected ',' or {close!r} at offset {i}")
    i = _skip(text, i + 1)
    if text[i : i + 1] in (close, ""):
        raise ModelListError(f"expected a value at offset {i}")
    return i


def model_ids(text: str, max_ids: int = MAX_IDS, max_entries: int = MAX_ENTRIES) -> frozenset[str]:
    """iter_model_ids, all at once (in a worker thread: ServedModels.refresh)."""
    return frozenset(i for i in iter_model_ids(text, max_ids, max_entries) if i is not None)


def decode_model_list(body: bytes, max_ids: int = MAX_IDS, max_entries: int = MAX_ENTRIES) -> frozenset[str]:
    """The ids of an answer's raw bytes (UTF-8 decoding included): all the CPU work of a read, for a thread."""
    return model_ids(body.decode("utf-8"), max_ids, max_entries)


class ServedModels:
    """The names the upstream serves, read from its `GET /v1/models` every `refresh_s` seconds.

    `names` is the last list read successfully (empty until one was); a failed read keeps it and
    tries again after RETRY_S. For an https:// upstream the same CA file as the proxy's is trusted.
    """

    def __init__(
        self, upstream: str, ca_file: str = "", refresh_s: float = DEFAULT_REFRESH_S, *,
        timeout_s: float = FETCH_TIMEOUT_S, max_bytes: int = MAX_LIST_BYTES, max_ids: int = MAX_IDS,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.url = upstream.rstrip("/") + "/v1/models"
        # As exporter.tap.upstream.UpstreamPool builds it, so both trust the same CAs.
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=ca_file or None) if upstream.startswith("https://") else None
        )
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_ids = max_ids
        self.max_entries = max_entries
        self.names: frozenset[str] = frozenset()
        self.refreshed_at: float | None = None  # time.monotonic() of the last successful read
        self.last_error = ""
        self.attempts = 0
        self._task: asyncio.Task[None] | None = None
        self._first = asyncio.Event()

    async def refresh(self) -> bool:
        """Read the list once. On success `names` is replaced; on failure it is kept and
        `last_error` says why. Never raises (but for cancellation)."""
        self.attempts += 1
        try:
            body = await self._fetch()
            # Off the relay's loop: the decoding is the whole CPU cost of a read, bounded by max_entries.
            names = await asyncio.to_thread(decode_model_list, body, self.max_ids, self.max_entries)
        except Exception as e:  # noqa: BLE001  (whatever the upstream answers, the tap goes on; e.g. RecursionError)
            error = f"{type(e).__name__}: {e}"[:200]
            if not self.last_error:
                event("tap_models_refresh_failed", logging.WARNING, logger=TAP_LOGGER, url=self.url, error=error,
                      kept=len(self.names))
            self.last_error = error
            return False
        if names != self.names or self.last_error or self.refreshed_at is None:
            event("tap_models_refreshed", logger=TAP_LOGGER, url=self.url, models=len(names))
        self.names = names
        self.refreshed_at = time.monotonic()
        self.last_error = ""
        return True

    async def _fetch(self) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        # A connection per read: one request every refresh_s is not worth keeping one open.
        connector = aiohttp.TCPConnector(ssl=self.ssl or True, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
            async with session.get(self.url, headers={"Accept": "application/json", "Accept-Encoding": "identity"},
                                   allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ModelListError(f"HTTP status {resp.status}")
                if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
                    raise ModelListError("the answer is compressed although identity was asked for")
                if (resp.content_length or 0) > self.max_bytes:
                    raise ModelListError(f"the answer is larger than {self.max_bytes} bytes")
                body = bytearray()
                async for piece in resp.content.iter_chunked(64 * 1024):
                    body += piece
                    if len(body) > self.max_bytes:
                        raise ModelListError(f"the answer is larger than {self.max_bytes} bytes")
        return bytes(body)

    async def _run(self) -> None:
        while True:
            ok = await self.refresh()
            self._first.set()
            await asyncio.sleep(self.refresh_s if ok else min(RETRY_S, self.refresh_s))

    async def start(self, wait_s: float = START_WAIT_S) -> None:
        """Start reading the list periodically; wait up to `wait_s` for the first read to end, so
        that the first requests already find the upstream's names."""
        if self.refresh_s <= 0 or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await asyncio.wait_for(self._first.wait(), wait_s)
        except asyncio.TimeoutError:
            event("tap_models_refresh_slow", logging.WARNING, logger=TAP_LOGGER, url=self.url, waited_s=wait_s,
                  note="serving with class globs only until it answers")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


class ModelNames:
    """Decides whether a model name may be a label value (see the module's docstring)."""

    def __init__(self, slo: SloConfig, served: ServedModels | None = None) -> None:
        self.served = served
        self.set_classes(slo)

    def set_classes(self, slo: SloConfig) -> None:
        """Admit by the globs of `slo`'s classes from now on (a reloaded configuration)."""
        self._globbed = tuple(c for c in slo.classes if c.models)

    def admits(self, name: str) -> bool:
        if not label_worthy(name):
            return False
        if self.served is not None and name in self.served.names:
            return True
        return any(c.matches(name) for c in self._globbed)
