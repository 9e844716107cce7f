"""`kubectl agentrun`: replay a run, see which tools it called, and why a replay was decided;
cancel a run in place; start a schedule's run now.

    kubectl agentrun replay RUN [--force] [--note TEXT] [--name NAME]
    kubectl agentrun approve RUN [--deny] [--note TEXT]
    kubectl agentrun tools RUN
    kubectl agentrun why REPLAY
    kubectl agentrun cancel RUN [--note TEXT]
    kubectl agentrun schedule trigger SCHEDULE
    kubectl agentrun result RUN [-o json]
    kubectl agentrun transcript RUN [-f] [--uid UID]
    kubectl agentrun history [-A] [--since 24h] [--phase Failed] [-l SELECTOR]

Installed as the console script `kubectl-agentrun`; kubectl finds it on PATH. It talks to
the cluster as kubectl does (KUBECONFIG / --kubeconfig, --context, or in-cluster), in the
namespace given by -n/--namespace or else the context's. `tools` shows the ledger the
operator publishes on a settled run (status.toolCalls): no database credential is
needed. With DATABASE_URL (or --database-url) it reads the run store instead, which also
shows the calls of a run still going. `result` and `transcript` read the run's Transcript
through the API server (the aggregated API store.agentrun.dev, which the store API serves):
the user's own kubeconfig and RBAC (agentrun-view) are all they need. `history` lists
the run archive (runs.store.agentrun.dev) the same way: every run the store recorded,
including those deleted from the API server after their time to live.

Exit codes: 0 done (replay approved); 1 refused (by the operator or by the API server);
2 usage or connection errors, or no decision in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.effects import args_digest
from agentrun.ledger import LedgerEntry
from agentrun.scheduled import belongs_to, scheduled_run
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    ANNOTATION_FORCE_REPLAY,
    API_VERSION,
    APPROVAL_KIND,
    APPROVAL_PLURAL,
    APPROVER_CLUSTER_ROLE,
    ENV_DATABASE_URL,
    GROUP,
    LABEL_SCHEDULE,
    REPLAY_KIND,
    REPLAY_PLURAL,
    RUN_PLURAL,
    SCHEDULE_PLURAL,
    TRANSCRIPT_API_SERVICE,
    TRANSCRIPT_AUTHOR,
    TRANSCRIPT_GROUP,
    TRANSCRIPT_PLURAL,
    TRANSCRIPT_VERSION,
    VERSION,
    ApprovalDecision,
    ApprovalPhase,
    ConcurrencyPolicy,
    EntryKind,
    EntryState,
    LedgerOutcome,
    Phase,
    ReplayPhase,
)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

OK, REFUSED, ERROR = 0, 1, 2
# How long a 503 of the aggregated API is waited out: longer than the aggregator's 30 s
# between looks at an unavailable APIService.
UNAVAILABLE_WAIT = 45.0


class Failure(Exception):
    """Something the user must fix; printed without a traceback."""

    def __init__(self, message: str, code: int = ERROR) -> None:
        super().__init__(message)
        self.code = code


# -- the cluster --------------------------------------------------------------------------


class Cluster:
    """The two kinds, in one namespace, through the official client."""

    def __init__(self, kubeconfig: str | None, context: str | None,
                 namespace: str | None, as_user: str | None = None,
                 as_group: str | None = None) -> None:
        try:
            if kubeconfig or context or not SA_NAMESPACE.exists():
                config.load_kube_config(config_file=kubeconfig, context=context)
                contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
                if context:
                    current = next(c for c in contexts if c["name"] == context)
                default_ns = (current.get("context") or {}).get("namespace") or "default"
            else:
                config.load_incluster_config()
                default_ns = SA_NAMESPACE.read_text().strip()
        except (config.ConfigException, OSError, StopIteration) as e:
            raise Failure(f"cannot find a cluster to talk to: {e}") from e
        self.namespace = namespace or default_ns
        if as_user:
            # Impersonation, as kubectl's --as/--as-group (kubectl passes no flag it placed
            # before a plugin's name; these go after it).
            configuration = client.Configuration.get_default_copy()
            api = client.ApiClient(configuration)
            api.set_default_header("Impersonate-User", as_user)
            if as_group:
                api.set_default_header("Impersonate-Group", as_group)
            client.Configuration.set_default(configuration)
            self._api_client: client.ApiClient | None = api
        else:
            self._api_client = None
        self.api = client.CustomObjectsApi(self._api_client)

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            found: Any = self.api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise Failure(api_message(e)) from e
        return dict(found)

    def create_replay(self, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, REPLAY_PLURAL, manifest)
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e
        return dict(created)

    def create(self, plural: str, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, manifest)
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 409, 422) else ERROR) \
                from e
        return dict(created)

    def whoami(self) -> str:
        """The current user's name, as the API server authenticates it (SelfSubjectReview)."""
        review: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            done: Any = client.AuthenticationV1Api(
                self._api_client).create_self_subject_review(review)
        except ApiException as e:
            raise Failure(api_message(e)) from e
        return str(done.status.user_info.username)

    def transcript_path(self, run: str) -> str:
        return (f"/apis/{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}/namespaces/{self.namespace}/"
                f"{TRANSCRIPT_PLURAL}/{run}")

    def transcript(self, run: str, uid: str | None = None) -> dict[str, Any]:
        """The run's Transcript, through the API server as the current user (with `uid`:
        that run of the name, its AgentRun deleted or not)."""
        return self._read(self.transcript_path(run), _by_uid(uid))

    def follow(self, run: str, uid: str | None = None) -> Any:
        """The streamed entries of a live run (`?follow=true`): a response to read by line."""
        return self._call(self.transcript_path(run), [("follow", "true"), *_by_uid(uid)],
                          stream=True)

    def records(self, query: list[tuple[str, str]], *, everywhere: bool) -> Iterator[
            dict[str, Any]]:
        """The run archive's RunRecords (runs.store.agentrun.dev), newest first, every page
        of them."""
        where = "" if everywhere else f"/namespaces/{self.namespace}"
        path = f"/apis/{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}{where}/runs"
        token = ""
        while True:
            page = self._read(path, [*query, *([("continue", token)] if token else [])])
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def _read(self, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        response = self._call(path, query)
        try:
            body: dict[str, Any] = json.loads(response.read() or b"{}")
        finally:
            response.response.release_conn()
        return body

    def _call(self, path: str, query: list[tuple[str, str]], *, stream: bool = False) -> Any:
        """GET `path` of the aggregated API. The API server answers 503 while its aggregator
        has not found the transcript API available (just installed, or the store API just
        started: it looks again every 30 s, and at once when the Service's endpoints
        change): that is waited out for UNAVAILABLE_WAIT seconds, saying so once."""
        api = self._api_client or client.ApiClient()  # --as and --as-group hold here too
        deadline = time.monotonic() + UNAVAILABLE_WAIT
        told = False
        while True:
            serialized = api.param_serialize(
                method="GET", resource_path=path, query_params=query,
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
            try:
                # Connect in 10 s; a followed stream may be quiet as long as its run thinks.
                response = api.call_api(*serialized,
                                        _request_timeout=(10, None if stream else 60))
            except (ApiException, OSError) as e:
                raise Failure(f"cannot reach the Kubernetes API server: {e}") from e
            if response.status == 200:
                return response
            body = response.read()
            response.response.release_conn()
            try:
                message = json.loads(body).get("message")
            except ValueError:
                message = None
            said = f"Error from server ({response.reason}): " \
                f"{(message or body.decode(errors='replace')).strip()}"
            if response.status != 503:
                raise Failure(said, REFUSED if response.status in (403, 404) else ERROR)
            if time.monotonic() >= deadline:
                raise Failure(f"{said}; {self._transcript_api_state()}")
            if not told:
                print(f"{said}: the API server has not found the transcript API available "
                      f"yet ({self._transcript_api_state()}); trying again for up to "
                      f"{UNAVAILABLE_WAIT:.0f} s", file=sys.stderr)
                told = True
            time.sleep(1.0)

    def _transcript_api_state(self) -> str:
        """The transcript APIService's Available condition, as far as the user may read it."""
        name = f"APIService {TRANSCRIPT_API_SERVICE}"
        try:
            found: Any = client.ApiregistrationV1Api(self._api_client).read_api_service(
                TRANSCRIPT_API_SERVICE)
        except ApiException as e:
            return f"{name}: not readable by you ({e.status}); a cluster admin can run " \
                f"`kubectl get apiservice {TRANSCRIPT_API_SERVICE}`"
        except OSError as e:
            return f"{name}: not readable ({e})"
        available = next((c for c in (found.status.conditions or []) if c.type == "Available"),
                         None)
        if available is None:
            return f"{name}: no Available condition yet"
        return f"{name} Available={available.status} {available.reason}: {available.message}"

    def annotate_replay(self, name: str, annotations: dict[str, str]) -> None:
        self.annotate(REPLAY_PLURAL, name, annotations)

    def annotate(self, plural: str, name: str, annotations: dict[str, str]) -> None:
        try:
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name,
                {"metadata": {"annotations": annotations}})
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e

    def create_run(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Creates an AgentRun; None when one of that name exists already."""
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, manifest)
        except ApiException as e:
            if e.status == 409:
                return None
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e
        return dict(created)

    def list_runs(self, label_selector: str) -> list[dict[str, Any]]:
        try:
            found: Any = self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, label_selector=label_selector)
        except ApiException as e:
            raise Failure(api_message(e)) from e
        return list(found.get("items") or [])


def api_message(e: ApiException) -> str:
    """The API server's own sentence (an admission policy's message, for one)."""
    try:
        message = json.loads(e.body or "{}").get("message")
    except ValueError:
        message = None
    return f"Error from server ({e.reason}): {message or e.body or e}"


# -- replay -----------------------------------------------------------------------------------


def replay(cluster: Cluster, run: str, *, force: bool, note: str | None, name: str | None,
           timeout: float, resume: bool = False) -> int:
    """Creates an AgentRunReplay of `run` (forced: with the annotation), waits for the
    operator's decision and prints it."""
    if cluster.get(RUN_PLURAL, run) is None:
        print(f"note: AgentRun {run} does not exist in namespace {cluster.namespace}; the "
              "operator will refuse the replay (RunNotFound)", file=sys.stderr)
    existing = cluster.get(REPLAY_PLURAL, name) if name else None
    if existing is not None:
        if existing["spec"].get("runName") != run:
            raise Failure(f"AgentRunReplay {name} replays {existing['spec'].get('runName')}, "
                          f"not {run}")
        if force:
            cluster.annotate_replay(name or "", {ANNOTATION_FORCE_REPLAY: "true"})
            print(f"agentrunreplay/{name} annotated {ANNOTATION_FORCE_REPLAY}=true")
        replay_name = existing["metadata"]["name"]
    else:
        created = cluster.create_replay(replay_manifest(name, run, force=force, note=note,
                                                        resume=resume))
        replay_name = created["metadata"]["name"]
        print(f"agentrunreplay/{replay_name} created" + (" (forced)" if force else ""))
    decided = wait_for_decision(cluster, replay_name, timeout, forced=force)
    print_decision(decided)
    return OK if decided["status"]["phase"] == ReplayPhase.APPROVED else REFUSED


def replay_manifest(name: str | None, run: str, *, force: bool = False,
                    note: str | None = None, resume: bool = False) -> dict[str, Any]:
    """An AgentRunReplay of `run` (no name: a generated one), forced with the annotation;
    with `resume`, one that continues the run from its journal."""
    kind = "resume" if resume else "replay"
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": f"{run}-{kind}-"}
    if force:
        metadata["annotations"] = {ANNOTATION_FORCE_REPLAY: "true"}
    spec: dict[str, Any] = {"runName": run}
    if note:
        spec["note"] = note
    if resume:
        spec["resume"] = True
    return {"apiVersion": API_VERSION, "kind": REPLAY_KIND, "metadata": metadata, "spec": spec}


def wait_for_decision(cluster: Cluster, name: str, timeout: float, *,
                      forced: bool = False) -> dict[str, Any]:
    """Until the replay is decided; when forcing, until its Refused status was looked at
    again (an Approved status, or a refusal decided after the annotation)."""
    began = time.monotonic()
    since = time.time()
    while True:
        found = cluster.get(REPLAY_PLURAL, name)
        status = (found or {}).get("status") or {}
        phase = status.get("phase")
        if found is not None and phase == ReplayPhase.APPROVED:
            return found
        if found is not None and phase == ReplayPhase.REFUSED and (
                not forced or _decided_after(status, since)):
            return found
        if time.monotonic() - began > timeout:
            raise Failure(f"AgentRunReplay {name} was not decided within {timeout:.0f}s; is the "
                          "agentrun operator running? (kubectl agentrun why " + name + ")")
        time.sleep(0.5)


def _decided_after(status: dict[str, Any], since: float) -> bool:
    try:
        at = datetime.fromisoformat(str(status.get("decidedAt")).replace("Z", "+00:00"))
    except ValueError:
        return False
    return at.timestamp() >= int(since)  # decidedAt has whole seconds


def print_decision(replay: dict[str, Any]) -> None:
    meta, spec = replay["metadata"], replay.get("spec") or {}
    status = replay.get("status") or {}
    run = spec.get("runName")
    phase = status.get("phase") or ReplayPhase.PENDING
    headline = f"{phase} ({status['reason']})" if status.get("reason") else phase
    print(f"AgentRunReplay {meta['name']} of AgentRun {run}: {headline}")
    if not status.get("phase"):
        print("  the operator has not decided yet")
        return
    print(f"  {status.get('message', '')}")
    forced = (meta.get("annotations") or {}).get(ANNOTATION_FORCE_REPLAY)
    if forced is not None:
        print(f"  force:          {ANNOTATION_FORCE_REPLAY}={forced}")
    if "toolsExecuted" in status:
        tools = status["toolsExecuted"]
        told = "unknown" if tools is None else (", ".join(tools) or "none")
        print(f"  tools executed: {told} (by {run}, at decision time)")
    if status.get("replayRunName"):
        print(f"  replay run:     {status['replayRunName']} "
              f"(kubectl get agentrun {status['replayRunName']} -n {meta['namespace']})")
    if status.get("decidedAt"):
        print(f"  decided at:     {status['decidedAt']}")
    if spec.get("note"):
        print(f"  note:           {spec['note']}")


# -- approve ----------------------------------------------------------------------------------


def whole_arguments(cluster: Cluster, run: str, pending: dict[str, Any]) -> dict[str, Any]:
    """The whole arguments of the call `run` waits for, read from its transcript as the
    current user (status.pendingApproval.args is their first 1,024 bytes only), and
    checked against the digest an approval will name. Anything less refuses: nobody
    approves arguments they were not shown in full."""
    call = f"call {pending['seq']} ({pending['tool']}) of AgentRun {run}"
    try:
        transcript = cluster.transcript(run)
    except Failure as e:
        raise Failure(f"Not deciding {call}: its whole arguments cannot be read from its "
                      f"transcript ({e}), and nothing is approved unseen. Reading them needs "
                      f"get on {TRANSCRIPT_PLURAL}.{TRANSCRIPT_GROUP} (ClusterRole "
                      f"{APPROVER_CLUSTER_ROLE} grants it).", REFUSED) from e
    asked = next((e for e in reversed(transcript.get("entries") or [])
                  if e.get("kind") == EntryKind.APPROVAL
                  and e.get("author") == TRANSCRIPT_AUTHOR
                  and e.get("attempt") == pending.get("attempt")
                  and e.get("seq") == pending.get("seq")
                  and e.get("tool") == pending.get("tool")), None)
    args = (asked or {}).get("args")
    if not isinstance(args, dict):
        raise Failure(f"Not deciding {call}: its transcript does not hold its arguments, and "
                      "nothing is approved unseen.", REFUSED)
    if args_digest(args) != pending.get("argsDigest"):
        raise Failure(f"Not deciding {call}: the arguments its transcript holds have digest "
                      f"{args_digest(args)}, not {pending.get('argsDigest')} (what an approval "
                      "would approve), and nothing is approved unseen.", REFUSED)
    return args


def _show_long(text: str, call: str) -> None:
    """Prints `text`, through the user's pager ($PAGER, else `less`) when it is longer than
    the terminal; as it is when the output is not a terminal. A pager that could not show
    it (it does not start, or exits with an error) or an interrupt while it shows refuses:
    the decision is made only on what was shown."""
    import shutil
    import subprocess

    if not (sys.stdout.isatty() and text.count("\n") + 1 >
            shutil.get_terminal_size().lines - 4):
        print(text)
        return
    pager = os.environ.get("PAGER") or "less"
    sys.stdout.flush()
    try:
        # pydoc.pager would do, but it carries on whatever the pager did (a PAGER that
        # does not start shows nothing), and swallows the interrupt.
        shown = subprocess.run(pager, shell=True, input=text + "\n", text=True, check=False)
    except KeyboardInterrupt:
        raise Failure(f"Not deciding {call}: interrupted while its arguments were shown, "
                      "and nothing is approved unseen.", REFUSED) from None
    if shown.returncode != 0:
        raise Failure(f"Not deciding {call}: the pager {pager!r} exited "
                      f"{shown.returncode} before its arguments were shown, and nothing is "
                      "approved unseen. Set PAGER to a pager that works, or pipe the "
                      "output (| cat) to print them whole.", REFUSED)


def approve(cluster: Cluster, run: str, *, deny: bool, note: str | None,
            timeout: float) -> int:
    """Shows the call `run` waits for, with its arguments, and decides it as the current
    user: an AgentRunApproval of exactly those arguments (their digest)."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    status = found.get("status") or {}
    pending = status.get("pendingApproval")
    if status.get("phase") != Phase.WAITING or not pending:
        raise Failure(f"AgentRun {run} waits for no approval: it is "
                      f"{status.get('phase') or Phase.PENDING}"
                      + (f" ({status['reason']})" if status.get("reason") else ""),
                      REFUSED)
    print(f"AgentRun {run} waits for an approval of {pending['tool']} (call "
          f"{pending['seq']}, attempt {pending['attempt']}), asked at "
          f"{pending.get('requestedAt')}, until {pending.get('expiresAt')}:")
    args = whole_arguments(cluster, run, pending)
    shown = json.dumps(args, indent=2, sort_keys=True, ensure_ascii=False)
    _show_long(f"  arguments (whole, {len(shown.encode()):,} bytes as shown):\n"
               + "\n".join(f"    {line}" for line in shown.splitlines()),
               f"call {pending['seq']} ({pending['tool']}) of AgentRun {run}")
    print(f"  digest:    {pending['argsDigest']}")
    decision = ApprovalDecision.DENY if deny else ApprovalDecision.APPROVE
    user = cluster.whoami()
    spec: dict[str, Any] = {"runName": run, "seq": int(pending["seq"]),
                            "argsDigest": pending["argsDigest"], "decision": decision,
                            "approver": user}
    if note:
        spec["note"] = note
    name = f"{run}-call-{pending['seq']}"
    meta: dict[str, Any] = {"name": name} if cluster.get(APPROVAL_PLURAL, name) is None \
        else {"generateName": f"{name}-"}
    made = cluster.create(APPROVAL_PLURAL, {"apiVersion": API_VERSION, "kind": APPROVAL_KIND,
                                            "metadata": meta, "spec": spec})
    made_name = made["metadata"]["name"]
    print(f"agentrunapproval/{made_name} created ({decision} by {user})")
    began = time.monotonic()
    while True:
        judged = cluster.get(APPROVAL_PLURAL, made_name) or {}
        verdict = judged.get("status") or {}
        if verdict.get("phase"):
            print(f"{verdict['phase']} ({verdict.get('reason')}): {verdict.get('message')}")
            return OK if verdict["phase"] == ApprovalPhase.ACCEPTED else REFUSED
        if time.monotonic() - began > timeout:
            raise Failure(f"AgentRunApproval {made_name} was not judged within {timeout:.0f}s; "
                          "is the agentrun operator running?")
        time.sleep(0.5)


# -- tools ------------------------------------------------------------------------------------


def tools(cluster: Cluster, run: str, database_url: str | None) -> int:
    """The ledger of each attempt of `run`: tool, when it was called, whether it answered:
    the run's published status.toolCalls, or the run store itself given `database_url`."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    status = found.get("status") or {}
    if database_url:
        _check_store(database_url)
        entries = asyncio.run(_ledger(database_url, found["metadata"]["uid"]))
    elif "toolCalls" in status:
        entries = [_published(c) for c in status["toolCalls"]]
    elif status.get("phase") in Phase.TERMINAL:
        raise Failure(f"AgentRun {run} has no published ledger (status.toolCalls): the run "
                      "store could not be read when it settled, or an older operator settled "
                      f"it. Set {ENV_DATABASE_URL} to read the store.")
    else:
        raise Failure(f"AgentRun {run} is {status.get('phase') or 'Pending'}: its ledger is "
                      "published on the run when it settles. To see the calls of a run still "
                      f"going, set {ENV_DATABASE_URL} to the run store.", code=ERROR)
    told = status.get("toolsExecuted")
    if status.get("phase") in Phase.TERMINAL:
        summary = "unknown" if told is None else ", ".join(told) or "none"
    else:
        summary = "not settled yet (the ledger below is what was called so far)"
    print(f"AgentRun {run}: {status.get('phase', 'Pending')}"
          + (f" ({status['reason']})" if status.get("reason") else "")
          + f", attempts {status.get('attempts', 0)}, toolsExecuted: {summary}")
    if not entries:
        print("  no tool call in the ledger")
        return OK
    omitted = status.get("toolCallsOmitted") if not database_url else None
    rows = [("ATTEMPT", "#", "TOOL", "EFFECT", "KEY", "CALLED AT", "ENDED")]
    for e in entries:
        rows.append((str(e.attempt), str(e.seq), e.tool, e.effect or "-",
                     (e.idempotency_key or "-")[:18], _stamp(e.started_at), _ended(e)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[6])
    if omitted:
        print(f"  ... and {omitted} more calls (the run store keeps them all)")
    return OK


def _published(call: dict[str, Any]) -> LedgerEntry:
    """A status.toolCalls entry, as the store's ledger row it was published from."""
    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

    return LedgerEntry(
        attempt=int(call["attempt"]), seq=int(call["seq"]), tool=call["tool"], call_id=None,
        args_digest="", started_at=when(call.get("calledAt")) or datetime.min,
        finished_at=when(call.get("endedAt")), outcome=call.get("outcome"),
        effect=call.get("effect"), idempotency_key=call.get("idempotencyKey"))


def _ended(entry: LedgerEntry) -> str:
    """How a call ended: it ran (and how), it was answered from the journal (it ran in an
    earlier attempt, and a resume did not run it again), or nobody knows (in doubt)."""
    if entry.outcome == LedgerOutcome.JOURNAL:
        return "answered from the journal (not run again)"
    if entry.outcome == LedgerOutcome.DENIED:
        return "denied by its approver (never run)"
    if entry.finished_at is None:
        return "no (called, never answered): in doubt"
    return f"ran: {entry.outcome or 'ok'} at {_stamp(entry.finished_at)}"


async def _ledger(url: str, uid: str) -> list[LedgerEntry]:
    from agentrun import store

    engine = store.make_engine(url, pool_size=1, max_overflow=0)
    try:
        return await store.ledger(engine, uid)
    finally:
        await engine.dispose()


def _check_store(url: str) -> None:
    """Reading the store itself needs its database layer: agentrun[kubectl,store]."""
    try:
        from sqlalchemy.engine import make_url
    except ModuleNotFoundError as e:
        raise Failure(f"{ENV_DATABASE_URL} reads the run store, which needs the store's "
                      f"database layer ({e.name} is not installed): pip install "
                      "'agentrun[kubectl,store]', or unset it to read status.toolCalls "
                      "from the API server") from e
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise Failure(f"no run store at {parsed.database}: set {ENV_DATABASE_URL} to the "
                      "operator's store (postgresql+psycopg://... or sqlite:///path)")


def _stamp(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value else "-"


# -- result and transcript --------------------------------------------------------------------


def result(cluster: Cluster, run: str, output: str | None) -> int:
    """The run's whole answer (status.result has its first 4,096 bytes); with -o json, the
    object of its output schema."""
    found = cluster.transcript(run)
    answer = found.get("result")
    phase = (found.get("run") or {}).get("phase") or Phase.PENDING
    if not answer:
        raise Failure(f"AgentRun {run} has no answer{'' if phase in Phase.TERMINAL else ' yet'}"
                      f" ({phase})", REFUSED)
    if output == "json":
        if "json" not in answer:
            raise Failure(f"AgentRun {run}'s answer is not an object of an output schema (its "
                          "agent declares none, or the answer did not parse); without -o json "
                          "it is printed as text", REFUSED)
        print(json.dumps(answer["json"], indent=2, ensure_ascii=False))
        return OK
    print(answer["text"])
    return OK


def _by_uid(uid: str | None) -> list[tuple[str, str]]:
    return [("fieldSelector", f"metadata.uid={uid}")] if uid else []


def history(cluster: Cluster, *, everywhere: bool, since: str | None, phase: str | None,
            selector: str | None) -> int:
    """The runs the store has recorded, newest first, whether their AgentRuns are still in
    the API server or not (runs.store.agentrun.dev)."""
    query = [(k, v) for k, v in (("since", since), ("labelSelector", selector),
                                 ("fieldSelector", phase and f"status.phase={phase}")) if v]
    rows = [(["NAMESPACE"] if everywhere else []) + ["NAME", "UID", "PHASE", "REASON",
                                                     "TOOLS EXECUTED", "CREATED"]]
    for r in cluster.records(query, everywhere=everywhere):
        meta, status = r["metadata"], r["status"]
        tools = status.get("toolsExecuted")
        rows.append(([meta["namespace"]] if everywhere else []) + [
            meta["name"], meta["uid"], status.get("phase") or "", status.get("reason") or "",
            "<unknown>" if tools is None else ",".join(tools) or "<none>",
            meta.get("creationTimestamp") or ""])
    if len(rows) == 1:
        where = "any namespace" if everywhere else f"namespace {cluster.namespace}"
        print(f"No recorded runs in {where}.", file=sys.stderr)
        return OK
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return OK


def transcript(cluster: Cluster, run: str, *, follow: bool, uid: str | None = None) -> int:
    """The run's conversation, readable; with `follow`, as it goes, until it settles. With
    `uid`, that run of the name (the name may have been used again since)."""
    if not follow:
        found = cluster.transcript(run, uid)
        print(headline(run, found))
        shown = Conversation()
        for entry in found.get("entries") or []:
            shown.add(entry)
        print(ending(found))
        return OK
    shown = Conversation()
    print(f"AgentRun {run}: following its transcript until it settles (Ctrl-C to stop)")
    while True:
        stream = cluster.follow(run, uid)
        try:
            for line in stream.response:
                if line.strip():
                    shown.add(json.loads(line))
        except (OSError, ValueError) as e:  # cut: the API server's timeout, or the network
            print(f"  (the stream was cut: {type(e).__name__}; following again)",
                  file=sys.stderr)
        finally:
            stream.response.release_conn()
        # A stream ends when its run settles, or after a while (the API server's request
        # timeout is the bound): which, the Transcript says.
        found = cluster.transcript(run, uid)
        for entry in found.get("entries") or []:
            shown.add(entry)
        if (found.get("run") or {}).get("phase") in Phase.TERMINAL:
            print(ending(found))
            return OK


def headline(run: str, found: dict[str, Any]) -> str:
    said = found.get("run") or {}
    usage = found.get("usage") or {}
    tokens = (usage.get("inputTokens") or 0) + (usage.get("outputTokens") or 0)
    return (f"AgentRun {run}: {said.get('phase') or Phase.PENDING}, "
            f"{_count(usage.get('modelCalls', 0), 'model call')}, "
            f"{_count(usage.get('toolCalls', 0), 'tool call')}, {_count(tokens, 'token')}")


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def ending(found: dict[str, Any]) -> str:
    said = found.get("run") or {}
    name, phase = said.get("name"), said.get("phase") or Phase.PENDING
    if phase not in Phase.TERMINAL:
        return f"{name} is {phase}: kubectl agentrun transcript {name} -f follows it"
    if found.get("result"):
        return f"{name} {phase}; its whole answer: kubectl agentrun result {name}"
    return f"{name} {phase}, with no answer"


class Conversation:
    """Prints entries as a conversation, each once (an entry sent again with a new state
    prints only what changed), with a line for each new attempt."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.attempt = 0

    def add(self, entry: dict[str, Any]) -> None:
        # What names an entry while it changes: a call's seq and state may come later
        # (its ledger row is written after the model's call reached the session).
        key = (entry.get("attempt"), entry.get("kind"), entry.get("time"),
               entry.get("author"), entry.get("tool"))
        before = self.seen.get(key)
        if before == entry:
            return
        self.seen[key] = entry
        if before is not None:
            if entry.get("state") != before.get("state"):
                print(f"           {mark(entry) or 'state: ' + str(entry.get('state'))}")
            return
        if entry.get("attempt") != self.attempt:
            self.attempt = int(entry.get("attempt") or 0)
            print(f"--- attempt {self.attempt} ---")
        print(said(entry))


def _json(value: Any) -> str:
    # Sorted: a store keeps an object's keys in its own order (Postgres JSONB sorts them).
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def mark(entry: dict[str, Any]) -> str:
    """What a call's state means, in words (none while it runs)."""
    state = entry.get("state")
    if state == EntryState.IN_DOUBT:
        return ("[IN DOUBT: called, its end never recorded; it may or may not have "
                "happened]")
    if state == EntryState.DENIED:
        return "[denied]"
    if state == EntryState.ANSWERED and entry.get("kind") == EntryKind.TOOL_RESULT:
        return "[answered from the journal: not run again]"
    return ""


def said(entry: dict[str, Any]) -> str:
    """One entry as a line of the conversation."""
    at = str(entry.get("time") or "")[11:19]
    who, kind, tool = entry.get("author") or "", entry.get("kind"), entry.get("tool")
    call = f" (call {entry['seq']})" if entry.get("seq") is not None else ""
    tail = f"  {mark(entry)}" if mark(entry) else ""
    if kind in (EntryKind.INPUT, EntryKind.TEXT):
        line = f"{who}: {entry.get('text', '')}"
    elif kind == EntryKind.TOOL_CALL:
        line = f"{who} calls {tool}{call} {_json(entry.get('args') or {})}"
    elif kind == EntryKind.TOOL_RESULT:
        line = f"{tool}{call} returned {_json(entry.get('result'))}"
    elif kind == EntryKind.APPROVAL and who == TRANSCRIPT_AUTHOR:
        until = (entry.get("result") or {}).get("expiresAt", "")
        line = f"{tool}{call} waits for an approval of {_json(entry.get('args'))} until {until}"
    elif kind == EntryKind.APPROVAL:
        decided = entry.get("result") or {}
        verb = "denied" if decided.get("decision") == ApprovalDecision.DENY else "approved"
        note = f": {decided['note']}" if decided.get("note") else ""
        line = f"{who} {verb} {tool}{call}{note}"
        tail = ""
    else:
        reason = (entry.get("result") or {}).get("reason")
        line = f"error{f' ({reason})' if reason else ''}: {entry.get('text', '')}"
    return f"  {at} {line}{tail}"


# -- why --------------------------------------------------------------------------------------


def why(cluster: Cluster, name: str) -> int:
    found = cluster.get(REPLAY_PLURAL, name)
    if found is None:
        raise Failure(f"AgentRunReplay {name} does not exist in namespace {cluster.namespace}")
    print_decision(found)
    phase = (found.get("status") or {}).get("phase")
    return REFUSED if phase == ReplayPhase.REFUSED else OK


# -- cancel ------------------------------------------------------------------------------------


def cancel(cluster: Cluster, run: str, note: str | None) -> int:
    """Cancels `run` in place: the annotation agentrun.dev/cancel (and the note beside it,
    agentrun.dev/cancel-note, which the operator puts in the run's message). The operator
    stops the run and keeps it, Cancelled (CancelRequested), with its tools counted."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    phase = (found.get("status") or {}).get("phase")
    if phase in Phase.TERMINAL:
        print(f"AgentRun {run} is already {phase}; nothing to cancel")
        return OK
    annotations = {ANNOTATION_CANCEL: "true"}
    if note:
        annotations[ANNOTATION_CANCEL_NOTE] = note
    cluster.annotate(RUN_PLURAL, run, annotations)
    print(f"agentrun/{run} annotated {ANNOTATION_CANCEL}=true"
          + (f" ({ANNOTATION_CANCEL_NOTE}: {note})" if note else "")
          + "; the operator stops it and keeps it (Cancelled)")
    return OK


# -- schedule ----------------------------------------------------------------------------------


def trigger(cluster: Cluster, name: str) -> int:
    """A run of schedule `name` now: named like a slot (`<schedule>-<now, Unix seconds>`),
    with the schedule's labels and ownerReference, as its creator (admission checks what
    its template uses, as for any run). Refused while a run of the schedule is live unless
    its concurrencyPolicy is Allow: a trigger is never the way round Forbid."""
    schedule = cluster.get(SCHEDULE_PLURAL, name)
    if schedule is None:
        raise Failure(f"AgentRunSchedule {name} does not exist in namespace {cluster.namespace}")
    policy = (schedule.get("spec") or {}).get("concurrencyPolicy") or ConcurrencyPolicy.FORBID
    live = sorted(r["metadata"]["name"] for r in cluster.list_runs(f"{LABEL_SCHEDULE}={name}")
                  if belongs_to(schedule, r)
                  and (r.get("status") or {}).get("phase") not in Phase.TERMINAL)
    if live and policy != ConcurrencyPolicy.ALLOW:
        raise Failure(f"AgentRunSchedule {name} has a live run ({', '.join(live)}) and its "
                      f"concurrencyPolicy is {policy}: wait for it to settle, or cancel it "
                      f"(kubectl agentrun cancel {live[0]})", REFUSED)
    created = cluster.create_run(scheduled_run(schedule, int(time.time())))
    if created is None:
        raise Failure(f"a run of AgentRunSchedule {name} for this second exists already; "
                      "try again in a second")
    print(f"agentrun/{created['metadata']['name']} created (AgentRunSchedule {name}, now)")
    return OK


# -- command line -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl agentrun",
        description="Replay AgentRuns safely, and see what they did.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    common.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: "
                        "KUBECONFIG or ~/.kube/config)")
    common.add_argument("--context", default=None, help="kubeconfig context")
    common.add_argument("--as", dest="as_user", default=None,
                        help="act as this user (impersonation, as kubectl --as)")
    common.add_argument("--as-group", dest="as_group", default=None,
                        help="with --as: the group to act in")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", parents=[common],
                       help="ask to run an AgentRun again; prints the operator's decision")
    r.add_argument("run", help="the AgentRun to replay")
    r.add_argument("--force", action="store_true",
                   help=f"set {ANNOTATION_FORCE_REPLAY}=true (needs verb 'force' on "
                        "agentrunreplays: ClusterRole agentrun-replay-forcer)")
    r.add_argument("--note", help="why (spec.note)")
    r.add_argument("--name", help="the AgentRunReplay's name (default: generated); "
                   "with --force, an existing Refused replay of RUN is annotated")
    r.add_argument("--timeout", type=float, default=60, help="seconds to wait for a decision")
    m = sub.add_parser("resume", parents=[common],
                       help="ask to resume a failed AgentRun from its journal (tool calls that "
                            "finished are not run again); prints the operator's decision")
    m.add_argument("run", help="the AgentRun to resume")
    m.add_argument("--force", action="store_true",
                   help=f"set {ANNOTATION_FORCE_REPLAY}=true: in-doubt calls run again")
    m.add_argument("--note", help="why (spec.note)")
    m.add_argument("--name", help="the AgentRunReplay's name (default: generated)")
    m.add_argument("--timeout", type=float, default=60, help="seconds to wait for a decision")
    t = sub.add_parser("tools", parents=[common],
                       help="the tool-call ledger of each attempt of an AgentRun: effect, "
                            "key, how each call ended")
    t.add_argument("run")
    t.add_argument("--database-url", default=os.environ.get(ENV_DATABASE_URL) or None,
                   help=f"read the run store itself (env {ENV_DATABASE_URL}; default: the "
                        "ledger published on the settled run, no credential needed)")
    w = sub.add_parser("why", parents=[common], help="a replay's decision and its message")
    w.add_argument("replay")
    a = sub.add_parser("approve", parents=[common],
                       help="approve (or --deny) the tool call an AgentRun waits for, as "
                            "yourself (needs ClusterRole agentrun-approver)")
    a.add_argument("run", help="the AgentRun that waits")
    a.add_argument("--deny", action="store_true", help="deny the call: it never runs, and "
                   "the model is told so")
    a.add_argument("--note", help="why (a denial's note is what the model is told)")
    a.add_argument("--timeout", type=float, default=60, help="seconds to wait for the verdict")
    c = sub.add_parser("cancel", parents=[common],
                       help="stop a run and keep it (Cancelled, CancelRequested): annotates it "
                            f"{ANNOTATION_CANCEL}=true")
    c.add_argument("run")
    c.add_argument("--note", help=f"why ({ANNOTATION_CANCEL_NOTE}; the operator puts it in "
                                  "the run's message)")
    s = sub.add_parser("schedule", help="AgentRunSchedules")
    schedule_commands = s.add_subparsers(dest="schedule_command", required=True)
    g = schedule_commands.add_parser(
        "trigger", parents=[common],
        help="start a run of the schedule now (named like a slot, with its labels and owner)")
    g.add_argument("schedule")
    o = sub.add_parser("result", parents=[common],
                       help="the whole answer of an AgentRun (its Transcript's result)")
    o.add_argument("run")
    o.add_argument("-o", "--output", choices=["json"],
                   help="json: the object of the agent's output schema")
    t = sub.add_parser("transcript", parents=[common],
                       help="the conversation of an AgentRun: input, the model's text, tool "
                            "calls with arguments and results, in-doubt calls, approvals")
    t.add_argument("run")
    t.add_argument("-f", "--follow", action="store_true",
                   help="follow a live run until it settles")
    t.add_argument("--uid", help="this run of the name (kubectl agentrun history lists "
                                 "them), when the name was used again since")
    h = sub.add_parser("history", parents=[common],
                       help="the runs the store has recorded, newest first, their AgentRuns "
                            "in the API server or deleted after their time to live")
    h.add_argument("-A", "--all-namespaces", action="store_true",
                   help="every namespace (needs list on runs.store.agentrun.dev "
                        "cluster-wide)")
    h.add_argument("--since", help="only runs created since: a duration (24h, 30m, 7d) or "
                                   "a time (RFC 3339)")
    h.add_argument("--phase", choices=sorted(Phase.TERMINAL | {Phase.PENDING, Phase.RUNNING}),
                   help="only runs in this phase")
    h.add_argument("-l", "--selector", help="label selector (the labels runs had at launch)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cluster = Cluster(args.kubeconfig, args.context, args.namespace, args.as_user,
                          args.as_group)
        if args.command in ("replay", "resume"):
            return replay(cluster, args.run, force=args.force, note=args.note, name=args.name,
                          timeout=args.timeout, resume=args.command == "resume")
        if args.command == "tools":
            return tools(cluster, args.run, args.database_url)
        if args.command == "approve":
            return approve(cluster, args.run, deny=args.deny, note=args.note,
                           timeout=args.timeout)
        if args.command == "cancel":
            return cancel(cluster, args.run, args.note)
        if args.command == "schedule":
            return trigger(cluster, args.schedule)
        if args.command == "result":
            return result(cluster, args.run, args.output)
        if args.command == "transcript":
            return transcript(cluster, args.run, follow=args.follow, uid=args.uid)
        if args.command == "history":
            return history(cluster, everywhere=args.all_namespaces, since=args.since,
                           phase=args.phase, selector=args.selector)
        return why(cluster, args.replay)
    except Failure as e:
        print(str(e), file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
