"""Sources of Kubernetes objects: a watched manifest directory, or the Kubernetes API.

Each source delivers the pods of this node and the objects their volumes need to the object store
(`fusevol.cache.store`), converted to model types (`fusevol.model`) on the way in:
`local` (ManifestSource: a directory of manifests, watched with inotify) and `kube` (KubeSource:
list+watch, change detection, tokens, events). Both decode with `manifest` (objects), `volumes`
(`spec.volumes`) and `_reader` (typed field reads). Each also records the PersistentVolumes the
node provisions: `provisioned` (in the agent's state) and `kube.provisioned` (through the API).
"""
