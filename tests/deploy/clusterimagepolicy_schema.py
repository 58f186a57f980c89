"""A JSON schema for sigstore policy-controller's ClusterImagePolicy (policy.sigstore.dev/v1beta1).

Written here from the fields upstream's CRD and docs describe (policy-controller v0.15,
`config/300-clusterimagepolicy.yaml`, read, not copied); ../shared/schemas has no such CRD. Every
object is closed, so a misspelt field (`keyles`) is an error, as it is for the API server with
field validation set to Strict. Types only: which combinations are allowed (one of key, keyless,
static) is the validating webhook's job, restated in test_image_signatures.webhook_errors.
"""

from __future__ import annotations

API_VERSION = "policy.sigstore.dev/v1beta1"
KIND = "ClusterImagePolicy"


def _obj(**properties) -> dict:
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _list(item: dict) -> dict:
    return {"type": "array", "items": item}


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_SECRET_REF = _obj(name=_STR, namespace=_STR)
_KEY = _obj(data=_STR, kms=_STR, hashAlgorithm=_STR, secretRef=_SECRET_REF)
_POLICY = _obj(
    type=_STR, data=_STR, fetchConfigFile=_BOOL, includeSpec=_BOOL, includeObjectMeta=_BOOL, includeTypeMeta=_BOOL,
    configMapRef=_obj(name=_STR, namespace=_STR, key=_STR), remote=_obj(url=_STR, sha256sum=_STR),
)
_AUTHORITY = _obj(
    name=_STR,
    key=_KEY,
    keyless=_obj(
        url=_STR, trustRootRef=_STR, insecureIgnoreSCT=_BOOL, **{"ca-cert": _KEY},
        identities=_list(_obj(issuer=_STR, issuerRegExp=_STR, subject=_STR, subjectRegExp=_STR)),
    ),
    static=_obj(action=_STR, message=_STR),
    ctlog=_obj(url=_STR, trustRootRef=_STR),
    rfc3161timestamp=_obj(trustRootRef=_STR),
    source=_list(_obj(oci=_STR, tagPrefix=_STR, signaturePullSecrets=_list(_obj(name=_STR)))),
    signatureFormat=_STR,
    attestations=_list(_obj(name=_STR, predicateType=_STR, policy=_POLICY)),
)
_SELECTOR = _obj(
    matchLabels={"type": "object", "additionalProperties": _STR},
    matchExpressions=_list(_obj(key=_STR, operator=_STR, values=_list(_STR))),
)
SPEC = _obj(
    images=_list(_obj(glob=_STR)),
    authorities=_list(_AUTHORITY),
    mode=_STR,
    policy=_POLICY,
    match=_list(_obj(group=_STR, version=_STR, resource=_STR, selector=_SELECTOR)),
)


def cluster_image_policy_schema() -> dict:
    """The whole object: apiVersion and kind pinned, metadata left to the API server."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": KIND},
                       "metadata": {"type": "object"}, "spec": SPEC},
    }
