"""Evaluates a ValidatingAdmissionPolicy and its binding on one admission request, in Python.

The CEL runs in cel-expr-python (Google's cel-cpp, with the strings extension that gives
`list.join`), so the policy's expressions are executed, not only parsed. Around the CEL this
follows the API server's order (KEP-3488): match constraints, the binding's namespace selector,
matchConditions (false: not applied), variables, then each validation; an expression that errors
follows failurePolicy; a failed validation's message comes from messageExpression when it
evaluates to a non-empty string, else message, else "failed expression: <expression>".

Not implemented (the floor uses none of them): paramKind/params, `authorizer`, auditAnnotations,
matchExpressions and excludeResourceRules, resourceNames, objectSelector, matchPolicy
(Equivalent), namespace selector expressions, CEL cost limits, and the API server's schema-typed
compile-time checks (here `object` is dynamic, as at the API server's run time). Variables are
evaluated eagerly in order, not lazily: an erroring unused variable fails here, not there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

VARIABLES = ("object", "oldObject", "request", "namespaceObject", "params", "variables")


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionRequest the policy can see."""

    operation: str  # CREATE or UPDATE
    object: dict[str, Any]
    namespace_labels: dict[str, str]
    old_object: dict[str, Any] | None = None
    resource: str = "pods"
    sub_resource: str = ""
    namespace: str = "llm"
    group: str = ""  # the resource's API group: "" for pods, networking.k8s.io for NetworkPolicies
    kind: str = "Pod"


@dataclass
class Decision:
    allowed: bool
    applied: bool  # the policy matched and its matchConditions held
    messages: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


class PolicyError(Exception):
    """A policy expression that does not compile (the API server reports it in the policy's status)."""


def _env() -> cel.Env:
    return cel.NewEnv(variables={name: cel.Type.DYN for name in VARIABLES},
                      extensions=[ext_strings.ExtStrings()])


def _compile(env: cel.Env, expression: str, where: str) -> cel.Expression:
    try:
        return env.compile(expression)
    except RuntimeError as e:
        raise PolicyError(f"{where}: {e}") from None


class _Failed(Exception):
    pass


def _eval(program: cel.Expression, data: dict[str, Any], where: str) -> Any:
    value = program.eval(data=data)
    if value.type() == cel.Type.ERROR:
        raise _Failed(f"{where}: {value.plain_value()}")
    return value.plain_value()


def _matches_rule(rule: dict[str, Any], request: Request) -> bool:
    resource = request.resource + (f"/{request.sub_resource}" if request.sub_resource else "")
    ops = rule.get("operations", [])
    resources = rule.get("resources", [])
    groups = rule.get("apiGroups", [""])
    return (("*" in ops or request.operation in ops)
            and ("*" in groups or request.group in groups)
            and ("*" in resources or resource in resources
                 or (request.sub_resource and f"{request.resource}/*" in resources)))


class Policy:
    """A ValidatingAdmissionPolicy and one binding of it, compiled once."""

    def __init__(self, policy: dict[str, Any], binding: dict[str, Any]):
        spec = policy["spec"]
        if binding["spec"]["policyName"] != policy["metadata"]["name"]:
            raise PolicyError(f"binding {binding['metadata']['name']} binds {binding['spec']['policyName']}")
        unsupported = {"paramKind", "auditAnnotations"} & set(spec)
        if unsupported:
            raise PolicyError(f"not implemented here: spec.{', spec.'.join(sorted(unsupported))}")
        env = _env()
        self.spec = spec
        self.binding = binding["spec"]
        self.fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
        self.conditions = [(c["name"], _compile(env, c["expression"], f"matchConditions[{c['name']}]"))
                           for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], _compile(env, v["expression"], f"variables[{v['name']}]"))
                          for v in spec.get("variables", [])]
        self.validations = []
        for i, v in enumerate(spec["validations"]):
            message_expr = v.get("messageExpression")
            self.validations.append((
                v,
                _compile(env, v["expression"], f"validations[{i}].expression"),
                _compile(env, message_expr, f"validations[{i}].messageExpression") if message_expr else None,
            ))

    def matches(self, request: Request) -> bool:
        rules = self.spec["matchConstraints"]["resourceRules"]
        selector = self.binding.get("matchResources", {}).get("namespaceSelector", {}).get("matchLabels", {})
        return (any(_matches_rule(r, request) for r in rules)
                and selector.items() <= request.namespace_labels.items())

    def admit(self, request: Request) -> Decision:
        if not self.matches(request):
            return Decision(allowed=True, applied=False)
        data: dict[str, Any] = {
            "object": request.object,
            "oldObject": request.old_object,
            "request": {"operation": request.operation, "namespace": request.namespace,
                        "resource": {"group": request.group, "version": "v1", "resource": request.resource},
                        "subResource": request.sub_resource,
                        "kind": {"group": request.group, "version": "v1", "kind": request.kind}},
            "namespaceObject": {"metadata": {"name": request.namespace, "labels": request.namespace_labels}},
            "params": None,
            "variables": {},
        }
        try:
            for name, program in self.conditions:
                held = _eval(program, data, f"matchConditions[{name}]")
                if held is not True:
                    return Decision(allowed=True, applied=False)
            for name, program in self.variables:
                data["variables"] = {**data["variables"], name: _eval(program, data, f"variables.{name}")}
        except _Failed as e:
            return self._failure(str(e))
        decision = Decision(allowed=True, applied=True)
        for rule, program, message_program in self.validations:
            try:
                ok = _eval(program, data, rule["expression"])
            except _Failed as e:
                failure = self._failure(str(e))
                decision.allowed = decision.allowed and failure.allowed
                decision.messages += failure.messages
                continue
            if ok is True:
                continue
            decision.allowed = False
            decision.messages.append(self._message(rule, message_program, data))
            decision.reasons.append(rule.get("reason", "Invalid"))
        return decision

    def _failure(self, message: str) -> Decision:
        return Decision(allowed=not self.fail_closed, applied=True, messages=[f"expression error: {message}"])

    @staticmethod
    def _message(rule: dict[str, Any], program: cel.Expression | None, data: dict[str, Any]) -> str:
        if program is not None:
            try:
                text = _eval(program, data, "messageExpression")
            except _Failed:
                text = None
            if isinstance(text, str) and text.strip() and "\n" not in text:
                return text
        return rule.get("message") or f"failed expression: {rule['expression']}"


@dataclass
class Outcome:
    """The API server's answer under the binding's validationActions (KEP-3488): Deny refuses a failed
    validation, Warn returns its message to the client, Audit records it in the audit event."""

    admitted: bool
    warnings: list[str]
    audited: list[str]


def respond(policy: Policy, request: Request) -> Outcome:
    decision = policy.admit(request)
    actions = set(policy.binding["validationActions"])
    failed = list(decision.messages) if not decision.allowed else []
    return Outcome(admitted=not failed or "Deny" not in actions, warnings=failed if "Warn" in actions else [],
                   audited=failed if "Audit" in actions else [])
