"""What kube-apiserver v1.28 stores for a Pod, ConfigMap or Secret a client sends: its defaulting
(`pkg/apis/core/v1/defaults.go`, the generated `zz_generated.defaults.go` that applies it to every
nested struct), the canonical form its quantities are written back in, and what JSON drops.

`as_stored(obj)` gives that form for the loopback API server (`tests/helpers/apiserver.py`), so
that every test against it gets objects as a real API server sends them, every defaulted field
filled in (`divisor: "0"`, `defaultMode: 420`, `fieldRef.apiVersion: v1`, `hostPath.type: ""`,
requests copied from limits, ...). `tests/unit/test_api_forms.py` holds it against pods captured
from a real kube-apiserver v1.28 (`tests/fixtures/apiserver/`).

Not modelled: admission plugins (ServiceAccount's `kube-api-access-*` volume,
DefaultTolerationSeconds, Priority) and `status`: the captured pods carry them, the loopback
server's pods do not.
"""

from __future__ import annotations

import copy
from typing import Any

from fusevol.base.quantity import canonical, parse_quantity

Obj = dict[str, Any]

_MODE = 0o644  # every *VolumeSourceDefaultMode
_TOKEN_SECONDS = 3600


def as_stored(obj: Obj) -> Obj:
    """A copy of `obj` as the API server stores and returns it."""
    obj = copy.deepcopy(obj)
    kind = obj.get("kind")
    if kind == "Pod":
        _pod(obj)
    elif kind == "ConfigMap" and obj.get("data") is None and "binaryData" not in obj:
        obj.pop("data", None)  # SetDefaults_ConfigMap makes {}, and omitempty drops it again
    elif kind == "Secret":
        obj["type"] = obj.get("type") or "Opaque"
    return obj


def _pod(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    if spec.get("securityContext") is None:
        spec["securityContext"] = {}
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            _container(container)
    for volume in spec.get("volumes") or []:
        _volume(volume)


def _container(container: Obj) -> None:
    if not container.get("imagePullPolicy"):
        image = container.get("image", "")
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        latest = "@" not in image and tag in ("", "latest")
        container["imagePullPolicy"] = "Always" if latest else "IfNotPresent"
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.get("resources") or {}
    container["resources"] = resources
    limits = resources.get("limits")
    if limits:  # SetDefaults_Pod: a limit without a request is also the request
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
    for key in ("limits", "requests"):
        if resources.get(key):
            resources[key] = {name: _resource(v) for name, v in resources[key].items()}
        else:
            resources.pop(key, None)
    for variable in container.get("env") or []:
        source = variable.get("valueFrom") or {}
        if source.get("fieldRef") is not None:
            _field_ref(source["fieldRef"])
        if source.get("resourceFieldRef") is not None:
            _resource_ref(source["resourceFieldRef"])


def _volume(volume: Obj) -> None:
    types = [key for key, value in volume.items() if key != "name" and value is not None]
    for key in [key for key, value in volume.items() if value is None]:
        del volume[key]  # a null pointer is not written back
    if not types:
        volume["emptyDir"] = {}
    for type_name in types:
        _source(type_name, volume[type_name])


def _source(type_name: str, source: Obj) -> None:
    _drop_empty(source)
    served = type_name in ("configMap", "secret", "downwardAPI", "projected")
    if served and source.get("defaultMode") is None:
        source["defaultMode"] = _MODE
    if type_name == "hostPath" and source.get("type") is None:
        source["type"] = ""
    if type_name == "emptyDir" and source.get("sizeLimit") is not None:
        source["sizeLimit"] = canonical(str(source["sizeLimit"]))
    if type_name == "downwardAPI":
        _downward_items(source.get("items") or [])
    if type_name == "projected":
        for projection in source.get("sources") or []:
            for key in [key for key, value in projection.items() if value is None]:
                del projection[key]
            for kind, inner in projection.items():
                _drop_empty(inner)
                if kind == "downwardAPI":
                    _downward_items(inner.get("items") or [])
                if kind == "serviceAccountToken" and inner.get("expirationSeconds") is None:
                    inner["expirationSeconds"] = _TOKEN_SECONDS


def _downward_items(items: list[Obj]) -> None:
    for item in items:
        _drop_empty(item)
        if item.get("fieldRef") is not None:
            _field_ref(item["fieldRef"])
        if item.get("resourceFieldRef") is not None:
            _resource_ref(item["resourceFieldRef"])


def _field_ref(ref: Obj) -> None:
    if not ref.get("apiVersion"):
        ref["apiVersion"] = "v1"


def _resource_ref(ref: Obj) -> None:
    """`divisor` is a Quantity, not a pointer: omitted, it is the zero Quantity, written "0"."""
    divisor = ref.get("divisor")
    ref["divisor"] = "0" if divisor is None else canonical(str(divisor))


def _resource(value: object) -> str:
    """`SetDefaults_ResourceList`: rounded up to milli-units, then written canonically."""
    text = str(value)
    amount = parse_quantity(text)
    if amount * 1000 != int(amount * 1000):
        rounded = -(-amount.numerator * 1000 // amount.denominator)
        text = f"{rounded}m" if rounded % 1000 else str(rounded // 1000)
    return canonical(text)


def _drop_empty(obj: Obj) -> None:
    """JSON's omitempty: null pointers, empty strings, lists and maps are not sent, nor a false
    `readOnly` (a plain bool; `optional` is a pointer: false is sent). hostPath's `type` is a
    pointer: "" is sent."""
    for key, value in list(obj.items()):
        if (
            value is None
            or value == []
            or value == {}
            or (value == "" and key != "type")
            or (key == "readOnly" and value is False)
        ):
            del obj[key]
