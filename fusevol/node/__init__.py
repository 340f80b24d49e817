"""Where things live on the node (kubelet's layout) and how a container's mounts resolve there."""
