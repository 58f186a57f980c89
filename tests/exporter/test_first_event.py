"""The first error counts (#26): every model with a finished-requests series gets every reason at 0."""

from __future__ import annotations

from exporter.model import NormSample
from exporter.series import with_every_reason
from llmslo import conventions as c


def test_every_reason_is_written_at_0_for_each_model_seen():
    ident = {c.LABEL_ENGINE: "sglang", c.LABEL_POD: "p"}
    adapted = [NormSample(c.REQUESTS_FINISHED, {**ident, c.LABEL_MODEL: "m", c.LABEL_REASON: c.FINISHED_COMPLETED}, 4.0),
               NormSample(c.KV_CACHE_USAGE, {**ident, c.LABEL_MODEL: "m"}, 0.5)]
    out = with_every_reason(adapted)
    finished = {s.labels[c.LABEL_REASON]: s.value for s in out if s.metric is c.REQUESTS_FINISHED}
    assert finished == {**dict.fromkeys(c.FINISHED_REASONS, 0.0), c.FINISHED_COMPLETED: 4.0}
    assert all(s.labels[c.LABEL_MODEL] == "m" and s.labels[c.LABEL_POD] == "p"
               for s in out if s.metric is c.REQUESTS_FINISHED)


def test_nothing_is_added_without_a_finished_series():
    adapted = [NormSample(c.KV_CACHE_USAGE, {c.LABEL_MODEL: "m"}, 0.5)]
    assert with_every_reason(adapted) is adapted
