"""Volumes that are mounts on the host: nfs, local PVs, hostPath, emptyDir and gitRepo.

    backend       the `MountBackend` Protocol: idempotent mount, bind and unmount
    linux         the real backend: mount(2) and umount2(2) for binds and unmounts, mount(8) for
                  the rest
    plugins       set-up and tear-down per volume type, as kubelet's plugins do them
                  (docs/kubelet.md facts 10, 11)
    gitrepo       kubelet's git_repo plugin
    table         the mount table as the agent knows it
    mountinfo     the parser of /proc/self/mountinfo
    frozen        pod volume binds of a FUSE connection no agent serves, and who still reads them
    syscalls      mount(2) and umount2(2), with no trio
    batch         calls run in batches (a group commit)
    mount_helper  the helper process that makes binds and unmounts in batches
    fake          a backend that mounts nothing, for tests

The FUSE-served volumes are bound by `fusevol.volumemanager.reconciler.served` through the same
backend.
"""
