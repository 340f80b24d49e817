"""The agent's in-memory state, kubelet's caches: what the sources delivered and what the node
should and does hold.

`store` (ObjectStore: one copy of every delivered object, never evicted), `desired` (the volumes
the pods of this node want, filled by the populator) and `actual` (the volumes set up on the node,
marked by the reconciler); `seen` (when the agent first saw each pod, kept across restarts). Each
of the three states counts its changes with `changes` (a count that can be waited on). Trio
thread only; readers get snapshots. See docs/architecture.md.
"""
