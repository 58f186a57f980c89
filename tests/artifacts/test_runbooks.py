"""Runbooks: one per alert, the four sections, PromQL that parses and names real series."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from slogen.artifacts import runbooks as rb
from slogen.views import AlertView
from tests.helpers.promql_names import metric_names

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["Meaning", "Impact", "Diagnosis", "Mitigation"]


def promql_lines(markdown: str) -> list[str]:
    """Every query in ```promql blocks: one per line, comments stripped."""
    out = []
    for block in re.findall(r"```promql\n(.*?)```", markdown, re.DOTALL):
        for line in block.splitlines():
            line = line.split("   #")[0].strip()
            if line:
                out.append(line)
    return out


@pytest.fixture
def files(sample_alerts) -> dict[str, str]:
    return rb.runbook_files(sample_alerts)


def test_one_runbook_per_alert_name(files, sample_alerts):
    assert set(files) == {f"docs/runbooks/{a.name}.md" for a in sample_alerts}


def test_sections_in_order_and_not_empty(files):
    for path, text in files.items():
        headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
        assert headings == SECTIONS, path
        for section in SECTIONS:
            body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
            assert len(body.strip()) > 80, (path, section)
        assert text.startswith(f"# {Path(path).stem}\n")


def test_every_topic_template_renders(sample_alerts):
    rendered = {rb.topic(a) for a in sample_alerts} | {rb.topic(AlertView("KV", rb.TOPIC_KV_SATURATION)),
                                                        rb.topic(AlertView("GPU", rb.TOPIC_GPU_HEALTH)),
                                                        rb.topic(AlertView("DOWN", rb.TOPIC_TARGET_DOWN)),
                                                        rb.topic(AlertView("TAP", rb.TOPIC_TAP_REFUSALS)),
                                                        rb.topic(AlertView("DRIFT", rb.TOPIC_TAP_CONFIG_DRIFT)),
                                                        rb.topic(AlertView("REFUSED", rb.TOPIC_ENGINE_REFUSALS)),
                                                        rb.topic(AlertView("FOREIGN", rb.TOPIC_POOL_FOREIGN_POD)),
                                                        rb.topic(AlertView("OFF", rb.TOPIC_SERVING_OFF_POOL)),
                                                        rb.topic(AlertView("BLIND", rb.TOPIC_POOL_UNWATCHED)),
                                                        rb.topic(AlertView("INJECT", rb.TOPIC_TAP_INJECTOR))}
    assert rendered == set(rb.TOPICS)
    for name in (rb.TOPIC_GPU_HEALTH, rb.TOPIC_KV_SATURATION, rb.TOPIC_TARGET_DOWN, rb.TOPIC_TAP_REFUSALS,
                 rb.TOPIC_TAP_CONFIG_DRIFT, rb.TOPIC_ENGINE_REFUSALS, rb.TOPIC_POOL_FOREIGN_POD,
                 rb.TOPIC_SERVING_OFF_POOL, rb.TOPIC_POOL_UNWATCHED, rb.TOPIC_TAP_INJECTOR):
        text = rb.render_runbook(AlertView(name.upper(), name, summary="Something is wrong."))
        assert re.findall(r"^## (.+)$", text, re.MULTILINE) == SECTIONS


def test_promql_parses_and_names_defined_series(files, check_exprs):
    known = {c.PROM_ALERTS}
    for m in c.ALL_METRICS:
        known |= {m.bucket(), m.count(), m.sum()} if m.kind == "histogram" else {m.name}
    exprs = {}
    for path, text in files.items():
        lines = promql_lines(text)
        assert len(lines) >= 3, path
        for i, line in enumerate(lines):
            names = {n for n in metric_names(line) if not n.startswith("slo:")}
            assert names <= known, (path, line, names - known)
            exprs[f"{path}#{i}"] = line
    check_exprs(exprs)


def _names(text: str) -> set[str]:
    return set().union(*(metric_names(q) for q in promql_lines(text)))


def test_ttft_runbook_looks_at_queue_kv_preemptions_prefill_and_prompts(files):
    text = files["docs/runbooks/ChatTTFTBudgetBurn.md"]
    names = _names(text)
    for name in (c.REQUESTS_WAITING.name, c.KV_CACHE_USAGE.name, c.KV_BLOCKS_FREE.name, c.PREEMPTIONS.name,
                 c.PROMPT_TOKENS.name, c.QUEUE_TIME.bucket(), c.TAP_TTFT.bucket(), c.PREFIX_CACHE_HITS.name):
        assert name in names, name
    assert "--enable-chunked-prefill" in text and "--max-num-batched-tokens" in text
    assert 'slo_class="interactive"' in text  # scoped to the SLO's class
    assert 'le=~"0\\\\.50*"' in text  # share over the 0.5 s threshold, at the bucket edge, spelt as the SLI rule


def test_tpot_runbook_looks_at_batch_size_decode_contention_and_kv(files):
    text = files["docs/runbooks/ChatTPOTBudgetBurn.md"]
    names = _names(text)
    for name in (c.REQUESTS_RUNNING.name, c.ITL.bucket(), c.TPOT.bucket(), c.PREEMPTIONS.name, c.KV_CACHE_USAGE.name):
        assert name in names, name
    assert "--max-num-seqs" in text and "decode" in text.lower()


def test_goodput_kv_and_no_data_runbooks(files):
    goodput = _names(files["docs/runbooks/ChatGoodputBudgetBurn.md"])
    assert {c.GOODPUT_REQUESTS.name, c.TAP_REQUESTS.name, c.TAP_TPOT.bucket()} <= goodput
    kv = files["docs/runbooks/ChatKVHeadroomBudgetBurn.md"]
    assert "over 90% than" in kv and {c.KV_BLOCKS_FREE.name, c.PREEMPTIONS.name} <= _names(kv)
    no_data = _names(files["docs/runbooks/SLOSourceAbsent.md"])
    assert {c.EXPORTER_TARGET_UP.name, c.EXPORTER_LAST_ERROR.name} <= no_data
    for path, text in files.items():
        if path.endswith(("NoData.md", "NotABucketEdge.md")) or "SourceAbsent" in path:
            continue  # a measurement problem, not a burn: no GPU to look at
        assert c.GPU_UP.name in _names(text) or "kv" in path.lower() or "Legacy" in path, path


def test_kubectl_commands_use_the_real_names(files):
    """Discovery label, exporter namespace and DaemonSet name match the exporter and slogen/kustomize/base."""
    from exporter.config import KubernetesDiscovery
    from slogen import settings

    daemonset = yaml.safe_load((ROOT / "slogen" / "kustomize" / "base" / "daemonset.yaml").read_text())
    d = rb.EngineDiscovery()
    assert d.engine_label == KubernetesDiscovery().engine_label
    assert d.exporter_daemonset == daemonset["metadata"]["name"]
    assert d.exporter_namespace == settings.load(ROOT / "llmslo.yaml").namespace
    text = files["docs/runbooks/SLOSourceAbsent.md"]
    assert f"kubectl -n {d.exporter_namespace} get ds {d.exporter_daemonset}" in text
    assert f"-l {d.engine_label}" in files["docs/runbooks/ChatTTFTBudgetBurn.md"]


def test_runbooks_link_their_dashboards(files):
    text = files["docs/runbooks/ChatTTFTBudgetBurn.md"]
    links = re.findall(r"\]\((\.\./\.\./dashboards/[^)]+)\)", text)
    assert sorted(links) == ["../../dashboards/llm-serving-fleet.json", "../../dashboards/slo-chat-ttft.json"]


def test_rendering_is_deterministic(files, sample_alerts):
    assert rb.runbook_files(list(reversed(sample_alerts))) == files


# ------------------------------------------------------------------ health alerts' runbooks


@pytest.fixture
def health_files() -> dict[str, str]:
    from slogen.rules import health
    from slogen.views import health_alert_views

    alerts = health.health_alerts(health.HealthOptions(), "https://runbooks.example.com")
    return rb.runbook_files(health_alert_views(alerts))


def test_health_runbooks_have_the_sections_and_their_condition(health_files, check_exprs):
    assert set(health_files) == {f"docs/runbooks/{name}.md" for name in c.HEALTH.ALERTS}
    test_sections_in_order_and_not_empty(health_files)
    test_promql_parses_and_names_defined_series(health_files, check_exprs)
    assert "| Fires when | `llm_gpu_up == 0` for 2m (severity `critical`) |" in health_files["docs/runbooks/LLMGpuLost.md"]
    assert "` at once (severity `warning`) |" in health_files["docs/runbooks/LLMGpuXidErrors.md"]
    assert "[SLO](" not in "".join(health_files.values())  # no SLO, so no SLO dashboard link


def test_health_runbooks_look_at_their_signals(health_files):
    gpu = {c.GPU_UP.name, c.GPU_XID_ERRORS.name, c.GPU_ECC_ERRORS.name, c.GPU_CLOCK_EVENT.name}
    kv = {c.KV_CACHE_USAGE.name, c.KV_BLOCKS_FREE.name, c.PREEMPTIONS.name, c.REQUESTS_WAITING.name}
    for name, expected in ((c.HEALTH.GPU_LOST, gpu), (c.HEALTH.GPU_XID_ERRORS, gpu), (c.HEALTH.GPU_ECC_UNCORRECTED, gpu),
                           (c.HEALTH.KV_CACHE_SATURATED, kv), (c.HEALTH.PREEMPTION_STORM, kv),
                           (c.HEALTH.ENGINE_TARGET_DOWN, {c.EXPORTER_TARGET_UP.name, c.EXPORTER_LAST_ERROR.name, c.GPU_UP.name}),
                           (c.HEALTH.TAP_REFUSING_REQUESTS, {c.TAP_REFUSALS.name, c.TAP_REQUESTS.name, c.REQUESTS_WAITING.name})):
        text = health_files[f"docs/runbooks/{name}.md"]
        assert expected <= _names(text), (name, expected - _names(text))
    assert "kubectl cordon" in health_files[f"docs/runbooks/{c.HEALTH.GPU_LOST}.md"]
    assert "--gpu-memory-utilization" in health_files[f"docs/runbooks/{c.HEALTH.KV_CACHE_SATURATED}.md"]
    assert "kubectl -n \"$NS\" logs" in health_files[f"docs/runbooks/{c.HEALTH.ENGINE_TARGET_DOWN}.md"]
    tap = health_files[f"docs/runbooks/{c.HEALTH.TAP_REFUSING_REQUESTS}.md"]
    assert all(f in tap for f in ("--max-connections", "--max-buffered-body-bytes", "--workers", "../metrics.md#relaying"))
    assert 'reason=~"connection_limit|body_memory"' in tap


def test_latency_runbooks_match_bucket_edges_exactly_as_their_rules_do() -> None:
    """A runbook's PromQL must agree with the alert it explains, `le` spelling included (`0.5` and `0.50`)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    rules = "".join(p.read_text() for p in (repo / "alerts").glob("*.rules.yaml"))
    checked = 0
    for runbook in (repo / "docs" / "runbooks").glob("*BudgetBurn.md"):
        if "TTFT" not in runbook.name and "TPOT" not in runbook.name:
            continue
        for le in re.findall(r'le=~"([^"]+)"', runbook.read_text()):
            assert f'le=~"{le}"' in rules, (runbook.name, le)
            checked += 1
    assert checked >= 4


def test_runbooks_explain_the_late_outcomes_of_a_hang(files):
    """Tap SLOs' runbooks show the late requests (what a hung engine looks like at the tap) with the SLO's
    class; engine-sourced ones say that they cannot see a hang; availability explains every outcome."""
    late = f'{c.LABEL_OUTCOME}=~"{"|".join(c.TAP_LATE_OUTCOMES)}"'
    for name in ("ChatTTFTBudgetBurn", "ChatE2EBudgetBurn", "ChatGoodputBudgetBurn"):
        text = files[f"docs/runbooks/{name}.md"]
        queries = [line for line in promql_lines(text) if late in line]
        assert queries and all('slo_class="' in line for line in queries), name
        assert all(f"`{o}`" in text for o in c.TAP_LATE_OUTCOMES) and "hung" in text, name
    for name in ("ChatTPOTBudgetBurn", "ChatITLBudgetBurn"):  # source: engine
        assert "This SLI cannot see a hang." in files[f"docs/runbooks/{name}.md"], name
    assert "cannot see a hang" not in files["docs/runbooks/ChatTTFTBudgetBurn.md"]
    availability = files["docs/runbooks/ChatAvailabilityBudgetBurn.md"]
    assert all(f"`{o}`" in availability for o in c.OUTCOMES if o != c.OUTCOME_OK)
    assert any(late in line for line in promql_lines(availability))
    assert "cannot see a hung engine" in availability  # the sample's availability SLO reads the engine
