"""HTTP/2 to one API server over trio: every request of the agent, watches included, as streams
of as few connections as the server allows.

What client-go's transport (Go's `http2.Transport`) does for kubelet, in the parts fusevol needs,
a module each:

- `pool`: the connections to one origin (`Pool.request`, from any task); one more only when
  every connection is full, one dial shared by every request that waits for it, and one task
  dialling a server that is away for all its callers (`wait_reachable`).
- `connection`: one connection: its reader and writer tasks, flow control (the server's data
  acknowledged as the caller consumes it), health (PINGs after 30 s of silence, closed when idle
  for 90 s) and GOAWAY.
- `response`: one stream's answer (`Response`), its status and its body as the caller reads it.
- `state`: h2's state machine of a connection as the agent sets it up (Go's windows, closed
  streams forgotten, HPACK coded for speed).
- `errors`: `ConnectionLost` (nothing, or not all, came back: retryable) and `Unreachable`
  (nothing was sent).

Runs on the trio thread only; a connection's tasks are trio system tasks, so that the pool serves
any task of the agent (the sources, the reconciler's provisioner, the CSI plugin) whatever
nursery it runs in.

Excludes: what is sent (`client`: paths and JSON; `transport`: authentication); HTTP/1.1 (the
API server speaks HTTP/2 to every client that offers it; `kubectl proxy` does not, and is not
supported).
"""
