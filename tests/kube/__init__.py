"""The real agent against a loopback API server speaking the Kubernetes wire protocol."""
