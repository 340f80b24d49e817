"""Mount-backed volume types on real mounts (nfs through a recording mount helper: this kernel has
no NFS client). Checked in /proc/self/mountinfo."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from fusevol.base.errors import VolumeSetupError
from fusevol.model import (
    EmptyDirVolumeSource,
    HostPathVolumeSource,
    LocalVolumeSource,
    NFSVolumeSource,
    PersistentVolumeSource,
    Pod,
    PodUID,
    ResourceVersion,
    Volume,
    VolumeName,
    VolumeSource,
)
from fusevol.mount.linux import LinuxMountBackend
from fusevol.mount.plugins import MountPlugins
from fusevol.node.layout import Plugin
from fusevol.volumemanager.cache.desired import VolumeToServe

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
POD = Pod(PodUID("pod-uid-1"), "default", "web", ResourceVersion("1"))


def mountinfo(path: Path) -> dict[str, str] | None:
    """The mountinfo fields of the mount at `path`, or None."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                sep = fields.index("-")
                return {
                    "id": fields[0],
                    "options": fields[5],
                    "fstype": fields[sep + 1],
                    "super": fields[sep + 3],
                }
    return None


def volume(
    source: VolumeSource | PersistentVolumeSource,
    plugin: Plugin,
    *,
    read_only: bool = False,
    mount_options: tuple[str, ...] = (),
    spec_name: str = "vol",
) -> VolumeToServe:
    return VolumeToServe(
        name=f"{plugin.value}/{POD.uid}-{spec_name}",  # type: ignore[arg-type]
        plugin=plugin,
        pod=POD,
        volume=Volume(VolumeName("vol"), source),  # type: ignore[arg-type]
        spec_name=spec_name,
        source=source,
        read_only=read_only,
        mount_options=mount_options,
    )


@pytest.fixture
def plugins(tmp_path: Path) -> MountPlugins:
    return MountPlugins(
        root=tmp_path / "root", backend=LinuxMountBackend(command_timeout_s=10, systemd_run=False)
    )


@pytest.fixture
def recording_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "mount-argv.jsonl"
    monkeypatch.setenv("PATH", f"{HELPERS}:{os.environ['PATH']}")
    monkeypatch.setenv("FUSEVOL_TEST_MOUNT_LOG", str(log))
    return log


def recorded(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# -- local -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True], ids=["rw", "ro"])
async def test_local_volume_is_a_bind_mount(
    plugins: MountPlugins, tmp_path: Path, read_only: bool
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "data").write_text("on the node")
    spec = volume(
        LocalVolumeSource(str(disk)), Plugin.LOCAL, read_only=read_only, spec_name="pv-local"
    )

    target = await plugins.set_up(spec)

    assert target == tmp_path / "root/pods/pod-uid-1/volumes/kubernetes.io~local-volume/pv-local"
    info = mountinfo(target)
    assert info is not None
    assert info["options"].split(",")[0] == ("ro" if read_only else "rw")
    assert (target / "data").read_text() == "on the node"
    assert stat.S_IMODE(os.stat(target.parent).st_mode) == 0o750

    first_id = info["id"]
    await plugins.set_up(spec)  # idempotent: the same mount is kept
    assert mountinfo(target) == info
    assert info["id"] == first_id

    await plugins.tear_down(Plugin.LOCAL, target)
    assert mountinfo(target) is None
    assert not target.exists()
    assert (disk / "data").read_text() == "on the node"
    await plugins.tear_down(Plugin.LOCAL, target)  # idempotent


async def test_local_volume_path_with_backsteps_is_refused(plugins: MountPlugins) -> None:
    with pytest.raises(VolumeSetupError, match=r"must not contain '\.\.'"):
        await plugins.set_up(volume(LocalVolumeSource("/tmp/../etc"), Plugin.LOCAL))


# -- emptyDir --------------------------------------------------------------------------------------


async def test_empty_dir_on_disk(plugins: MountPlugins) -> None:
    target = await plugins.set_up(volume(EmptyDirVolumeSource(), Plugin.EMPTY_DIR))
    assert mountinfo(target) is None
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o777
    (target / "scratch").write_text("x")
    await plugins.tear_down(Plugin.EMPTY_DIR, target)
    assert not target.exists()


async def test_empty_dir_in_memory_is_a_sized_tmpfs(plugins: MountPlugins) -> None:
    spec = volume(EmptyDirVolumeSource(medium="Memory", size_limit="64Mi"), Plugin.EMPTY_DIR)
    target = await plugins.set_up(spec)
    info = mountinfo(target)
    assert info is not None
    assert info["fstype"] == "tmpfs"
    assert "size=65536k" in info["super"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o1777
    (target / "scratch").write_text("x")
    await plugins.tear_down(Plugin.EMPTY_DIR, target)
    assert mountinfo(target) is None
    assert not target.exists()


async def test_full_tmpfs_fails_only_the_writer(plugins: MountPlugins) -> None:
    spec = volume(EmptyDirVolumeSource(medium="Memory", size_limit="1Mi"), Plugin.EMPTY_DIR)
    target = await plugins.set_up(spec)
    with pytest.raises(OSError, match="No space left"):
        (target / "big").write_bytes(b"x" * (2 << 20))
    await plugins.tear_down(Plugin.EMPTY_DIR, target)


# -- hostPath --------------------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    base = tmp_path / "host"
    base.mkdir()
    (base / "dir").mkdir()
    (base / "file").write_text("f")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(base / "sock"))
    sock.close()
    return base


HOST_PATH_CASES = [
    ("", "missing", None),
    ("Directory", "dir", None),
    ("Directory", "file", "hostPath type check failed: {p} is not a directory"),
    ("Directory", "missing", "hostPath type check failed: {p} is not a directory"),
    ("DirectoryOrCreate", "new/dir", None),
    ("DirectoryOrCreate", "file", "hostPath type check failed: {p} is not a directory"),
    ("File", "file", None),
    ("File", "dir", "hostPath type check failed: {p} is not a file"),
    ("FileOrCreate", "newfile", None),
    ("FileOrCreate", "dir", "hostPath type check failed: {p} is not a file"),
    ("Socket", "sock", None),
    ("Socket", "file", "hostPath type check failed: {p} is not a socket file"),
    ("CharDevice", "/dev/null", None),
    ("CharDevice", "file", "hostPath type check failed: {p} is not a character device"),
    ("BlockDevice", "file", "hostPath type check failed: {p} is not a block device"),
    ("Bogus", "file", "Bogus is an invalid volume type"),
]


@pytest.mark.parametrize(
    ("kind", "name", "error"),
    [pytest.param(*case, id=f"{case[0] or 'none'}-{case[1]}") for case in HOST_PATH_CASES],
)
async def test_host_path_types(
    plugins: MountPlugins, host: Path, kind: str, name: str, error: str | None
) -> None:
    path = name if name.startswith("/") else str(host / name)
    spec = volume(HostPathVolumeSource(path, kind), Plugin.HOST_PATH)
    if error is None:
        assert await plugins.set_up(spec) == Path(path)
        if kind == "DirectoryOrCreate":
            assert stat.S_ISDIR(os.stat(path).st_mode)
        if kind == "FileOrCreate":
            assert stat.S_IMODE(os.stat(path).st_mode) & 0o644 == 0o644
    else:
        with pytest.raises(VolumeSetupError) as raised:
            await plugins.set_up(spec)
        assert str(raised.value) == error.format(p=path)
    assert not (plugins.path(spec).parent / "volumes").exists()  # no pod directory


async def test_file_or_create_does_not_create_parents(plugins: MountPlugins, host: Path) -> None:
    path = host / "no-such-dir" / "file"
    with pytest.raises(VolumeSetupError, match="hostPath type check failed"):
        await plugins.set_up(
            volume(HostPathVolumeSource(str(path), "FileOrCreate"), Plugin.HOST_PATH)
        )
    assert not path.parent.exists()


# -- nfs -------------------------------------------------------------------------------------------

NFS_CASES = [
    pytest.param(NFSVolumeSource("nfs.example", "/exports/a"), False, (), [], id="inline"),
    pytest.param(
        NFSVolumeSource("nfs.example", "/exports/a", read_only=True),
        True,
        (),
        ["-o", "ro"],
        id="inline-ro",
    ),
    pytest.param(
        NFSVolumeSource("10.0.0.5", "/srv"),
        False,
        ("nfsvers=4.1", "hard"),
        ["-o", "hard,nfsvers=4.1"],
        id="pv-options",
    ),
    pytest.param(
        NFSVolumeSource("fd00::5", "/srv"),
        True,
        ("hard", "ro"),
        ["-o", "hard,ro"],
        id="ipv6-ro-dedup",
    ),
]


@pytest.mark.parametrize(("source", "read_only", "options", "expected_options"), NFS_CASES)
async def test_nfs_argv(
    plugins: MountPlugins,
    recording_mount: Path,
    source: NFSVolumeSource,
    read_only: bool,
    options: tuple[str, ...],
    expected_options: list[str],
) -> None:
    spec = volume(source, Plugin.NFS, read_only=read_only, mount_options=options)
    target = await plugins.set_up(spec)
    server = f"[{source.server}]" if ":" in source.server else source.server
    assert recorded(recording_mount) == [
        ["mount", "-t", "nfs", *expected_options, f"{server}:{source.path}", str(target)]
    ]
    assert mountinfo(target) is not None
    assert stat.S_IMODE(os.stat(target.parent).st_mode) == 0o750
    await plugins.tear_down(Plugin.NFS, target)
    assert mountinfo(target) is None
    assert not target.exists()


async def test_nfs_through_systemd_run_scope(
    tmp_path: Path, recording_mount: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With systemd as init, kubelet wraps helper mounts in a transient scope. Here a stand-in
    # systemd-run records itself and runs the command.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemd-run").write_text(
        '#!/bin/sh\necho "systemd-run $*" >> "$FUSEVOL_TEST_MOUNT_LOG.scope"\n'
        'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n'
    )
    (fake / "systemd-run").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    plugins = MountPlugins(
        root=tmp_path / "root", backend=LinuxMountBackend(command_timeout_s=10, systemd_run=True)
    )
    target = await plugins.set_up(volume(NFSVolumeSource("nfs.example", "/x"), Plugin.NFS))
    scope = Path(f"{recording_mount}.scope").read_text()
    assert scope.startswith("systemd-run --description=fusevol transient mount for ")
    assert "--scope -- mount -t nfs nfs.example:/x" in scope
    await plugins.tear_down(Plugin.NFS, target)
