"""/proc/self/mountinfo, parsed: the one reader of the kernel's mount table (proc(5)).

The mount backend's table (`fusevol.mount.table`) and the subPath view process
(`fusevol.fuse.servers`) both read it through here.
"""

from __future__ import annotations

from dataclasses import dataclass

PATH = "/proc/self/mountinfo"


@dataclass(frozen=True, slots=True)
class MountPoint:
    """One line of /proc/self/mountinfo."""

    mount_id: int
    parent_id: int
    root: str
    """The path inside the source file system that is mounted (a bind mount's subtree)."""
    path: str
    """Where it is mounted."""
    options: tuple[str, ...]
    fstype: str
    source: str
    device: str = ""
    """`major:minor` of the mounted file system: the same for every bind of one FUSE connection."""


def read(path: str = PATH) -> tuple[MountPoint, ...]:
    """Every mount, in the kernel's order."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return tuple(parse_line(line) for line in f if line.strip())


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal `\\ooo`."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_line(line: str) -> MountPoint:
    """One line of mountinfo (proc(5))."""
    fields = line.split()
    separator = fields.index("-", 6)
    return MountPoint(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        device=fields[2],
        root=_unescape(fields[3]),
        path=_unescape(fields[4]),
        options=tuple(fields[5].split(",")),
        fstype=fields[separator + 1],
        source=_unescape(fields[separator + 2]),
    )
