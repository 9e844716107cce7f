"""The console in a real browser: Debian's Chromium, headless, driven by Playwright's
Python package (launched at /usr/bin/chromium, nothing downloaded), against the session's
control plane, development node, store and operator. Three people, each with their own
console and identity:

- ann, an approver in the first namespace, with her own kubeconfig (a client certificate
  of the cluster's CA);
- sam, who may edit (and approve) there, through `--as sam`: he creates the runs, so the
  four-eyes rule forbids him to decide their calls;
- vic, who may only view the first namespace, through `--as vic`, and may do nothing at
  all in the second.

One browser for the module, a context (its own cookies) per person. Each page is saved at
1280x800 to the output folder (AGENTRUN_CONSOLE_SCREENSHOTS, else .local/screenshots/
console); `make console-screenshots` points it at docs/console/ after a look by eye."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools import transcript_api
from agentrun_devtools.controlplane import REPO, ControlPlane
from playwright.sync_api import Browser, Page, expect, sync_playwright

from agentrun.vocabulary import APPROVER_CLUSTER_ROLE, GROUP, VERSION, Phase
from tests.cluster_fixtures import fresh_namespace
from tests.harness import HAPPY, Operator, System, agent_run, in_namespace
from tests.kubectl.console import CHROMIUM, CHROMIUM_FLAGS, Console, console

SHOTS = Path(os.environ.get("AGENTRUN_CONSOLE_SCREENSHOTS")
             or REPO / ".local" / "screenshots" / "console")
# A call whose arguments are longer than status.pendingApproval shows (1,024 bytes).
PADDED = {"body": "Please find the refund details below. " + "x" * 1900 + " END-OF-BODY",
          "to": "customer-42@example.com"}
NEEDS_APPROVAL = [{"name": "send_email", "effect": "Effectful", "approval": "Required"}]
WAIT = 60_000  # ms: what the page may take to show a run's next step


@dataclass
class World:
    system: System
    ours: str  # ann approves, sam edits, vic views
    theirs: str  # none of them may do anything here
    ann: Path  # her kubeconfig


def _bind(system: System, ns: str, user: str, role: str) -> None:
    system.kubectl("create", "rolebinding", f"{user}-{role}", "-n", ns,
                   f"--clusterrole={role}", f"--user={user}")


def _create_as(system: System, user: str, manifest: dict[str, Any]) -> None:
    system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user=user)


@pytest.fixture(scope="module")
def world(crds: ControlPlane, store_url: str, operator: Operator) -> Iterator[World]:
    system = System(crds, store_url, operator)
    transcript_api.wait_available(crds)
    for ours in fresh_namespace(crds, "t"):
        for theirs in fresh_namespace(crds, "t"):
            for user, role in (("ann", APPROVER_CLUSTER_ROLE), ("ann", "agentrun-view"),
                               ("sam", "agentrun-edit"), ("sam", APPROVER_CLUSTER_ROLE),
                               ("vic", "agentrun-view")):
                _bind(system, ours, user, role)
            ann = crds.issue_kubeconfig("ann", "ann")
            script = [{"call": "send_email", "args": PADDED}, {"text": "Sent."}]
            _create_as(system, "sam", in_namespace(
                agent_run("pay", script, tools=NEEDS_APPROVAL), ours))
            # It called send_email, then the model failed: a replay would send it again.
            _create_as(system, "sam", in_namespace(agent_run("mailed", [
                {"call": "send_email", "args": {"to": "customer-7@example.com",
                                                "body": "Your refund"}},
                {"error": 429}]), ours))
            system.apply(in_namespace(agent_run("hidden", HAPPY), theirs))
            system.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunSchedule",
                          "metadata": {"name": "nightly-triage", "namespace": ours},
                          "spec": {"schedule": "0 2 * * *", "timeZone": "Europe/Paris",
                                   "runTemplate": {"spec": {
                                       "agent": "support-agent",
                                       "input": {"text": "Triage the overnight queue"}}}}})
            yield World(system, ours, theirs, ann)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def _open(browser: Browser, served: Console) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(served.url)  # the printed URL: its token becomes the cookie
        expect(page).to_have_url(f"{served.base}/runs")
        yield page
    finally:
        context.close()


@pytest.fixture(scope="module")
def ann(world: World, browser: Browser) -> Iterator[Page]:
    with console(world.ann, "--namespace", world.ours,
                 kubectl=world.system.plane.bin / "kubectl") as served:
        yield from _open(browser, served)


@pytest.fixture(scope="module")
def sam(world: World, browser: Browser) -> Iterator[Page]:
    with console(world.system.plane.kubeconfig, "--as", "sam", "-n", world.ours) as served:
        yield from _open(browser, served)


@pytest.fixture(scope="module")
def vic(world: World, browser: Browser) -> Iterator[Page]:
    with console(world.system.plane.kubeconfig, "--as", "vic", "-n", world.ours,
                 "-n", world.theirs) as served:
        yield from _open(browser, served)


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def go(page: Page, path: str) -> None:
    """Opens a page of the console by its own path, as a shared link would."""
    here = re.match(r"http://[^/]+", page.url)
    assert here is not None, page.url
    page.goto(here.group(0) + path)


def waiting(world: World, name: str) -> dict[str, Any]:
    return world.system.wait_run(world.ours, name, lambda r: (r.get("status") or {}).get(
        "phase") == Phase.WAITING)


def approvals(world: World, run: str) -> list[dict[str, Any]]:
    done = world.system.kubectl("get", f"agentrunapprovals.{GROUP}", "-n", world.ours,
                                "-o", "json")
    return [a for a in json.loads(done.stdout)["items"] if a["spec"]["runName"] == run]


def test_the_runs_creator_is_shown_the_four_eyes_refusal_in_its_own_words(
        world: World, sam: Page) -> None:
    waiting(world, "pay")
    go(sam, "/approvals")
    card = sam.locator(f'article[data-run="{world.ours}/pay"]')
    expect(card).to_contain_text("END-OF-BODY")
    card.get_by_role("button", name="Approve").click()
    said = card.locator(".said")
    expect(said).to_contain_text("Rejected (SelfApproval)", timeout=WAIT)
    expect(said).to_contain_text("sam created AgentRun pay and may not decide its calls")
    assert world.system.run(world.ours, "pay")["status"]["phase"] == Phase.WAITING


def test_a_viewer_sees_no_other_namespace_and_every_action_refused_by_the_api_server(
        world: World, vic: Page) -> None:
    waiting(world, "pay")
    go(vic, "/runs")
    expect(vic.locator(f'tr[data-run="{world.ours}/pay"]')).to_be_visible()
    expect(vic.locator("details.refused")).to_contain_text(world.theirs)
    assert vic.locator(f'tr[data-run^="{world.theirs}/"]').count() == 0
    shot(vic, "runs")
    go(vic, "/approvals")
    card = vic.locator(f'article[data-run="{world.ours}/pay"]')
    expect(card.locator("pre.args")).to_contain_text("END-OF-BODY")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".refusal")).to_contain_text(
        'User "vic" cannot create resource "agentrunapprovals"', timeout=WAIT)
    go(vic, f"/runs/{world.ours}/pay")
    vic.get_by_role("button", name="Cancel").click()
    expect(vic.locator(".actions .refusal")).to_contain_text(
        'User "vic" cannot patch resource "agentruns"', timeout=WAIT)
    assert not approvals(world, "pay") or all(
        a["spec"]["approver"] != "vic" for a in approvals(world, "pay"))
    go(vic, f"/runs/{world.theirs}/hidden")
    expect(vic.locator(".error")).to_contain_text('cannot get resource "agentruns"')


def test_an_approver_reads_the_whole_arguments_approves_and_sees_the_run_succeed(
        world: World, ann: Page) -> None:
    pending = waiting(world, "pay")["status"]["pendingApproval"]
    assert pending["argsTruncated"] is True
    go(ann, "/approvals")
    card = ann.locator(f'article[data-run="{world.ours}/pay"]')
    args = card.locator("pre.args")
    expect(args).to_contain_text("END-OF-BODY")
    assert json.loads(args.inner_text()) == PADDED  # whole: all 2 KB of them
    shot(ann, "approvals")
    card.get_by_label("note").fill("customer confirmed by phone")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".said")).to_contain_text("Accepted (Decided)", timeout=WAIT)
    (made,) = [a for a in approvals(world, "pay") if a["spec"]["approver"] == "ann"]
    assert made["spec"]["decision"] == "Approve"
    assert made["spec"]["note"] == "customer confirmed by phone"
    go(ann, f"/runs/{world.ours}/pay")
    expect(ann.locator("dl.summary .phase")).to_contain_text(Phase.SUCCEEDED, timeout=WAIT)
    expect(ann.locator("ol.transcript")).to_contain_text("approved")


def test_a_refused_replay_shows_the_operators_sentence_and_the_tools(
        world: World, sam: Page) -> None:
    world.system.wait_run(world.ours, "mailed", lambda r: r["status"]["phase"] == Phase.FAILED
                          and r["status"].get("toolsExecuted") is not None)
    go(sam, f"/runs/{world.ours}/mailed")
    sam.get_by_role("button", name="Replay").click()
    said = sam.locator(".actions .said")
    expect(said).to_contain_text("Refused (ToolsExecuted)", timeout=WAIT)
    expect(said).to_contain_text("send_email")
    (replay,) = json.loads(world.system.kubectl(
        "get", f"agentrunreplays.{GROUP}", "-n", world.ours, "-o", "json").stdout)["items"]
    row = sam.locator(f'tr[data-replay="{replay["metadata"]["name"]}"]')
    expect(row).to_contain_text(replay["status"]["message"])  # the operator's own words
    expect(row).to_contain_text("send_email")
    shot(sam, "run")


def test_a_live_runs_transcript_grows_without_a_reload(world: World, ann: Page) -> None:
    script = [{"call": "read_message", "args": {}}, {"sleep": 5},
              {"text": "Done after a pause."}]
    _create_as(world.system, "sam", in_namespace(agent_run("slow", script), world.ours))
    world.system.wait_run(world.ours, "slow", lambda r: r["status"]["phase"] == Phase.RUNNING)
    go(ann, f"/runs/{world.ours}/slow")
    ann.evaluate("window.__same_page = true")
    transcript = ann.locator("ol.transcript")
    expect(transcript).to_contain_text("read_message", timeout=WAIT)
    assert "Done after a pause." not in transcript.inner_text()
    expect(transcript).to_contain_text("Done after a pause.", timeout=WAIT)
    assert ann.evaluate("window.__same_page") is True  # no reload: the page followed it
    expect(ann.locator("dl.summary .phase")).to_contain_text(Phase.SUCCEEDED, timeout=WAIT)


def test_schedules_triggers_and_cost_pages(world: World, ann: Page) -> None:
    go(ann, "/schedules")
    row = ann.locator(f'tr[data-schedule="{world.ours}/nightly-triage"]')
    expect(row).to_contain_text("0 2 * * *")
    expect(row).to_contain_text("Europe/Paris")
    expect(row).to_contain_text(re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z"))
    shot(ann, "schedules")
    go(ann, "/triggers")
    triggers_served = world.system.kubectl(
        "get", "crd", f"agentruntriggers.{GROUP}", check=False).returncode == 0
    if triggers_served:
        expect(ann.locator("h1")).to_have_text("Triggers")
    else:
        expect(ann.locator("main")).to_contain_text("This cluster serves no AgentRunTrigger")
    shot(ann, "triggers")
    go(ann, "/cost")
    row = ann.locator(f'tr[data-cost="{world.ours}/support-agent"]')
    expect(row).to_be_visible(timeout=WAIT)
    expect(ann.locator("canvas")).to_be_visible()
    assert ann.locator(f'tr[data-cost^="{world.theirs}/"]').count() == 0
    shot(ann, "cost")
