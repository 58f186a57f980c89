"""The tap's TTFT, TPOT and request duration again under the OpenTelemetry GenAI names (`--genai-names`).

A dashboard built for Envoy AI Gateway reads `gen_ai_server_time_to_first_token_seconds` and its siblings
(llmslo.genai: names, labels and the convention's buckets, TTFT to 60 s as Envoy has it); with this option on,
it reads the tap as it is. Off by default: it is a second copy of three histograms per model.

What is observed, so that the counts equal the tap's own histograms' (exporter.tap.metrics): TTFT and TPOT of
every request that ended `ok` and has them (streamed), and the duration of every request that ended `ok`;
a request that ended badly (conventions.TAP_BAD_OUTCOMES) adds its duration under `error_type="<its outcome>"`
(a small fixed set; Envoy AI Gateway writes `_OTHER` for every failure). A neutral outcome (the client left
on time, or the request was at fault: 4xx) is left out, as it is from every total of the tap's. The labels are
bounded: the model label value is the tap's own (exporter.tap.models: at most MAX_MODELS names and `__other__`),
the operation one of two, the provider a constant; `gen_ai_response_model` is that same value, since the tap
does not read the response's model field (an OpenAI-compatible engine answers with the name it was asked for).
Not by slo_class: the convention has no such attribute, and the tap's own histograms carry it.

One series' lines are rendered again only when it changed, as the tap's own are (exporter.tap.exposition).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import HistogramMetricFamily, Metric

from exporter.tap.histogram import Histogram
from exporter.tap.timing import Timings
from llmslo import conventions as C
from llmslo import genai as G
from llmslo.gofloat import client_float

OPERATIONS = {"/v1/chat/completions": G.OPERATION_CHAT, "/v1/completions": G.OPERATION_TEXT_COMPLETION}
# In page order: each family, its bucket edges, and which Timings field it observes.
FAMILIES = ((G.SERVER_TTFT, G.TTFT_EDGES, "ttft"), (G.SERVER_TPOT, G.TPOT_EDGES, "tpot"),
            (G.SERVER_REQUEST_DURATION, G.REQUEST_DURATION_EDGES, "e2e"))


def operation(path: str) -> str:
    """The gen_ai.operation.name of a timed request's path (its query left out)."""
    return OPERATIONS.get(path.partition("?")[0], G.OPERATION_CHAT)


class GenAISeries:
    """One (model, operation, error_type) label set: a histogram per family (error series: the duration only)."""

    __slots__ = ("model", "operation", "error_type", "hists", "changes", "rendered", "rendered_at")

    def __init__(self, model: str, op: str, error_type: str) -> None:
        self.model, self.operation, self.error_type = model, op, error_type
        self.hists = tuple(Histogram(edges) for _, edges, _ in FAMILIES)
        self.changes = 0
        self.rendered: list[bytes] = []
        self.rendered_at = -1

    def observe(self, i: int, value: float) -> None:
        self.hists[i].observe(value)

    def labels(self, with_error: bool) -> list[tuple[str, str]]:
        out = [(G.LABEL_OPERATION, self.operation), (G.LABEL_PROVIDER, G.PROVIDER_OPENAI),
               (G.LABEL_REQUEST_MODEL, self.model), (G.LABEL_RESPONSE_MODEL, self.model)]
        return out + [(G.LABEL_ERROR_TYPE, self.error_type)] if with_error and self.error_type else out

    def families(self) -> range:
        """The indexes into FAMILIES this series has: all three, or the duration alone for a failed request's."""
        return range(len(FAMILIES)) if not self.error_type else range(len(FAMILIES) - 1, len(FAMILIES))


class GenAIHistograms:
    """The GenAI histograms of one tap process, recorded beside the tap's own (TapMetrics.record)."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], GenAISeries] = {}

    def _for(self, model: str, op: str, error_type: str) -> GenAISeries:
        key = (model, op, error_type)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = GenAISeries(model, op, error_type)
        return s

    def record(self, model: str, path: str, outcome: str, t: Timings) -> None:
        """One finished timed request; `model` is its label value (exporter.tap.metrics.TapMetrics.model_label)."""
        op = operation(path)
        if outcome != C.OUTCOME_OK:
            if t.e2e is not None and outcome in C.TAP_BAD_OUTCOMES:
                s = self._for(model, op, outcome)
                s.observe(2, t.e2e)
                s.changes += 1
            return
        s = self._for(model, op, "")
        for i, value in enumerate((t.ttft, t.tpot, t.e2e)):
            if value is not None:
                s.observe(i, value)
        s.changes += 1

    # -- the page ---------------------------------------------------------------------------------
    def stale(self) -> list[GenAISeries]:
        """The series that changed since their lines were last rendered."""
        return [s for s in self.series.values() if s.rendered_at != s.changes]

    @staticmethod
    def refresh(s: GenAISeries, escape: Callable[[str], str]) -> None:
        """Render one series' lines again; `escape`: the text format's label-value escape
        (exporter.tap.exposition.escape_label_value). The renderer calls it in slices, between turns of the loop."""
        at = s.changes
        s.rendered = [_series_lines(s, i, escape) if i in s.families() else b"" for i in range(len(FAMILIES))]
        s.rendered_at = at

    def render(self, escape: Callable[[str], str]) -> list[bytes]:
        """Each family's header and lines (a series still stale is rendered here, in one go)."""
        for s in self.stale():
            self.refresh(s, escape)
        series = list(self.series.values())
        parts: list[bytes] = []
        for i, (d, _, _) in enumerate(FAMILIES):
            parts.append(f"# HELP {d.name} {d.help}\n# TYPE {d.name} histogram\n".encode())
            parts.extend(s.rendered[i] for s in series)
        return parts

    def collect(self) -> Iterator[Metric]:
        """The same values as prometheus_client families (the tap's registry: tests, tools)."""
        for i, (d, edges, _) in enumerate(FAMILIES):
            fam = HistogramMetricFamily(d.name, d.help, labels=d.labels if i == 2 else d.labels[:4])
            for s in self.series.values():
                if i in s.families():
                    les = [client_float(e) for e in edges] + ["+Inf"]
                    cumulative = s.hists[i].cumulative()
                    values = [v for _, v in s.labels(i == 2)]
                    if i == 2 and not s.error_type:
                        values.append("")  # prometheus_client writes an empty label; the page leaves it out
                    fam.add_metric(values, list(zip(les, cumulative, strict=True)), s.hists[i].sum)
            yield fam


def _series_lines(s: GenAISeries, i: int, escape: Callable[[str], str]) -> bytes:
    d, edges, _ = FAMILIES[i]
    labels = ",".join(f'{k}="{escape(v)}"' for k, v in s.labels(True))
    h = s.hists[i]
    lines, total = [], 0
    for edge, n in zip((*(client_float(e) for e in edges), "+Inf"), h.counts, strict=True):
        total += n
        lines.append(f'{d.name}_bucket{{{labels},le="{edge}"}} {total}\n')
    lines.append(f"{d.name}_sum{{{labels}}} {client_float(h.sum)}\n{d.name}_count{{{labels}}} {total}\n")
    return "".join(lines).encode()
