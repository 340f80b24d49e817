"""kubelet's volume manager: the caches of desired and actual state, the populator, the
reconciler."""
