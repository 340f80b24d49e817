"""Who may do what on the loopback API server (`tests.helpers.apiserver`), as kube-apiserver
v1.28 decides it with `--authorization-mode Node,RBAC` and the NodeRestriction admission plugin.

- `User`: what an authenticator made of a request (name, groups).
- `node_decision`: kube's Node authorizer (plugin/pkg/auth/authorizer/node/node_authorizer.go)
  for a user `system:node:<name>` in group `system:nodes`. Secrets and ConfigMaps: get, list and
  watch of one named object (a list or watch names it by fieldSelector `metadata.name`), only if
  the graph has a path from it to the node; claims and PersistentVolumes: get only, by the same
  graph; `serviceaccounts/token`: create, for a service account of a pod of the node. The graph
  is kube's (graph.go `AddPod`, `AddPV`): each pod bound to a node (not a mirror pod) links its
  service account, the Secrets and ConfigMaps it names (volumes, projected sources, a CSI
  volume's `nodePublishSecretRef`, env, envFrom, imagePullSecrets) and its claims to that node; a
  PV links to the claim of its claimRef. Everything else is the `system:node` rules
  (bootstrappolicy NodeRules): pods read, events written, reviews created, ...
  A denial carries kube's reason ("no relationship found between node 'n1' and this object").
- `node_restriction`: NodeRestriction's rule for a node's TokenRequest (admission.go
  `admitServiceAccount`): bound to a pod (v1, name and uid) scheduled on that node.
- `forbidden`: the 403 Status message kube-apiserver writes (responsewriters/errors.go
  `forbiddenMessage` inside `NewForbidden`), with the authorizer's reason appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

NODE_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
NO_RELATIONSHIP = "no relationship found between node '{}' and this object"

NODE_RULES: tuple[tuple[frozenset[str], str, frozenset[str]], ...] = tuple(
    (frozenset(verbs.split()), group, frozenset(resources.split()))
    for verbs, group, resources in (
        ("create", "authentication.k8s.io", "tokenreviews"),
        ("create", "authorization.k8s.io", "subjectaccessreviews localsubjectaccessreviews"),
        ("get list watch", "", "services"),
        ("create get list watch", "", "nodes"),
        ("update patch", "", "nodes/status nodes"),
        ("create update patch", "", "events"),
        ("get list watch", "", "pods"),
        ("create delete", "", "pods"),
        ("update patch", "", "pods/status"),
        ("create", "", "pods/eviction"),
        ("get", "", "endpoints"),
        ("get", "storage.k8s.io", "volumeattachments"),
        ("get update patch", "", "persistentvolumeclaims/status"),
        ("get watch list", "storage.k8s.io", "csidrivers"),
        ("get list watch", "node.k8s.io", "runtimeclasses"),
    )
)
"""bootstrappolicy.NodeRules() of v1.28 for what the Node authorizer does not subdivide."""


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @property
    def node(self) -> str | None:
        """The node's name, as the Node authorizer's identifier reads it."""
        if NODE_GROUP in self.groups and self.name.startswith(NODE_PREFIX):
            return self.name.removeprefix(NODE_PREFIX)
        return None


@dataclass(frozen=True)
class Attributes:
    """A request as the authorizers see it (kube's authorizer.Attributes)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def node_decision(
    objects: dict[tuple[str, str, str], Obj], node: str, attrs: Attributes
) -> tuple[bool, str]:
    """(allowed, reason) of the Node authorizer for `node`'s request."""
    if attrs.group == "" and attrs.resource in ("secrets", "configmaps"):
        if attrs.verb not in ("get", "list", "watch"):
            return False, "can only read resources of this type"
        if attrs.subresource:
            return False, "cannot read subresource"
        if not attrs.namespace:
            return False, "can only read namespaced object of this type"
        return _related(objects, node, attrs)
    if attrs.group == "" and attrs.resource in ("persistentvolumeclaims", "persistentvolumes"):
        if attrs.resource == "persistentvolumeclaims" and attrs.subresource == "status":
            if attrs.verb not in ("update", "patch"):
                return False, "can only get/update/patch this type"
            return _related(objects, node, attrs)
        if attrs.verb != "get":
            return False, "can only get individual resources of this type"
        if attrs.subresource:
            return False, "cannot get subresource"
        return _related(objects, node, attrs)
    if attrs.group == "" and attrs.resource == "serviceaccounts":
        if attrs.verb != "create" or not attrs.name:
            return False, "can only create tokens for individual service accounts"
        if attrs.subresource != "token":
            return False, "can only create token subresource of serviceaccount"
        return _related(objects, node, attrs)
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for verbs, group, resources in NODE_RULES:
        if attrs.verb in verbs and attrs.group == group and resource in resources:
            return True, ""
    return False, ""


def node_restriction(
    objects: dict[tuple[str, str, str], Obj], node: str, spec: Obj, namespace: str
) -> str:
    """Why NodeRestriction refuses `node`'s TokenRequest `spec` ("" if it admits it)."""
    ref = spec.get("boundObjectRef") or {}
    if ref.get("apiVersion") != "v1" or ref.get("kind") != "Pod" or not ref.get("name"):
        return "node requested token not bound to a pod"
    if not ref.get("uid"):
        return "node requested token with a pod binding without a uid"
    pod = objects.get(("pods", namespace, ref["name"]))
    if pod is None:
        return ""  # the TokenRequest itself answers 404
    if ref["uid"] != pod["metadata"]["uid"]:
        return (
            f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
            "record. The object might have been deleted and then recreated"
        )
    if pod["spec"].get("nodeName") != node:
        return "node requested token bound to a pod scheduled on a different node"
    return ""


def forbidden(user: User, attrs: Attributes, reason: str) -> str:
    """kube-apiserver's message of a 403 Forbidden Status."""
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    message = (
        f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group '
        f'"{attrs.group}" {scope}'
    )
    if reason:
        message += f": {reason}"
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    if attrs.name:
        return f'{qualified} "{attrs.name}" is forbidden: {message}'
    return f"{qualified} is forbidden: {message}"


def _related(
    objects: dict[tuple[str, str, str], Obj], node: str, attrs: Attributes
) -> tuple[bool, str]:
    if not attrs.name:
        return False, "No Object name found"
    if (attrs.resource, attrs.namespace, attrs.name) in _reachable(objects, node):
        return True, ""
    return False, NO_RELATIONSHIP.format(node)


def _reachable(objects: dict[tuple[str, str, str], Obj], node: str) -> set[tuple[str, str, str]]:
    """Every vertex with a path to `node` in the Node authorizer's graph."""
    found: set[tuple[str, str, str]] = set()
    for (resource, namespace, name), pod in objects.items():
        if resource != "pods" or pod["spec"].get("nodeName") != node:
            continue
        if "kubernetes.io/config.mirror" in (pod["metadata"].get("annotations") or {}):
            continue
        spec = pod["spec"]
        # The ServiceAccount admission plugin (not modelled by the store) sets "default".
        account = spec.get("serviceAccountName") or "default"
        found.add(("serviceaccounts", namespace, account))
        found.update(("secrets", namespace, s) for s in _secret_names(spec))
        found.update(("configmaps", namespace, c) for c in _configmap_names(spec))
        for volume in spec.get("volumes") or ():
            if claim := (volume.get("persistentVolumeClaim") or {}).get("claimName"):
                found.add(("persistentvolumeclaims", namespace, claim))
            elif "ephemeral" in volume:
                found.add(("persistentvolumeclaims", namespace, f"{name}-{volume['name']}"))
    for (resource, _, name), pv in objects.items():
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if (
            resource == "persistentvolumes"
            and (
                "persistentvolumeclaims",
                ref.get("namespace", ""),
                ref.get("name", ""),
            )
            in found
        ):
            found.add(("persistentvolumes", "", name))
    return found


def _containers(spec: Obj) -> list[Obj]:
    kinds = ("initContainers", "containers", "ephemeralContainers")
    return [container for kind in kinds for container in spec.get(kind) or ()]


def _secret_names(spec: Obj) -> set[str]:
    """podutil.VisitPodSecretNames (the volume kinds fusevol serves, CSI and the containers)."""
    names = {ref.get("name", "") for ref in spec.get("imagePullSecrets") or ()}
    for container in _containers(spec):
        for env in container.get("envFrom") or ():
            names.add((env.get("secretRef") or {}).get("name", ""))
        for env in container.get("env") or ():
            names.add(((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name", ""))
    for volume in spec.get("volumes") or ():
        names.add((volume.get("secret") or {}).get("secretName", ""))
        names.add(((volume.get("csi") or {}).get("nodePublishSecretRef") or {}).get("name", ""))
        for source in (volume.get("projected") or {}).get("sources") or ():
            names.add((source.get("secret") or {}).get("name", ""))
    return names - {""}


def _configmap_names(spec: Obj) -> set[str]:
    """podutil.VisitPodConfigmapNames."""
    names: set[str] = set()
    for container in _containers(spec):
        for env in container.get("envFrom") or ():
            names.add((env.get("configMapRef") or {}).get("name", ""))
        for env in container.get("env") or ():
            names.add(((env.get("valueFrom") or {}).get("configMapKeyRef") or {}).get("name", ""))
    for volume in spec.get("volumes") or ():
        names.add((volume.get("configMap") or {}).get("name", ""))
        for source in (volume.get("projected") or {}).get("sources") or ():
            names.add((source.get("configMap") or {}).get("name", ""))
    return names - {""}
