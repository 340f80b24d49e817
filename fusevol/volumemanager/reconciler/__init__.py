"""kubelet's volume manager: drive the node's actual state towards the desired state.

`loop` (the Reconciler: unmount what no pod wants, set up what is wanted, refresh what changed,
in that order), `scope` (which volumes a pass looks at: every one, or those an edit concerns),
`operations` (the set-up, refresh and tear-down a pass starts, and what it asks of the volumes),
`executor` (one operation per volume at a time, kubelet's backoff), `volumes` (one interface over
every volume type), `served` (the volumes served from memory: a FUSE subtree bound at the pod
volume directory), `sharing` (which served volumes share one subtree: its name), `payloads` (a
served volume's payload rendered from the store, its paths' length checked) and `reconstruct` (the
actual state rebuilt from the node after a restart), `subpaths` (subPath views of served
volumes: set up with their volume, torn down with it) and `auditing` (which served volumes are
audited, their audit index, the audit server they are bound from). docs/kubelet.md fact 9.
"""
