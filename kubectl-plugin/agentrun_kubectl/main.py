"""The command line of `kubectl agentrun`: one subcommand a module of this package."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    ANNOTATION_FORCE_REPLAY,
    ENV_DATABASE_URL,
    Phase,
)
from agentrun_kubectl.approve import approve
from agentrun_kubectl.cancel import cancel
from agentrun_kubectl.cluster import OK, Cluster, Failure
from agentrun_kubectl.replay import replay, why
from agentrun_kubectl.schedule import trigger
from agentrun_kubectl.tools import tools
from agentrun_kubectl.transcript import history, result, transcript


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl agentrun",
        description="Replay AgentRuns safely, and see what they did.")
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: "
                            "KUBECONFIG or ~/.kube/config)")
    connection.add_argument("--context", default=None, help="kubeconfig context")
    connection.add_argument("--as", dest="as_user", default=None,
                            help="act as this user (impersonation, as kubectl --as)")
    connection.add_argument("--as-group", dest="as_group", default=None,
                            help="with --as: the group to act in")
    common = argparse.ArgumentParser(add_help=False, parents=[connection])
    common.add_argument("-n", "--namespace", help="namespace (default: the context's)")
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
    k = sub.add_parser("console", parents=[connection],
                       help="a web console on 127.0.0.1: runs, transcripts, the approval "
                            "inbox, schedules, triggers, cost; every request as you")
    k.add_argument("--port", type=int, default=8089, help="the local port (default 8089)")
    k.add_argument("-n", "--namespace", action="append", default=[],
                   help="a namespace to show besides those you may list (repeatable; "
                        "default: the context's)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "console":
            return console(args)
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


def console(args: argparse.Namespace) -> int:
    """Serves the console until Ctrl-C. Its modules (and aiohttp) load only here."""
    from agentrun_kubectl.console.server import Console, serve

    cluster = Cluster(args.kubeconfig, args.context, None, args.as_user, args.as_group)
    page = Console(cluster, sorted({*args.namespace, cluster.namespace}), args.port)

    def ready(url: str) -> None:
        print(f"agentrun console as {args.as_user or 'your kubeconfig user'}, on "
              f"127.0.0.1 only (Ctrl-C stops it). Open:\n  {url}", flush=True)

    try:
        asyncio.run(serve(page, ready=ready))
    except KeyboardInterrupt:
        return OK
    except OSError as e:
        raise Failure(f"cannot serve the console on 127.0.0.1:{args.port}: {e.strerror or e}; "
                      "another --port?") from e
    return OK


if __name__ == "__main__":
    sys.exit(main())
