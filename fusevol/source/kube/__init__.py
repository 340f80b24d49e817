"""The Kubernetes API source: this node's pods and their objects, from an API server.

`source` (pods, delivery to the store), with `references` (what a pod's volumes reference),
`objects` (kubelet's change-detection strategies), `identity` (who the agent is, and so as whom
each object is read), `csi_volumes` (what CSI volumes reference, read as their pod), `tokens`
(TokenRequest), and for the hostpath provisioner `selected` (claims the scheduler chose this node
for). It reads through the API adapter, `fusevol.kube` (the client and the reflector), which
also holds what the agent writes to the API (events, provisioned PVs).
"""
