"""The node as kubelet lays it out, and a container's mounts on it.

`layout` (where pod volumes, subPath views and the agent's own state live below the root; the
volume plugins' names) and `container_mounts` (a container's volumeMounts resolved as kubelet
resolves them, subPath and subPathExpr included: pure, no I/O).
"""
