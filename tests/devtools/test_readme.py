"""README's "Running the operator", typed as written, in a fresh copy of the repository
(its own .local: the development cluster, the SQLite store), `make run` included: the
sample run succeeds, its answer and transcript are read through the API server (the
development cluster's APIService, served by `make run`'s store API), and a forced replay of
it is approved and its run created and run by the operator `make run` started, although the
admin's kubeconfig is exported."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from agentrun_devtools.controlplane import REPO
from agentrun_devtools.processes import wait_for


def _readme_blocks() -> tuple[list[str], list[str]]:
    """The two shell blocks of "Running the operator": the operator's, the second shell's."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Running the operator", 1)[1]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)

    def commands(block: str) -> list[str]:
        return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]

    return commands(blocks[0]), commands(blocks[1])


def _triggers_block() -> list[str]:
    """The commands of README's "Triggers" (its sh block), continued lines joined."""
    text = (REPO / "README.md").read_text()
    section = text.split("### Triggers", 1)[1].split("\n### ", 1)[0]
    [block] = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line.split("  #", 1)[0].strip() for line in block.replace("\\\n", " ").splitlines()
            if line.strip()]


def _copy_repository(to: Path) -> None:
    """The working tree's files (committed or not, as git sees them), and the same .venv
    (left older than pyproject.toml's copy would make it: make must not reinstall)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name, follow_symlinks=False)
    (to / ".venv").symlink_to(REPO / ".venv")
    installed = (REPO / ".venv" / ".installed").stat().st_mtime
    for name in ("pyproject.toml", "requirements.lock"):
        os.utime(to / name, (installed - 60, installed - 60))


def test_the_readme_flow_runs_and_replays(tmp_path: Path, the_machines_dev_cluster: None) -> None:
    first, second = _readme_blocks()
    assert first[0] == "make dev-cluster" and first[-1] == "make run", first
    assert second[-1] == "make dev-cluster-down", second
    checkout = tmp_path / "agentrun"
    checkout.mkdir()
    _copy_repository(checkout)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "DATABASE_URL")}

    def shell(commands: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        script = "set -euo pipefail\n" + "\n".join(commands)
        return subprocess.run(["bash", "-c", script], cwd=checkout, env=env, text=True,
                              capture_output=True, timeout=600, **kw)  # type: ignore[call-overload]

    exports = [c for c in first if c.startswith("export ")]
    operator: subprocess.Popen[str] | None = None
    log = tmp_path / "make-run.log"
    try:
        done = shell(first[:-1])  # everything before `make run`
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with open(log, "w") as out:
            operator = subprocess.Popen(["bash", "-c", "\n".join([*exports, first[-1]])],
                                        cwd=checkout, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        wait_for(lambda: "event=started" in log.read_text(), timeout=90, what="make run")
        text = log.read_text()
        assert f"KUBECONFIG={checkout / '.local' / 'operator.kubeconfig'}" in text, text[-2000:]

        apply, get, result, transcript, replay, get_replays, _down = second
        assert shell([*exports, apply]).returncode == 0

        def phase(kind: str, name: str) -> str:
            got = shell([*exports, f"kubectl get {kind} {name} -o json"])
            return "" if got.returncode else str(json.loads(got.stdout).get("status", {}).get(
                "phase", ""))

        wait_for(lambda: phase("ar", "scripted-refund") == "Succeeded", timeout=120,
                 what="the sample run Succeeded")
        shown = shell([*exports, get]).stdout
        assert "Succeeded" in shown and '["send_email"]' in shown, shown
        # Through the development cluster's API server and its APIService, to the transcript
        # API that `make run`'s store API serves.
        answer = shell([*exports, result])
        assert answer.stdout == "Refund confirmed by email.\n", answer.stdout + answer.stderr
        told = shell([*exports, transcript])
        assert told.returncode == 0, told.stderr
        assert "support_agent calls send_email (call 1)" in told.stdout, told.stdout
        assert "support_agent: Refund confirmed by email." in told.stdout, told.stdout
        made = shell([*exports, replay])
        assert made.returncode == 0, made.stdout + made.stderr
        replay_name = re.search(r"agentrunreplay\S*/(\S+)", made.stdout + made.stderr)
        assert replay_name, made.stdout + made.stderr

        def approved() -> bool:
            got = shell([*exports, f"kubectl get arr {replay_name.group(1)} -o json"])
            status = json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}
            return status.get("phase") == "Approved" and bool(status.get("replayRunName"))

        wait_for(approved, timeout=60, what="the replay approved with its run created")
        listed = shell([*exports, get_replays]).stdout
        assert "Approved" in listed and "Forced" in listed, listed
        replay_obj = json.loads(shell([*exports, f"kubectl get arr {replay_name.group(1)} "
                                                  "-o json"]).stdout)
        replay_run = replay_obj["status"]["replayRunName"]
        wait_for(lambda: phase("ar", replay_run) == "Succeeded", timeout=120,
                 what="the replay run Succeeded")
        assert "event=startup-check-failed" not in log.read_text()
        assert "event=startup-check-passed" in log.read_text()
        # README's Triggers, with the trigger receiver `make run` started beside the
        # operator: a GitHub-style delivery starts one run, the same again none.
        trigger = _triggers_block()
        created = [i for i, c in enumerate(trigger) if c.startswith("kubectl apply")]
        assert shell([*exports, *trigger[:created[0] + 1]]).returncode == 0
        assert shell([*exports, "kubectl wait art/github-issues --for=condition=Ready "
                                "--timeout=60s"]).returncode == 0
        sent = shell([*exports, *trigger[created[0] + 1:]])
        assert '"result": "created"' in sent.stdout, sent.stdout + sent.stderr
        again = shell([*exports, *trigger[created[0] + 1:]])
        assert '"result": "duplicate"' in again.stdout, again.stdout + again.stderr
        runs = shell([*exports, "kubectl get ar -l agentrun.dev/trigger=github-issues "
                                "-o name"]).stdout.split()
        assert len(runs) == 1, runs
    finally:
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
        down = shell([*exports, second[-1]])
        time.sleep(0.5)
    assert down.returncode == 0, down.stdout + down.stderr
