"""The committed dashboards, runbooks and deploy/ files are what `slogen build` makes of slos/ now."""

from __future__ import annotations

import os
from pathlib import Path

from slogen.build import build
from slogen.catalog import BuildOptions
from slogen.steps import STEPS

ROOT = Path(__file__).resolve().parents[2]


def repository_options(**fields) -> BuildOptions:
    """What `slogen build` runs with in this repository: its install settings (llmslo.yaml) applied."""
    from slogen import settings
    from slogen.k8smeta import KubeOptions, ObjectMeta

    s = settings.load(ROOT / "llmslo.yaml")
    return BuildOptions(kube=KubeOptions(meta=ObjectMeta(dict(s.object_labels)), namespace=s.namespace,
                                         receivers=dict(s.receivers)), install=s, **fields)


def test_committed_artifacts_are_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # `slogen build` runs from the repository root
    options = repository_options()
    artifacts = {"dashboards", "runbooks", "kubernetes"}  # the committed dashboards/, docs/runbooks/, deploy/ files
    files = build(options, [s for s in STEPS if s.name in artifacts]).files
    stale = [p for p, text in files.items() if not (ROOT / p).is_file() or (ROOT / p).read_text() != text]
    assert stale == [], "run `slogen build` and commit: " + ", ".join(stale)
    for folder, suffix in (("dashboards", ".json"), ("docs/runbooks", ".md")):
        committed = {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob("*" + suffix)}
        orphans = committed - set(files)
        assert orphans == set(), f"{folder} holds files no SLO or alert produces: {sorted(orphans)}"
    assert os.path.isfile(ROOT / "deploy" / "generated" / "kustomization.yaml")
