"""What the agent shows of itself.

`http` (/healthz, /readyz, /metrics and /status), `metrics` (the Prometheus registry and metric
types, kubelet's names where kubelet has one, and the webhook's; the only user of
prometheus_client),
`component_metrics` (what each component tells Prometheus, read on every scrape), `status`
(the snapshot `fusevol status` reads, written when the reconciler is quiet), `frozen` (frozen
volumes named in the status, the metrics and a Warning event), `auth` (who may read /metrics
and /status: root on this node, and whom the API server says) `peer` (who is at the other
end of a loopback connection) and `audit` (the audit's records followed: its counter, the keys
read and never read, a copy on standard output).
"""
