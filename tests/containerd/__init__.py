"""fusevol volumes inside real containers (containerd and runc)."""
