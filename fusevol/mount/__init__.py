"""Volumes that are mounts on the host: nfs, local PVs, hostPath, emptyDir and gitRepo.

`backend` (the `MountBackend` Protocol: idempotent mount, bind and unmount), `linux` (the real
backend: mount(8), umount(8), /proc/self/mountinfo), `plugins` (set-up and tear-down per volume
type, as kubelet's plugins do them: docs/kubelet.md facts 10, 11) and `gitrepo` (kubelet's
git_repo plugin). The FUSE-served volumes are bound by `fusevol.volumemanager.reconciler.served`
through the same backend.
"""
