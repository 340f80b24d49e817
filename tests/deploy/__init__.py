"""The deployment files: the Helm chart and the systemd unit, checked by their own tools."""
