"""`agentrun-store-api`: the store API on its own (the chart's Deployment `agentrun-store`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
import sys

from kubernetes import client

from agentrun import logs, store
from agentrun.vocabulary import STORE_AUDIENCE
from agentrun_store_api import metrics
from agentrun_store_api.app import serve
from agentrun_store_api.limits import POOL_OVERFLOW, POOL_SIZE
from agentrun_store_api.tls import ServingCertificate
from agentrun_store_api.transcripts import TRANSCRIPT_POOL_SIZE, serve_transcripts


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="agentrun-store-api",
        description="Serves the run store to runner pods, authenticated by their projected "
                    "ServiceAccount tokens.")
    p.add_argument("--listen", default=os.environ.get("AGENTRUN_STORE_API_LISTEN",
                                                      "0.0.0.0:8080"))
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""),
                   help="SQLAlchemy URL of the run store (env DATABASE_URL)")
    p.add_argument("--audience", default=os.environ.get("AGENTRUN_STORE_AUDIENCE",
                                                        STORE_AUDIENCE))
    p.add_argument("--namespace", action="append", dest="namespaces",
                   default=[n for n in os.environ.get("AGENTRUN_NAMESPACES", "").split(",")
                            if n],
                   help="serve runner pods of this namespace only (repeatable; default all)")
    p.add_argument("--tls-cert-file",
                   default=os.environ.get("AGENTRUN_STORE_API_TLS_CERT_FILE", ""),
                   help="the serving certificate (PEM); the store API speaks TLS only")
    p.add_argument("--tls-private-key-file",
                   default=os.environ.get("AGENTRUN_STORE_API_TLS_KEY_FILE", ""),
                   help="its private key (PEM)")
    p.add_argument("--transcript-listen",
                   default=os.environ.get("AGENTRUN_TRANSCRIPT_LISTEN", ""),
                   help="also serve the transcript API (store.agentrun.dev, an aggregated API "
                        "the Kubernetes API server proxies to) on HOST:PORT, with the same "
                        "certificate (empty: not served)")
    p.add_argument("--model-prices", default=os.environ.get("AGENTRUN_MODEL_PRICES", ""),
                   help="the chart's modelPrices (JSON): their models are metric labels, "
                        "like the price map's")
    p.add_argument("--metrics-port", type=int,
                   default=int(os.environ.get("AGENTRUN_METRICS_PORT", "0")))
    p.add_argument("--log-format", choices=logs.FORMATS,
                   default=os.environ.get("AGENTRUN_LOG_FORMAT", "text"),
                   help="text (key=value) or json (one object per line)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logs.configure(args.log_format)
    if not store.is_durable(args.database_url):
        print("agentrun-store-api: set --database-url (or DATABASE_URL) to the run store",
              file=sys.stderr)
        return 2
    if not args.tls_cert_file or not args.tls_private_key_file:
        print("agentrun-store-api: set --tls-cert-file and --tls-private-key-file: runners "
              "send their tokens and sessions to the store API, which speaks TLS only (the "
              "chart issues the certificate)", file=sys.stderr)
        return 2
    try:
        tls = ServingCertificate(args.tls_cert_file, args.tls_private_key_file)
    except (OSError, ssl.SSLError) as e:
        print(f"agentrun-store-api: the serving certificate {args.tls_cert_file} (key "
              f"{args.tls_private_key_file}) cannot be loaded: {e}", file=sys.stderr)
        return 2
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    try:
        metrics.price_models(metrics.price_models_of(args.model_prices))
    except ValueError as e:
        print(f"agentrun-store-api: --model-prices is not JSON: {e}", file=sys.stderr)
        return 2
    metrics.serve(args.metrics_port)

    async def run() -> None:
        engine = store.make_engine(args.database_url, pool_size=POOL_SIZE,
                                   max_overflow=POOL_OVERFLOW)
        # The operator migrates; the store API serves only a store at the schema it knows.
        served = await serve(args.listen, engine, client.ApiClient(), tls=tls,
                             audience=args.audience, namespaces=tuple(args.namespaces),
                             check_schema=True)
        # Users' reads have a pool of their own: a crowd following transcripts never
        # holds a connection a runner's ledger write waits for.
        readers = store.make_engine(args.database_url, pool_size=TRANSCRIPT_POOL_SIZE,
                                    max_overflow=0)
        transcripts = await serve_transcripts(
            args.transcript_listen, readers, client.ApiClient(),
            tls=ServingCertificate(args.tls_cert_file, args.tls_private_key_file)) \
            if args.transcript_listen else None
        try:
            await asyncio.Event().wait()
        finally:
            if transcripts is not None:
                await transcripts.stop()
            await served.stop()
            await engine.dispose()
            await readers.dispose()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
