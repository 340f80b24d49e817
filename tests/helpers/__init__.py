"""Test doubles for what cannot run here: the API server (`apiserver`, its transport `h2server`,
its authorizers `authz`), NFS mounts (`mount`)."""
