"""The Kubernetes API source: this node's pods and their objects, from an API server.

`client` (the only `import kubernetes`) -> `reflector` (list+watch that survives) -> `source`
(pods, references, delivery to the store), with `objects` (kubelet's change-detection strategies),
`tokens` (TokenRequest) and `events` (FailedMount).
"""
