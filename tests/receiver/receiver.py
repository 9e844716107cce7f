"""The trigger receiver as the tests run it: `agentrun-receiver` in its own process, against
the session's control plane, as the identity it has in a cluster (the user
agentrun-receiver in the group agentrun:receivers, which the admission policies exempt as
they exempt the receiver's ServiceAccount), with the rights the chart gives it and nothing
more (the chart's ClusterRole agentrun-receiver, rendered by Helm, bound to that group),
and its own serving certificate.

`Outage` is a TCP relay between a receiver and the API server: stopping it is, to that
receiver, the API server gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import threading
from pathlib import Path

import yaml
from agentrun_devtools.certs import PKI
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for

from agentrun.vocabulary import RECEIVER_GROUP, RECEIVER_PATH
from tests.chart.helm import ARGS, CHART, helm

USER = "agentrun-receiver"


def grant_the_charts_rights(plane: ControlPlane) -> None:
    """The chart's ClusterRole agentrun-receiver, as rendered, bound to RECEIVER_GROUP."""
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                "--show-only", "templates/receiver.yaml")
    assert done.returncode == 0, done.stderr
    [role] = [d for d in yaml.safe_load_all(done.stdout)
              if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == USER]
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "agentrun-receiver-tests"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": USER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                             "name": RECEIVER_GROUP}]}
    plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                        "items": [role, binding]}))


class Receiver:
    """`agentrun-receiver` as a child process."""

    def __init__(self, plane: ControlPlane, work: Path, *, server: str | None = None,
                 port: int | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        kubeconfig = plane.issue_kubeconfig(f"receiver-{free_port()}", USER,
                                            (RECEIVER_GROUP,))
        if server is not None:  # through a relay
            config = json.loads(kubeconfig.read_text())
            config["clusters"][0]["cluster"]["server"] = server
            kubeconfig.write_text(json.dumps(config))
        self.kubeconfig = kubeconfig
        pki = PKI(work / "tls", name="agentrun-receiver-ca")
        self.cert, self.key = pki.issue("tls", USER, server=True, hosts=("127.0.0.1",))
        self.ca = pki.ca_cert
        self.port = port or free_port()
        self.metrics_port = free_port()
        self.child: Child | None = None

    def start(self) -> Receiver:
        self.child = Child(
            "receiver",
            [str(Path(sys.executable).parent / "agentrun-receiver"),
             f"--listen=127.0.0.1:{self.port}", f"--tls-cert-file={self.cert}",
             f"--tls-private-key-file={self.key}", f"--metrics-port={self.metrics_port}"],
            self.work / "receiver.log", env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})

        def started() -> bool:
            assert self.child is not None
            if not self.child.alive():
                raise ProcessDied(f"the receiver exited:\n{self.child.log_tail()}")
            return "event=started" in self.child.log_path.read_text(errors="replace")

        wait_for(started, timeout=60, what="receiver")
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None

    def url(self, namespace: str, trigger: str) -> str:
        return f"https://127.0.0.1:{self.port}{RECEIVER_PATH}/{namespace}/{trigger}"

    def events(self, namespace: str, trigger: str) -> dict[str, float]:
        """agentrun_trigger_events_total of one trigger, by result, as Prometheus scrapes it."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as response:
            text = response.read().decode()
        counts: dict[str, float] = {}
        for labels, value in re.findall(r"^agentrun_trigger_events_total\{([^}]*)\} (\S+)$",
                                        text, re.M):
            found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if (found["namespace"], found["trigger"]) == (namespace, trigger):
                counts[found["result"]] = float(value)
        return counts

    def log(self) -> str:
        return (self.work / "receiver.log").read_text(errors="replace")


class Outage:
    """A TCP relay to `target` (https://HOST:PORT): while stopped, nothing listens on its
    port, and connections it relayed are cut."""

    def __init__(self, target: str) -> None:
        host, port = re.fullmatch(r"https://([^:/]+):(\d+)", target).groups()  # type: ignore[union-attr]
        self.target = (host, int(port))
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}

    def _do(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def up(self) -> None:
        async def go() -> None:
            self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

        self._do(go())

    def down(self) -> None:
        async def go() -> None:
            if self.server is not None:
                self.server.close()
            for writer in list(self.writers):
                writer.close()
            self.writers.clear()
            if self.server is not None:
                await self.server.wait_closed()
                self.server = None

        self._do(go())

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
