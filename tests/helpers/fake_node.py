"""A fake node's files for `fusevol run --kubeconfig kubelet`: kubelet's client certificate as
its certificate manager keeps it (a dated PEM file, `kubelet-client-current.pem` a symlink to
it, switched at each rotation) and the cluster CA where a pod finds it, below a root of the
test's own.

Run as a program, it is the agent's wrapper (`tests.agent.running_agent(wrapper=...)`):
`python fake_node.py ROOT python -m fusevol ARGS...` runs `fusevol ARGS...` in this process with
kubelet's credentials looked for below ROOT instead of `/`; the launcher forks the agent, so the
agent looks there too.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import sys
from pathlib import Path

KUBELET_PKI = "var/lib/kubelet/pki"
CA = "var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
_serials = itertools.count()


def wrapper(root: Path) -> tuple[str, ...]:
    """The command `fusevol run` runs under, looking for kubelet's credentials below `root`."""
    return (sys.executable, __file__, str(root))


def make(root: Path, *, pem: Path, ca: Path) -> Path:
    """A node below `root` whose kubelet's current client certificate is `pem` (certificate
    and key) and whose pods find the cluster CA `ca`; the path of the current symlink."""
    (root / CA).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca, root / CA)
    return rotate(root, pem=pem)


def rotate(root: Path, *, pem: Path) -> Path:
    """As kubelet's certificate manager does: `pem` written to a new dated file, then the
    current symlink switched to it in one rename; the symlink's path."""
    pki = root / KUBELET_PKI
    pki.mkdir(parents=True, exist_ok=True)
    dated = f"kubelet-client-2026-01-01-00-00-{next(_serials):02d}.pem"
    shutil.copyfile(pem, pki / dated)
    (pki / "kubelet-client-updated.pem").symlink_to(dated)
    os.replace(pki / "kubelet-client-updated.pem", pki / "kubelet-client-current.pem")
    return pki / "kubelet-client-current.pem"


def _main(argv: list[str]) -> int:
    root, command = Path(argv[0]), argv[1:]
    assert command[1:3] == ["-m", "fusevol"], command

    from fusevol.cli import main
    from fusevol.kube import kubelet_credentials

    kubelet_credentials.find = functools.partial(kubelet_credentials.find, root=root)
    return main(command[3:])


if __name__ == "__main__":
    del sys.path[0]  # this directory: its modules are no top-level ones
    sys.exit(_main(sys.argv[1:]))
