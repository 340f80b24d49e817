"""The Kubernetes API source: this node's pods and their objects, from an API server.

`source` (pods, references, delivery to the store), with `objects` (kubelet's change-detection
strategies), `tokens` (TokenRequest), and for the hostpath provisioner `selected` (claims the
scheduler chose this node for). It reads through the API adapter, `fusevol.kube` (the client and
the reflector), which also holds what the agent writes to the API (events, provisioned PVs).
"""
