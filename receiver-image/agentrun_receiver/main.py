"""`agentrun-receiver`: the trigger receiver on its own (the chart's Deployment
`agentrun-receiver`; `make run` starts it beside the operator)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from agentrun import logs
from agentrun.tls import ServingCertificate
from agentrun_receiver import metrics
from agentrun_receiver.app import Receiver, make_app
from agentrun_receiver.counters import Counters
from agentrun_receiver.kube import Kube

log = logging.getLogger("agentrun.receiver")
# Threads for the (synchronous) Kubernetes client: each delivery makes a few calls.
API_THREADS = 32


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="agentrun-receiver",
        description="Starts an AgentRunTrigger's run for each event delivered to "
                    "/v1/triggers/<namespace>/<name>, once per event identity.")
    p.add_argument("--listen", default=os.environ.get("AGENTRUN_RECEIVER_LISTEN",
                                                      "0.0.0.0:8443"), help="HOST:PORT")
    p.add_argument("--tls-cert-file",
                   default=os.environ.get("AGENTRUN_RECEIVER_TLS_CERT_FILE", ""),
                   help="the serving certificate (PEM); the receiver speaks TLS only")
    p.add_argument("--tls-private-key-file",
                   default=os.environ.get("AGENTRUN_RECEIVER_TLS_KEY_FILE", ""),
                   help="its private key (PEM)")
    p.add_argument("--metrics-port", type=int,
                   default=int(os.environ.get("AGENTRUN_METRICS_PORT", "0")))
    p.add_argument("--log-format", choices=logs.FORMATS,
                   default=os.environ.get("AGENTRUN_LOG_FORMAT", "text"),
                   help="text (key=value) or json (one object per line)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logs.configure(args.log_format)
    if not args.tls_cert_file or not args.tls_private_key_file:
        print("agentrun-receiver: set --tls-cert-file and --tls-private-key-file: senders "
              "deliver signed events and tokens, which travel over TLS only (the chart "
              "issues the certificate; make dev-cluster writes .local/receiver/)",
              file=sys.stderr)
        return 2
    try:
        tls = ServingCertificate(args.tls_cert_file, args.tls_private_key_file)
    except (OSError, ssl.SSLError) as e:
        print(f"agentrun-receiver: the serving certificate {args.tls_cert_file} (key "
              f"{args.tls_private_key_file}) cannot be loaded: {e}", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        print(f"agentrun-receiver: --listen {args.listen} is not HOST:PORT", file=sys.stderr)
        return 2
    from kubernetes import client
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # One retry of a dropped connection, no more: a receiver that cannot reach the API
    # server answers 503 at once, and the sender delivers again.
    configuration.retries = 1
    configuration.connection_pool_maxsize = API_THREADS
    metrics.serve(args.metrics_port)

    async def run() -> None:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(API_THREADS, "kube"))
        kube = Kube(client.ApiClient(configuration))
        counters = Counters(kube)
        runner = web.AppRunner(make_app(Receiver(kube, counters)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host or "0.0.0.0", int(port), ssl_context=tls.context)
        await site.start()
        follow = asyncio.create_task(tls.follow())
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        log.info("event=started listen=%s url=https://%s:%s", args.listen, host or "0.0.0.0",
                 port)
        try:
            await stop.wait()
        finally:
            follow.cancel()
            await runner.cleanup()
            await counters.flush()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
