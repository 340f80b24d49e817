"""Sources of Kubernetes objects: a watched manifest directory, or the Kubernetes API.

Each source delivers the pods of this node and the objects their volumes need to the object store
(`fusevol.volumemanager.cache.store`), converted to model types (`fusevol.model`) on the way in:
`local` (ManifestSource: a directory of manifests, watched with inotify) and `kube` (KubeSource:
list+watch, change detection, tokens). Both decode with `fusevol.decode`. Sources only read: what
the agent writes goes where writers go, the PersistentVolumes it provisions to
`fusevol.provision.record` (the manifest case) or the API (`fusevol.kube.provisioned`), events to
the API (`fusevol.kube.events`).
"""
