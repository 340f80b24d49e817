"""Dynamic provisioning of node-local PersistentVolumes (`fusevol.provision.hostpath`), and,
without an API server to hold them, the agent's own record of the PVs it provisioned
(`fusevol.provision.record`)."""
