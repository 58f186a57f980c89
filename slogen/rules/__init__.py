"""Pure functions from the SLO model to Prometheus rule groups.

`generate(slos, opts)` runs, for each SLO, Sloth's processor chain: SLO plugins with a
negative priority, then the default generators (SLI rules, metadata rules, alerts), then the
remaining SLO plugins in priority order. `--sloth-compat` is an option the default
generators read, not another path.
"""

from __future__ import annotations

from dataclasses import dataclass

from slogen import plugins
from slogen.model import SLO, RuleGroup, SLORules
from slogen.plugins.contract import PluginError, SLOPlugin
from slogen.rules.alerts import alert_rules
from slogen.rules.bucket_alerts import bucket_edge_groups
from slogen.rules.metadata import meta_rules
from slogen.rules.options import GenOptions, SLOContext
from slogen.rules.sli import sli_rules
from slogen.rules.tiers import resolve

EXTRA_GROUP_PREFIX = "sloth-slo-extra-rules-"


@dataclass
class SLOResult:
    ctx: SLOContext
    rules: SLORules

    @property
    def slo(self) -> SLO:
        return self.ctx.slo


def generate_slo(slo: SLO, opts: GenOptions) -> SLOResult:
    ctx = resolve(slo, opts)
    rules = SLORules(sli=RuleGroup(""), meta=RuleGroup(""), alerts=RuleGroup(""))
    chain = sorted(slo.plugins, key=lambda p: p.priority)  # stable, as Sloth's SortStableFunc
    pre = [_plugin(p, slo) for p in chain if p.priority < 0]
    post = [_plugin(p, slo) for p in chain if p.priority >= 0]
    for plugin in pre:
        _run(plugin, ctx, rules)
    if not slo.override_plugins:
        for part in ("sli", "meta", "alerts"):
            _default(part, ctx, rules)
        rules.extra += bucket_edge_groups(ctx)  # engine latency SLIs: series lacking the threshold's bucket
    for plugin in post:
        _run(plugin, ctx, rules)
    rules.sli.name = rules.sli.name or f"sloth-slo-sli-recordings-{slo.id}"
    rules.meta.name = rules.meta.name or f"sloth-slo-meta-recordings-{slo.id}"
    rules.alerts.name = rules.alerts.name or f"sloth-slo-alerts-{slo.id}"
    for i, extra in enumerate(rules.extra):
        extra.name = extra.name or f"{EXTRA_GROUP_PREFIX}{i:03d}-{slo.id}"
    if opts.disable_alerts:
        rules.alerts.rules = []
    if opts.disable_recordings:
        rules.sli.rules, rules.meta.rules = [], []
    return SLOResult(ctx, rules)


def _run(plugin: SLOPlugin, ctx: SLOContext, rules: SLORules) -> None:
    """A plugin of the chain; Sloth's core rule generators (slogen.plugins.sloth_core) run the default one."""
    part = getattr(plugin, "generates", "")
    if part:
        _default(part, ctx, rules)
    else:
        plugin(ctx.slo, rules)


def _default(part: str, ctx: SLOContext, rules: SLORules) -> None:
    if part == "sli":
        rules.sli.rules = sli_rules(ctx).rules
    elif part == "meta":
        rules.meta.rules = meta_rules(ctx).rules
    else:
        rules.alerts.rules = alert_rules(ctx).rules


def _plugin(ref, slo: SLO) -> SLOPlugin:
    factory = plugins.slo_plugin_factory(ref.id)
    if factory is None:  # the loader already reported it; keep the message if called directly
        raise ValueError(f"unknown SLO plugin {ref.id!r}")
    try:
        return factory(ref.config)
    except PluginError as e:  # a refused config: a spec error naming the plugin, not a traceback
        from slogen.errors import SpecError

        raise SpecError(slo.origin.file, str(e), f"{slo.origin.path}.plugins.chain", slo.id,
                        e.fix or f"fix the config of {ref.id}", slo.origin.line) from None


def generate(slos: list[SLO], opts: GenOptions) -> list[SLOResult]:
    """Rules for every SLO, in input order; SpecErrors collects every SLO that cannot be generated."""
    from slogen.errors import SpecError, SpecErrors

    results, errors = [], []
    for slo in slos:
        try:
            results.append(generate_slo(slo, opts))
        except SpecError as e:
            errors.append(e)
    if errors:
        raise SpecErrors(errors)
    return results
