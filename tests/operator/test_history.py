"""The run archive through the Kubernetes API server (runs.store.agentrun.dev, served by the
session operator's store API): a run deleted after its time to live stays readable, with
its transcript by uid once its name is used again; each tenant sees only what its RBAC
allows; a list of a thousand records comes in pages and selectors filter on the server."""

from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools import transcript_api
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for
from sqlalchemy import update

from agentrun import store
from agentrun.store.schema import runs
from agentrun.vocabulary import GROUP, Phase, RunStatus
from tests.harness import HAPPY, System, agent_run, delete_namespace, in_namespace

RECORDS = "runs.store.agentrun.dev"
TRANSCRIPTS = "transcripts.store.agentrun.dev"
BIN = Path(sys.executable).parent  # kubectl-agentrun, found by kubectl on PATH


@pytest.fixture(scope="module")
def viewers(control_plane: ControlPlane) -> dict[str, Path]:
    """Kubeconfigs of erin and frank (client certificates of the cluster's CA)."""
    return {name: control_plane.issue_kubeconfig(name, name) for name in ("erin", "frank")}


@pytest.fixture
def archive(system: System, namespace: str, control_plane: ControlPlane,
            tmp_path: Path) -> Iterator[tuple[System, str, str]]:
    """Two namespaces: erin views the first, frank the second (agentrun-view)."""
    transcript_api.wait_available(system.plane)
    other = f"{namespace}-b"
    control_plane.kubectl("create", "namespace", other)
    try:
        for ns, user in ((namespace, "erin"), (other, "frank")):
            system.kubectl("create", "rolebinding", f"{user}-view", "-n", ns,
                           "--clusterrole=agentrun-view", f"--user={user}")
        yield system, namespace, other
    finally:
        delete_namespace(control_plane, other)


def _as(system: System, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl (and the plugin on PATH) with the user's own kubeconfig."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(kubeconfig)}
    env.pop("DATABASE_URL", None)
    return subprocess.run([str(system.plane.bin / "kubectl"), *args], capture_output=True,
                          text=True, env=env, timeout=120)


def _get(system: System, kubeconfig: Path, path: str) -> tuple[int, dict[str, Any]]:
    """GET `path` of the API server as the kubeconfig's user: the status and the body."""
    user = json.loads(kubeconfig.read_text())["users"][0]["user"]
    context = ssl.create_default_context(cafile=str(system.plane.ca_cert))
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    try:
        with urllib.request.urlopen(f"{system.plane.server}{path}", context=context,
                                    timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _settled(system: System, ns: str, name: str) -> dict[str, Any]:
    return system.wait_run(ns, name, lambda r: (r.get("status") or {}).get(
        "phase") in Phase.TERMINAL and r["status"].get("toolsExecuted") is not None)


def test_a_deleted_run_stays_in_the_archive_and_its_transcript_is_served_by_uid(
    archive: tuple[System, str, str], viewers: dict[str, Path]
) -> None:
    system, ns, other = archive
    erin, frank = viewers["erin"], viewers["frank"]
    system.apply(in_namespace(agent_run("archived-mail", HAPPY, ttlSecondsAfterFinished=3,
                                        ), ns))
    first = _settled(system, ns, "archived-mail")
    first_uid = first["metadata"]["uid"]
    wait_for(lambda: system.get(f"agentruns.{GROUP}", ns, "archived-mail") is None, timeout=60,
             what="the run deleted after its time to live")

    shown = _as(system, erin, "get", RECORDS, "archived-mail", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "REASON", "TOOLS-EXECUTED", "AGENT", "AGE"]
    assert row.split()[:2] == ["archived-mail", Phase.SUCCEEDED]
    assert "read_message,send_email,update_crm" in row.split()
    as_json = json.loads(_as(system, erin, "get", RECORDS, "archived-mail", "-n", ns,
                             "-o", "json").stdout)
    assert as_json["kind"] == "RunRecord" and as_json["metadata"]["uid"] == first_uid
    assert as_json["status"]["inAPIServer"] is False
    assert as_json["status"]["toolsExecuted"] == ["read_message", "send_email", "update_crm"]
    assert as_json["status"]["usage"]["toolCalls"] == 3
    # Its transcript is still served, by name while the name is not used again.
    transcript = json.loads(_as(system, erin, "get", TRANSCRIPTS, "archived-mail", "-n", ns,
                                "-o", "json").stdout)
    assert transcript["run"] == {"name": "archived-mail", "uid": first_uid,
                                 "phase": Phase.SUCCEEDED}

    # The name used again: by name, the newest run; by uid, the first.
    system.apply(in_namespace(agent_run("archived-mail", [{"text": "Second time, no tools."}]), ns))
    second_uid = _settled(system, ns, "archived-mail")["metadata"]["uid"]
    record = json.loads(_as(system, erin, "get", RECORDS, "archived-mail", "-n", ns,
                            "-o", "json").stdout)
    assert record["metadata"]["uid"] == second_uid and record["status"]["inAPIServer"]
    newest = json.loads(_as(system, erin, "get", TRANSCRIPTS, "archived-mail", "-n", ns,
                            "-o", "json").stdout)
    assert newest["run"]["uid"] == second_uid
    by_uid = _as(system, erin, "agentrun", "transcript", "archived-mail", "-n", ns,
                 "--uid", first_uid)
    assert by_uid.returncode == 0, by_uid.stderr
    assert "send_email" in by_uid.stdout and "Second time" not in by_uid.stdout
    listed = _as(system, erin, "agentrun", "history", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "UID", "PHASE", "REASON", "TOOLS", "EXECUTED",
                                "CREATED"]
    assert [line.split()[1] for line in lines[1:]] == [second_uid, first_uid]  # newest first

    # The other tenant: forbidden by name, across namespaces, and by uid from its own.
    for args in (("get", RECORDS, "archived-mail", "-n", ns), ("get", RECORDS, "-n", ns),
                 ("get", RECORDS, "-A"), ("agentrun", "history", "-A")):
        refused = _as(system, frank, *args)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), (
            args, refused.stderr)
    assert 'User "frank" cannot get resource "runs" in API group "store.agentrun.dev" in ' \
        f'the namespace "{ns}"' in _as(system, frank, "get", RECORDS, "archived-mail",
                                       "-n", ns).stderr
    base = "/apis/store.agentrun.dev/v1alpha1/namespaces"
    selector = urllib.parse.quote(f"metadata.uid={first_uid}")
    for path in (f"{base}/{other}/runs/archived-mail?fieldSelector={selector}",
                 f"{base}/{other}/transcripts/archived-mail?fieldSelector={selector}"):
        code, body = _get(system, frank, path)
        assert code == 404, (path, code, body)
    assert _get(system, frank, f"{base}/{other}/runs")[1]["items"] == []


def test_a_thousand_records_come_in_pages_and_selectors_filter_on_the_server(
    archive: tuple[System, str, str], viewers: dict[str, Path]
) -> None:
    system, ns, _ = archive
    t0 = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)

    async def seed(engine: Any) -> None:
        for i in range(1000):
            uid = f"{ns}-record-{i:04d}"
            await store.record_run(engine, uid, ns, f"nightly-{i}", "support-agent",
                                   "schedule", "alice", None,
                                   labels={"tier": "gold" if i % 10 == 0 else "bronze"})
        async with engine.begin() as conn:
            for i in range(1000):
                await conn.execute(update(runs).where(runs.c.uid == f"{ns}-record-{i:04d}")
                                   .values(created_at=t0 + datetime.timedelta(minutes=i),
                                           status=RunStatus.FAILED if i % 100 == 7
                                           else RunStatus.SUCCEEDED))

    system.store(seed)
    base = f"/apis/store.agentrun.dev/v1alpha1/namespaces/{ns}/runs"
    names, token, pages = [], "", 0
    while True:
        code, page = _get(system, viewers["erin"], f"{base}?limit=250" + (
            f"&continue={urllib.parse.quote(token)}" if token else ""))
        assert code == 200, page
        pages += 1
        names += [r["metadata"]["name"] for r in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert pages == 4 and names == [f"nightly-{i}" for i in range(999, -1, -1)]
    gold = _get(system, viewers["erin"], f"{base}?labelSelector=tier%3Dgold&limit=500")[1]
    assert len(gold["items"]) == 100 and "continue" not in gold["metadata"]
    assert {r["metadata"]["labels"]["tier"] for r in gold["items"]} == {"gold"}
    failed = _get(system, viewers["erin"], f"{base}?fieldSelector=status.phase%3DFailed")[1]
    assert [r["metadata"]["name"] for r in failed["items"]] == [
        f"nightly-{i}" for i in range(907, 0, -100)]
    refused = _get(system, viewers["erin"], f"{base}?fieldSelector=status.reason%3DEvicted")
    assert refused[0] == 400 and "field label not supported" in refused[1]["message"]
    since = _get(system, viewers["erin"], f"{base}?since=2026-11-01T16:30:00Z")[1]
    assert [r["metadata"]["name"] for r in since["items"]][-1] == "nightly-990"
    history = _as(system, viewers["erin"], "agentrun", "history", "-n", ns, "--phase",
                  "Failed")
    assert history.returncode == 0, history.stderr
    assert len(history.stdout.splitlines()) == 1 + 10
