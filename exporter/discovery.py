"""Kubernetes discovery: the engine pods running on this node, from the API server.

The exporter runs as a DaemonSet, so it lists only pods with `spec.nodeName=<this node>` and
the engine label, using the pod's service account (token re-read each time: projected tokens
rotate), in every namespace or in the configured ones. Pod metadata it reads, all names configurable:

  label      llmslo.io/engine: vllm|sglang|tgi|trtllm-triton|trtllm-serve|llamacpp|tap|auto   (required)
  annotation llmslo.io/metrics-port   (else prometheus.io/port, else the container port named
                                       "metrics", else the pod's only container port)
  annotation llmslo.io/metrics-path   (else prometheus.io/path, else /metrics)
  annotation llmslo.io/metrics-scheme (else prometheus.io/scheme, else http)
  annotation llmslo.io/model          (model label when the page does not name it)
  annotation llmslo.io/tap-port       (a goodput tap sidecar's metrics port: adds a `tap` target)

Only Running pods with an IP that are not terminating become targets, and only at their own IP
and declared ports (exporter/podtargets.py says what an annotation may and may not choose).

The API server's answers are input too: one listing is bounded in pages, items, bytes and JSON
values per page, and time (settings `max_pages`, `max_items`, `listing_timeout`), and pages are turned into
targets as they arrive, so an endless `continue` token or a flood of items costs a bounded
amount of memory and time. Past a bound the listing is abandoned: the caller keeps the last
good list, and the reason is counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from exporter import logs
from exporter.config import KubernetesDiscovery, TargetConfig
from exporter.model import NormSample
from exporter.podtargets import REJECT_REASONS, Rejection, is_candidate, targets_for_pod
from exporter.sources import PAGE_TOO_LARGE, FetchError, http_status_reason
from exporter.sources.http import fetch_http
from llmslo import conventions as c

PAGE_LIMIT = 100  # pods asked for per page (`limit=`): a node rarely runs more than 110, so one page as a rule
REQUEST_TIMEOUT_S = 10.0
# What one answer may cost before it is refused, sized for PAGE_LIMIT pods of up to 40 KiB of JSON each
# (a real pod, managedFields included, is some 5-20 KiB). Parsed JSON costs up to 30 times its bytes
# (millions of `{}`), so the bytes alone would still allow some 120 MiB; the JSON values are therefore
# counted on the raw bytes first (every `,` `:` `{` `[`, an upper bound), and a page of more than one
# value per 4 bytes, denser than any real pod list (managedFields, the densest part, has one per 4-5),
# is refused before anything is parsed. Parsing what passes costs at most some 40 MiB and 50 ms.
MAX_PAGE_BYTES = 4 * 1024 * 1024
MAX_PAGE_VALUES = MAX_PAGE_BYTES // 4
MAX_SKIP_MEMORY = 10_000  # (pod, reason) pairs remembered to log each once; pod churn must not grow it


def json_values_at_most(raw: bytes | bytearray) -> int:
    """An upper bound on the values and keys in a JSON text, counted without parsing it: each but the first
    of an object or array follows a `,` or `:`, the first an `{` or `[` (strings' own such characters count too)."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"{") + raw.count(b"[") + 1


class DiscoveryError(Exception):
    """The API server could not be asked or refused; the message says what to check."""

    reason = c.ABANDONED_ERROR


class ListingAbandoned(DiscoveryError):
    """A listing hit one of its bounds; `reason` is one of conventions.ABANDONED_REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class KubernetesDiscoverer:
    def __init__(self, settings: KubernetesDiscovery, node_name: str):
        self.settings = settings
        self.node_name = node_name
        self._session: aiohttp.ClientSession | None = None
        self._skipped: set[tuple[str, str]] = set()
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.abandoned = dict.fromkeys(c.ABANDONED_REASONS, 0)
        self.last_success = 0.0  # unix time of the last complete listing

    # ------------------------------------------------------------------ API access
    def api_base(self) -> str:
        if self.settings.api_server:
            return self.settings.api_server.rstrip("/")
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise DiscoveryError(
                "not in a cluster: KUBERNETES_SERVICE_HOST is unset (set kubernetes_discovery.api_server to reach one from outside)"
            )
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def _headers(self) -> dict[str, str]:
        token_file = Path(self.settings.service_account_dir) / "token"
        try:
            token = token_file.read_text().strip()
        except OSError:
            if self.settings.api_server:
                return {}  # e.g. kubectl proxy: no token needed
            raise DiscoveryError(f"cannot read the service-account token {token_file}") from None
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def _session_for_api(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ca = Path(self.settings.service_account_dir) / "ca.crt"
            ssl_ctx: ssl.SSLContext | bool = True
            if ca.exists():
                ssl_ctx = ssl.create_default_context(cafile=str(ca))
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=4),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _list_urls(self) -> list[str]:
        base = self.api_base()
        query = f"fieldSelector={quote('spec.nodeName=' + self.node_name, safe='')}&limit={PAGE_LIMIT}"
        if self.settings.label_selector:
            query += f"&labelSelector={quote(self.settings.label_selector, safe='')}"
        if not self.settings.namespaces:
            return [f"{base}/api/v1/pods?{query}"]
        return [f"{base}/api/v1/namespaces/{quote(ns, safe='')}/pods?{query}" for ns in self.settings.namespaces]

    async def _page(self, session: aiohttp.ClientSession, url: str) -> tuple[list[Any], str]:
        """One page: its items and its continue token; the body is read up to MAX_PAGE_BYTES."""
        try:
            raw = await fetch_http(session, url, timeout_s=REQUEST_TIMEOUT_S, max_bytes=MAX_PAGE_BYTES, headers=self._headers())
        except FetchError as exc:
            if exc.reason in (http_status_reason(401), http_status_reason(403)):
                where = "a Role in each of kubernetes_discovery.namespaces" if self.settings.namespaces else "a ClusterRole"
                raise DiscoveryError(
                    f"API server answered HTTP {exc.reason[5:]}: the exporter's service account needs "
                    f"get, list on pods ({where}) bound to it"
                ) from None
            if exc.reason == PAGE_TOO_LARGE:
                raise ListingAbandoned(c.ABANDONED_BYTES, f"a page is over {MAX_PAGE_BYTES} bytes") from None
            raise DiscoveryError(f"listing pods failed: {exc}") from None
        if (values := json_values_at_most(raw)) > MAX_PAGE_VALUES:
            raise ListingAbandoned(c.ABANDONED_BYTES, f"a page holds up to {values} JSON values, over {MAX_PAGE_VALUES} (no pod list is that dense)")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise DiscoveryError("listing pods failed: the answer is not JSON") from None
        del raw
        meta = body.get("metadata") if isinstance(body, dict) else None
        items = body.get("items") or [] if isinstance(body, dict) else None
        cont = (meta.get("continue") if isinstance(meta, dict) else "") or ""
        if not isinstance(items, list) or not isinstance(cont, str):
            raise DiscoveryError("listing pods failed: the answer is not a PodList object")
        return items, cont

    async def _list_targets(self) -> list[TargetConfig]:
        """Every page of every namespace, each turned into targets as it arrives, within the bounds."""
        s = self.settings
        session = self._session_for_api()
        targets: list[TargetConfig] = []
        rejected = dict.fromkeys(REJECT_REASONS, 0)
        pages = items = 0
        for url in self._list_urls():
            cont = ""
            while True:
                if pages >= s.max_pages:
                    raise ListingAbandoned(c.ABANDONED_PAGES, f"the listing passed {s.max_pages} pages (max_pages)")
                page, cont = await self._page(session, url + (f"&continue={quote(cont, safe='')}" if cont else ""))
                pages += 1
                items += len(page)
                if items > s.max_items:
                    raise ListingAbandoned(c.ABANDONED_ITEMS, f"the listing passed {s.max_items} pods (max_items)")
                for pod in page:
                    if isinstance(pod, dict) and is_candidate(pod, self.node_name):
                        found = targets_for_pod(pod, s)
                        targets.extend(found.targets)
                        for r in found.rejections:
                            rejected[r.reason] += 1
                            self._log_rejection(pod, r)
                del page
                if not cont:
                    break
        for reason, n in rejected.items():  # counted once the listing is complete: one count per listing
            self.rejected[reason] += n
        return targets

    # ------------------------------------------------------------------ pods -> targets
    async def discover(self) -> list[TargetConfig]:
        """The targets of one complete listing; raises DiscoveryError (counted by reason) otherwise."""
        try:
            async with asyncio.timeout(self.settings.listing_timeout_s):
                targets = await self._list_targets()
        except TimeoutError:
            self.abandoned[c.ABANDONED_TIME] += 1
            raise ListingAbandoned(
                c.ABANDONED_TIME, f"the listing took over {self.settings.listing_timeout_s:g} s (listing_timeout)"
            ) from None
        except DiscoveryError as exc:
            self.abandoned[exc.reason] += 1
            raise
        self.last_success = time.time()
        return sorted(targets, key=lambda t: t.label)

    def targets_for_pod(self, pod: dict[str, Any]) -> list[TargetConfig]:
        """The targets one pod yields (none unless it is a candidate on this node); refusals are logged."""
        if not is_candidate(pod, self.node_name):
            return []
        found = targets_for_pod(pod, self.settings)
        for r in found.rejections:
            self._log_rejection(pod, r)
        return list(found.targets)

    def _log_rejection(self, pod: dict[str, Any], r: Rejection) -> None:
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        who = f"{str(meta.get('namespace', ''))[:63]}/{str(meta.get('name', ''))[:253]}"
        if len(self._skipped) > MAX_SKIP_MEMORY:
            self._skipped.clear()
        if (who, r.reason + r.key) not in self._skipped:  # log once per pod and reason
            self._skipped.add((who, r.reason + r.key))
            logs.event("discovery_rejected_pod", logging.WARNING, pod=who, annotation=r.key, reason=r.reason, detail=r.why)

    def self_metrics(self) -> list[NormSample]:
        """Discovery's counters for the snapshot: refusals and abandoned listings by reason, last success."""
        out = [NormSample(c.EXPORTER_DISCOVERY_REJECTED, {c.LABEL_REASON: r}, float(n)) for r, n in self.rejected.items()]
        out += [NormSample(c.EXPORTER_DISCOVERY_ABANDONED, {c.LABEL_REASON: r}, float(n)) for r, n in self.abandoned.items()]
        out.append(NormSample(c.EXPORTER_DISCOVERY_LAST_SUCCESS, {}, self.last_success))
        return out
