"""`--kubeconfig kubelet`: kubelet's credentials found on a fake node (a tree under tmp_path),
in their order: each distribution's kubeconfig before the later ones, then kubelet's current
client certificate with the in-cluster API server, then an error naming every path tried."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fusevol.base.errors import FusevolError
from fusevol.base.settings import DEFAULT_KUBELET_DIR, KUBELET, KubeletCredentials
from fusevol.cli import run
from fusevol.cli.parser import build_parser
from fusevol.kube.configuration import load_configuration
from fusevol.kube.kubelet_credentials import KUBECONFIGS, ClientCertificate, find

KUBELET_DIR = Path(DEFAULT_KUBELET_DIR)
IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
PEM = "var/lib/kubelet/pki/kubelet-client-current.pem"
CA = "var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
PATHS = [template.format(kubelet_dir=KUBELET_DIR).lstrip("/") for template, _ in KUBECONFIGS]
NOT_FOUND = (
    "--kubeconfig kubelet: kubelet's credentials not found: no kubeconfig "
    "{root}/etc/kubernetes/kubelet.conf, {root}/var/lib/kubelet/kubeconfig, "
    "{root}/var/lib/rancher/k3s/agent/kubelet.kubeconfig, "
    "{root}/var/lib/rancher/rke2/agent/kubelet.kubeconfig, "
    "{root}/var/snap/microk8s/current/credentials/kubelet.config; {missing}; "
    "give --kubeconfig PATH (the chart's rbac.node.kubeconfig)"
)


def node(root: Path, *paths: str) -> Path:
    """A fake node below `root` with a file at each of `paths` (relative to its /)."""
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")
    return root


def client_certificate(root: Path) -> Path:
    """kubelet's pki directory as its certificate manager leaves it: a dated PEM file and the
    `kubelet-client-current.pem` symlink to it."""
    pem = root / PEM
    pem.parent.mkdir(parents=True, exist_ok=True)
    (pem.parent / "kubelet-client-2026-01-01-00-00-00.pem").write_text("x")
    pem.symlink_to("kubelet-client-2026-01-01-00-00-00.pem")
    return pem


def test_the_paths_are_those_the_distributions_give_kubelet() -> None:
    assert PATHS == [
        "etc/kubernetes/kubelet.conf",
        "var/lib/kubelet/kubeconfig",
        "var/lib/rancher/k3s/agent/kubelet.kubeconfig",
        "var/lib/rancher/rke2/agent/kubelet.kubeconfig",
        "var/snap/microk8s/current/credentials/kubelet.config",
    ]


@pytest.mark.parametrize("first", range(len(PATHS)), ids=[who for _, who in KUBECONFIGS])
def test_a_distributions_kubeconfig_wins_over_the_later_ones_and_the_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, first: int
) -> None:
    root = node(tmp_path, *PATHS[first:], CA)
    client_certificate(root)
    with caplog.at_level(logging.INFO, logger="fusevol.kube.kubelet_credentials"):
        found = find(kubelet_dir=KUBELET_DIR, root=root, environ=IN_CLUSTER)
    assert found == root / PATHS[first]
    assert [r.getMessage() for r in caplog.records] == [
        f"kubelet's credentials: kubeconfig={root / PATHS[first]} ({KUBECONFIGS[first][1]})"
    ]


def test_kubelets_own_directory_is_where_its_kubeconfig_is_looked_for(tmp_path: Path) -> None:
    """`/var/lib/kubelet/kubeconfig` is `<kubelet dir>/kubeconfig` (--kubelet-dir)."""
    root = node(tmp_path, "data/kubelet/kubeconfig", "var/lib/kubelet/kubeconfig")
    found = find(kubelet_dir=Path("/data/kubelet"), root=root, environ={})
    assert found == root / "data/kubelet/kubeconfig"


def test_a_directory_is_no_kubeconfig(tmp_path: Path) -> None:
    """What a hostPath volume of a missing file leaves: an empty directory."""
    (tmp_path / PATHS[0]).mkdir(parents=True)
    node(tmp_path, PATHS[2])
    assert find(kubelet_dir=KUBELET_DIR, root=tmp_path, environ={}) == tmp_path / PATHS[2]


def test_else_kubelets_current_client_certificate_with_the_in_cluster_api_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = node(tmp_path, CA)
    pem = client_certificate(root)
    with caplog.at_level(logging.INFO, logger="fusevol.kube.kubelet_credentials"):
        found = find(kubelet_dir=KUBELET_DIR, root=root, environ=IN_CLUSTER)
    # The symlink itself, never its target: kubelet switches it to each new certificate.
    assert found == ClientCertificate(pem=pem, server="https://10.96.0.1:443", ca_file=root / CA)
    assert [r.getMessage() for r in caplog.records] == [
        f"kubelet's credentials: client certificate={pem} server=https://10.96.0.1:443 "
        f"ca={root / CA} (no kubeconfig of kubelet's found)"
    ]
    config = load_configuration(found)
    assert (config.host, config.ssl_ca_cert) == ("https://10.96.0.1:443", str(root / CA))
    assert config.cert_file == config.key_file == str(pem)
    assert not config.api_key  # no token


def test_an_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    root = node(tmp_path, CA)
    client_certificate(root)
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = find(kubelet_dir=KUBELET_DIR, root=root, environ=environ)
    assert isinstance(found, ClientCertificate)
    assert found.server == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("certificate", "ca", "environ", "missing"),
    [
        pytest.param(False, True, IN_CLUSTER, "no client certificate {pem}", id="nothing"),
        pytest.param(
            True,
            True,
            {},
            "client certificate {pem} but no API server address to use it with "
            "($KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT are unset outside a pod)",
            id="not-in-a-pod",
        ),
        pytest.param(
            True,
            False,
            IN_CLUSTER,
            "client certificate {pem} but no cluster CA {ca} to use it with",
            id="no-ca",
        ),
    ],
)
def test_else_one_error_names_every_path_tried(
    tmp_path: Path, certificate: bool, ca: bool, environ: dict[str, str], missing: str
) -> None:
    root = node(tmp_path, *([CA] if ca else []))
    if certificate:
        client_certificate(root)
    with pytest.raises(FusevolError) as raised:
        find(kubelet_dir=KUBELET_DIR, root=root, environ=environ)
    assert str(raised.value) == NOT_FOUND.format(
        root=root, missing=missing.format(pem=root / PEM, ca=root / CA)
    )


def test_a_dangling_certificate_symlink_is_none(tmp_path: Path) -> None:
    root = node(tmp_path, CA)
    (root / PEM).parent.mkdir(parents=True)
    (root / PEM).symlink_to("kubelet-client-gone.pem")
    with pytest.raises(FusevolError, match="no client certificate"):
        find(kubelet_dir=KUBELET_DIR, root=root, environ=IN_CLUSTER)


@pytest.mark.parametrize(
    ("argv", "variable"),
    [
        pytest.param(["--kubeconfig", "kubelet"], "", id="flag"),
        pytest.param([], "kubelet", id="variable"),
    ],
)
def test_the_word_kubelet_asks_for_kubelets_credentials_below_the_kubelet_dir(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], variable: str
) -> None:
    monkeypatch.delenv("FUSEVOL_KUBECONFIG", raising=False)
    monkeypatch.delenv("FUSEVOL_KUBELET_DIR", raising=False)
    if variable:
        monkeypatch.setenv("FUSEVOL_KUBECONFIG", variable)
    args = build_parser().parse_args(["run", *argv, "--kubelet-dir", "/data/kubelet"])
    assert args.kubeconfig == KUBELET
    settings = run._kube_settings(args)
    assert settings is not None
    assert settings.kubeconfig == KubeletCredentials(kubelet_dir=Path("/data/kubelet"))


def test_any_other_value_is_a_kubeconfigs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUSEVOL_KUBECONFIG", raising=False)
    args = build_parser().parse_args(["run", "--kubeconfig", "./kubelet"])
    assert args.kubeconfig == Path("kubelet")
    settings = run._kube_settings(args)
    assert settings is not None
    assert settings.kubeconfig == Path("kubelet").absolute()
