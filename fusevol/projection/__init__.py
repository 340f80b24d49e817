"""Payload builders: ConfigMap and Secret volumes as `{path: FileProjection}`, kubelet's way."""
