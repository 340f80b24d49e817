"""The Kubernetes API source: this node's pods and their objects, from an API server.

`client` (the only `import kubernetes`) -> `reflector` (list+watch that survives) -> `source`
(pods, references, delivery to the store), with `objects` (kubelet's change-detection strategies),
`tokens` (TokenRequest), `events` (FailedMount), and for the hostpath provisioner `provisioned`
(its PVs, created and deleted through the API) and `selected` (claims the scheduler chose this node
for).
"""
