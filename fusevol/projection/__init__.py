"""Payload builders: a served volume's object(s) and source -> `{path: FileProjection}`, kubelet's
way (docs/kubelet.md facts 2, 3, 5, 6).

One module per volume type: `configmap`, `secret`, `downward` (downwardAPI, and the node's
allocatable for resource limits) and `projected` (configMap, secret, downwardAPI and
serviceAccountToken sources merged); with `_items` (the key-to-file rules configMap and secret
share), `paths` (AtomicWriter's path rules), `ownership` (the fsGroup modes and owners),
`goquote` (Go's `strconv.Quote`) and `origins` (which object and key each path of a payload
shows: names only, for the audit of reads). Functions of their inputs, no state; only
`downward.node_allocatable` reads the host (its capacity, when the agent starts).
"""
