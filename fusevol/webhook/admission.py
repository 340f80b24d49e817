"""One AdmissionReview (admission.k8s.io/v1) in, its answer out: every pod is allowed, converted
or not.

The answer to a review that names its request (`request.uid`) always allows the object: a CREATE
of a core/v1 Pod outside the excluded namespaces gets the conversion's JSON Patch
(`fusevol.webhook.convert`) and its warnings (each prefixed `fusevol.io:`, cut to the 256
characters the API server keeps); anything else, and a pod the conversion cannot read, is
allowed unchanged, with a warning saying why when it is the pod's fault. An internal error of the
conversion is logged and answered the same way: the webhook never holds a pod up. A body that is
no AdmissionReview (no uid to answer) is `BadReview`, which the server answers with 400; the API
server then applies the webhook's `failurePolicy: Ignore`. The pod's namespace's audit level
(`namespace_audit`) is asked for only when a volume is to be converted.

Excludes: HTTP and TLS (`fusevol.webhook.server`), the CSIDriver and the namespaces
(`fusevol.webhook.cluster`).
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from fusevol.base.errors import InvalidInput
from fusevol.webhook.convert import Conversion, convert_pod

if TYPE_CHECKING:
    from collections.abc import Callable

    from fusevol.model.audit import AuditLevel
    from fusevol.webhook.convert import Driver

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
WARNING_PREFIX = "fusevol.io: "
INTERNAL_ERROR = "internal error of the webhook: admitted unchanged"
MAX_WARNING_CHARS = 256
"""Warnings longer than this "may be truncated" by the API server (AdmissionResponse docs)."""
_POD = {"group": "", "version": "v1", "kind": "Pod"}


class BadReview(InvalidInput):
    """A request body that is no AdmissionReview v1 with a request uid."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The response body, and for the log what was done."""

    body: bytes
    pod: str = ""
    conversion: Conversion = field(default_factory=Conversion)
    failed: bool = False
    """The conversion met an internal error: the pod is admitted unchanged."""


def review(
    body: bytes,
    *,
    driver: Driver,
    excluded_namespaces: frozenset[str],
    namespace_audit: Callable[[str], AuditLevel] | None = None,
) -> Answer:
    """Answer the AdmissionReview in `body` (module docstring); BadReview if it is none.
    `namespace_audit`: a namespace -> the audit level its annotation asks for (never raises)."""
    request = _request(body)
    uid = request["uid"]
    pod, conversion, failed = "", Conversion(), False
    if (
        request.get("kind") == _POD
        and request.get("operation") == "CREATE"
        and not request.get("subResource")
    ):
        namespace = request.get("namespace")
        obj = request.get("object")
        if not isinstance(namespace, str) or not namespace:
            metadata = obj.get("metadata") if isinstance(obj, dict) else None
            namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
            namespace = namespace if isinstance(namespace, str) and namespace else "default"
        pod = f"{namespace}/{_name(obj)}"
        if namespace not in excluded_namespaces:
            converted = _convert(obj, namespace, driver, pod, namespace_audit)
            failed = converted is None
            conversion = converted or Conversion(warnings=(INTERNAL_ERROR,))
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if conversion.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(conversion.patch).encode()).decode()
    if conversion.warnings:
        response["warnings"] = [_warning(text) for text in conversion.warnings]
    answer = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    return Answer(json.dumps(answer).encode(), pod, conversion, failed)


def _request(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"the body is not JSON: {exc}") from None
    request = value.get("request") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("apiVersion") != API_VERSION:
        raise BadReview(f"the body is not an AdmissionReview {API_VERSION}")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request.uid")
    return request


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _convert(
    obj: Any,
    namespace: str,
    driver: Driver,
    pod: str,
    namespace_audit: Callable[[str], AuditLevel] | None,
) -> Conversion | None:
    """The pod's conversion, or None after an internal error (logged)."""
    level = None if namespace_audit is None else partial(namespace_audit, namespace)
    try:
        return convert_pod(obj, namespace=namespace, driver=driver, namespace_audit=level)
    except Exception:  # a bug of ours must not hold up a pod: admitted as it is
        log.exception("conversion failed, pod admitted unchanged pod=%s", pod)
        return None


def _name(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return ""
    name = metadata.get("name") or ""
    generate = metadata.get("generateName") or ""
    return str(name or (f"{generate}<generated>" if generate else ""))


def _warning(text: str) -> str:
    text = f"{WARNING_PREFIX}{text}"
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."
