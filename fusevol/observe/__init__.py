"""What the agent shows of itself: the HTTP endpoints, Prometheus metrics, the status snapshot."""
