"""The GPU-to-pod mapping handed from `llmslo-exporter podmap` to the exporter, over the pod network.

Why two processes: reading the kubelet's pod-resources socket needs a hostPath mount and the socket's owner
(root), which Pod Security refuses from `baseline` up. So the exporter stays non-root with no host access,
and a small relay (exporter/gpu/podmap_server.py) alone mounts the socket, in its own namespace that allows
exactly that; the exporter asks the relay on its own node (a Service with internalTrafficPolicy: Local) and
checks the answer names its node.

The wire is one JSON object, `{"node": NAME, "owners": [{"device", "pod", "namespace", "container"}, ...]}`,
or `{"node": NAME, "error": REASON}` with status 503. What the exporter reads is bounded as the kubelet's
answer is (MAX_DEVICES NVIDIA device IDs, names cut at MAX_NAME_CHARS, MAX_ANSWER_BYTES in all).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from exporter.gpu.owners import MAX_DEVICES, MAX_NAME_CHARS, NVIDIA_ID_PREFIXES, DeviceOwner, DeviceOwners
from exporter.gpu.podresources import PodResourcesError

OWNERS_PATH = "/v1/owners"
# MAX_DEVICES entries of four names each, at their longest, with JSON's quoting: well under this.
MAX_ANSWER_BYTES = MAX_DEVICES * (4 * MAX_NAME_CHARS + 64) * 2


def encode(node: str, owners: DeviceOwners) -> bytes:
    rows = [{"device": d, "pod": o.pod, "namespace": o.namespace, "container": o.container} for d, o in owners.items()]
    return json.dumps({"node": node, "owners": rows}, separators=(",", ":")).encode()


def encode_error(node: str, reason: str) -> bytes:
    return json.dumps({"node": node, "error": reason[:500]}).encode()


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise PodResourcesError(f"the podmap's answer has a {key} that is not a string")
    return value


def decode(body: bytes, node: str) -> DeviceOwners:
    """The owners in a relay's answer, checked: it must come from `node` (when both know their node)."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise PodResourcesError("the podmap's answer is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("owners", []), list):
        raise PodResourcesError("the podmap's answer is not an object with an owners list")
    theirs = doc.get("node")
    if node and theirs and theirs != node:
        raise PodResourcesError(f"the podmap that answered runs on node {str(theirs)[:MAX_NAME_CHARS]!r}, not on "
                                f"{node!r}: its Service must route node-locally (internalTrafficPolicy: Local)")
    if "error" in doc:
        raise PodResourcesError(f"the podmap cannot read the kubelet: {str(doc['error'])[:500]}")
    owners: DeviceOwners = {}
    for row in doc["owners"]:
        if not isinstance(row, dict):
            raise PodResourcesError("the podmap's answer has an owner that is not an object")
        device = _text(row, "device")
        if device.startswith(NVIDIA_ID_PREFIXES) and device not in owners and len(owners) < MAX_DEVICES:
            owners[device[:MAX_NAME_CHARS]] = DeviceOwner.of(_text(row, "pod"), _text(row, "namespace"),
                                                              _text(row, "container"))
    return owners


class PodMapClient:
    """The exporter's side: one GET per cycle to the relay on this node. The same face as PodResourcesClient."""

    def __init__(self, url: str, node: str, timeout_s: float) -> None:
        self.source = url
        self.node = node
        self.timeout_s = timeout_s
        # No proxy: the relay is on this node's pod network, and a proxy from the environment must not see it.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def list_owners(self) -> DeviceOwners:
        try:
            with self._opener.open(self.source, timeout=self.timeout_s) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:  # 503 carries the relay's reason
            body = exc.read(MAX_ANSWER_BYTES + 1)
            if exc.code != 503:
                raise PodResourcesError(f"{self.source} answered {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise PodResourcesError(f"cannot reach the podmap at {self.source}: {getattr(exc, 'reason', exc)}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise PodResourcesError(f"the podmap's answer is over {MAX_ANSWER_BYTES} bytes")
        return decode(body, self.node)

    def close(self) -> None:
        pass


__all__ = ["MAX_ANSWER_BYTES", "OWNERS_PATH", "PodMapClient", "decode", "encode", "encode_error"]
