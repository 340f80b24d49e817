"""kubelet's volume manager, in kubelet's three parts.

`cache` (the object store, the desired and the actual state of the world), `populator` (the pods
of this node and their volumes -> the desired state, resolving claims to volumes) and
`reconciler` (actual state driven towards desired: unmount, set up, refresh, one operation per
volume at a time). docs/architecture.md.
"""
