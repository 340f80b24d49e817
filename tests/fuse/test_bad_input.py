"""Bad input gets one clear error naming the object and field; all else keeps being served."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.agent import AgentProcess, wait_for, write_atomically
from tests.fuse.conftest import POD_UID, configmap, pod

if TYPE_CHECKING:
    from pathlib import Path

OTHER_UID = "77777777-2222-4333-8444-555555555555"


def _served_untouched(agent: AgentProcess) -> None:
    assert (agent.volume(POD_UID, "configmap", "config") / "a").read_text() == "1"
    assert (agent.volume(POD_UID, "secret", "creds") / "token").read_text() == "t0ken"


def test_malformed_manifest_is_reported_and_ignored(agent: AgentProcess, manifests: Path) -> None:
    (manifests / "broken.yaml").write_text("kind: ConfigMap\nmetadata: {name: x\n  data: [")
    wait_for(lambda: "broken.yaml" in agent.log_text())
    line = next(line for line in agent.log_text().splitlines() if "broken.yaml" in line)
    assert "ERROR" in line
    _served_untouched(agent)


def test_bad_edit_keeps_the_last_good_version(agent: AgentProcess, manifests: Path) -> None:
    volume = agent.volume(POD_UID, "configmap", "config")
    before = (volume / "..data").readlink()
    write_atomically(manifests / "configmap.yaml", configmap() + "  bad: [unclosed\n")
    wait_for(lambda: "configmap.yaml" in agent.log_text() and "ERROR" in agent.log_text())
    assert (volume / "..data").readlink() == before
    assert (volume / "a").read_text() == "1"
    write_atomically(manifests / "configmap.yaml", configmap(a="fixed"))
    wait_for(lambda: (volume / "a").read_text() == "fixed")


def test_invalid_key_path_names_the_field(agent: AgentProcess, manifests: Path) -> None:
    bad = pod(name="bad-path", uid=OTHER_UID).replace(
        "configMap: {name: app}", "configMap: {name: app, items: [{key: a, path: ../x}]}"
    )
    (manifests / "bad-path.yaml").write_text(bad)
    wait_for(lambda: "bad-path.yaml" in agent.log_text())
    line = next(line for line in agent.log_text().splitlines() if "bad-path.yaml" in line)
    assert "../x" in line
    assert "items" in line
    assert "default/bad-path" in line
    assert not (agent.root / "pods" / OTHER_UID).exists()
    _served_untouched(agent)


def test_missing_configmap_is_retried_until_it_appears(
    agent: AgentProcess, manifests: Path
) -> None:
    needs = pod(name="needs", uid=OTHER_UID).replace("{name: app}", "{name: later}")
    (manifests / "needs.yaml").write_text(needs)
    wait_for(lambda: agent.volume_status(OTHER_UID, "config").get("state") == "failed")
    status = agent.volume_status(OTHER_UID, "config")
    assert status["last_error"] == 'configmap "later" not found'
    assert 'configmap "later" not found' in agent.log_text()
    # The pod's other volume is served meanwhile, and so is everything else.
    agent.wait_mounted(agent.volume(OTHER_UID, "secret", "creds"))
    _served_untouched(agent)

    (manifests / "later.yaml").write_text(
        "kind: ConfigMap\nmetadata: {name: later}\ndata: {k: here}\n"
    )
    volume = agent.wait_mounted(agent.volume(OTHER_UID, "configmap", "config"), timeout_s=5)
    assert (volume / "k").read_text() == "here"


def test_deleted_object_keeps_the_files_of_running_pods(
    agent: AgentProcess, manifests: Path
) -> None:
    (manifests / "configmap.yaml").unlink()
    wait_for(lambda: agent.volume_status(POD_UID, "config").get("state") == "update-failed")
    assert agent.volume_status(POD_UID, "config")["last_error"] == 'configmap "app" not found'
    _served_untouched(agent)
