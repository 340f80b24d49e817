"""Sources of Kubernetes objects: the watched manifest directory (and, later, the API server)."""
