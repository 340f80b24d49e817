"""Test doubles for what cannot run here: the API server (`apiserver`), NFS mounts (`mount`)."""
