"""kubelet's volume manager: drive the node's actual state towards the desired state.

`loop` (the Reconciler: unmount what no pod wants, set up what is wanted, refresh what changed,
in that order), `executor` (one operation per volume at a time, kubelet's backoff), `volumes` (one
interface over every volume type), `served` (the volumes served from memory: a FUSE subtree bound
at the pod volume directory) and `reconstruct` (the actual state rebuilt from the node after a
restart), and `subpaths` (subPath views of served volumes: set up with their volume, torn down
with it). docs/kubelet.md fact 9.
"""
