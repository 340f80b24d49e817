"""fusevol: a node agent that serves Kubernetes configuration volumes from memory over FUSE.

The packages, from the top layer down (import-linter's layers in pyproject.toml, each imports
only below itself; docs/architecture.md draws them):

    cli            the command line: parse, dispatch, one module a command
    agent          the agent's process: launcher, lifecycle, lock, hand-over, composition (app)
    webhook        the admission webhook, a process of its own beside the agent: pods' config
                   volumes into fusevol.io CSI volumes (`fusevol webhook`, `fusevol convert`)
    csi, observe   the CSI node plugin for kubelet; what the agent shows (HTTP, metrics, status)
    volumemanager  kubelet's volume manager: cache (desired and actual state), populator, reconciler
    fuse, projection, source, provision
                   the FUSE file system; payloads kubelet's way; where objects come from;
                   node-local PersistentVolumes
    mount          volumes that are mounts on the host, and the mount table
    kube           the Kubernetes API adapter (the only user of the `kubernetes` client)
    decode         Kubernetes objects, as JSON or YAML, into the model
    node           where things live on the node
    model          the objects fusevol acts on, as frozen types
    base           leaf utilities: errors, settings, logging, quantities, files, heap, helpers
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
