"""Dynamic provisioning of node-local PersistentVolumes (`fusevol.provision.hostpath`)."""
