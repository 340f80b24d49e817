"""Test doubles for what cannot run here: the API server (`apiserver`, its transport `h2server`,
its authorizers `authz`), NFS mounts (`mount`), the files of kubelet's credentials on a node
(`fake_node`)."""
