"""Sloth's Kubernetes CRD, `sloth.slok.dev/v1` `PrometheusServiceLevel`: the same model as
`prometheus/v1` with camelCase keys under `spec:`; its metadata names the PrometheusRule."""

from __future__ import annotations

from slogen.loaders import sloth
from slogen.loaders.common import Reporter
from slogen.model import SLO

API_VERSION = "sloth.slok.dev/v1"
KIND = "PrometheusServiceLevel"


def is_spec(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("apiVersion") == API_VERSION and doc.get("kind") == KIND


def load(doc: dict, r: Reporter, doc_index: int) -> list[SLO]:
    return sloth.load(doc, r, doc_index, sloth.K8S_V1)
