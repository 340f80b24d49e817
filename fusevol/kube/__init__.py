"""The Kubernetes API adapter: what talks to an API server, for reading and for writing.

`client` (the API calls, each a request of `transport`: made from `configuration`, the only
`import kubernetes`, with its `tls` and `credentials` (or kubelet's own, which
`kubelet_credentials` finds on the node), it goes over `http2`, every request and watch a
stream of one connection; `watch` reads an open watch, `errors` say how a call failed;
`listing` reads a large list's items one at a time) and `reflector` (a list+watch mirror of a
`query` that survives any API server, with client-go's `backoff` and set-once flags, `flag`;
`relists`: the watches of one namespace relist together) are what the API source reads through
(`fusevol.source.kube`); the agent's writes to the
API are here too: `events` (kubelet's FailedMount Warning events) and `provisioned` (the
PersistentVolumes the hostpath provisioner creates and deletes, as a node-local
external-provisioner would); `documents` renders model objects as the API shows them.
"""
