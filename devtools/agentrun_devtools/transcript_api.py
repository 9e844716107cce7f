"""The transcript API registered on the development cluster and in tests, as the chart
registers it in a cluster: an APIService v1alpha1.store.agentrun.dev naming the Service
agentrun-store in agentrun-system, port 443 (`transcripts`), with the store API's CA.

Here the transcript API is served by `agentrun-store-api` as a process on this host, not a
pod: the Service has no selector and an EndpointSlice written here names the host's own
address (an EndpointSlice may not name a loopback one), where the store API is told to
listen (--transcript-listen). The API server runs with
--enable-aggregator-routing=true and dials that endpoint itself (there is no kube-proxy).
Its serving certificate is the control plane's store API pair, which carries the host's
address and the Service's names (ControlPlane.store_api_tls).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrun.vocabulary import TRANSCRIPT_API_SERVICE, TRANSCRIPT_GROUP, TRANSCRIPT_VERSION

if TYPE_CHECKING:
    from agentrun_devtools.controlplane import ControlPlane

# The chart's names: a development cluster reads like an installed one.
NAMESPACE = "agentrun-system"
SERVICE = "agentrun-store"
PORT_NAME = "transcripts"
SERVICE_NAMES = (SERVICE, f"{SERVICE}.{NAMESPACE}", f"{SERVICE}.{NAMESPACE}.svc",
                 f"{SERVICE}.{NAMESPACE}.svc.cluster.local")


def host_address() -> str:
    """This host's own non-loopback IPv4 address ("" when it has none): the one its
    default route leaves from (a UDP socket's connect sends nothing), else any its name
    resolves to."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed as any address, never sent to
            found = str(s.getsockname()[0])
        if not found.startswith("127.") and found != "0.0.0.0":
            return found
    except OSError:
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = str(info[4][0])
            if not address.startswith("127."):
                return address
    except OSError:
        pass
    return ""


@dataclass(frozen=True)
class TranscriptEndpoint:
    """Where the API server reaches the transcript API: this host's address and a port."""

    address: str
    port: int

    @property
    def listen(self) -> str:
        """The store API's --transcript-listen."""
        return f"{self.address}:{self.port}"


def host_service(namespace: str, service: str, port_name: str, address: str, port: int,
                 labels: dict[str, str]) -> list[dict[str, Any]]:
    """The Namespace, a Service without selector (port 443) and the EndpointSlice that
    sends it to `address:port` on this host: how the API server, which dials a Service's
    endpoints itself here, reaches a server that runs as a process of this host."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": service, "namespace": namespace, "labels": labels},
         "spec": {"ports": [{"name": port_name, "port": 443, "targetPort": port,
                             "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{service}-host", "namespace": namespace,
                      "labels": {**labels, "kubernetes.io/service-name": service,
                                 "endpointslice.kubernetes.io/managed-by":
                                     "agentrun-devtools"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
         "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]},
    ]


def manifests(endpoint: TranscriptEndpoint, ca_pem: str) -> list[dict[str, Any]]:
    """The Namespace, Service, EndpointSlice and APIService of the transcript API."""
    import base64

    labels = {"app.kubernetes.io/name": "agentrun", "app.kubernetes.io/component": "store-api"}
    return [
        *host_service(NAMESPACE, SERVICE, PORT_NAME, endpoint.address, endpoint.port, labels),
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": TRANSCRIPT_API_SERVICE, "labels": labels},
         "spec": {"group": TRANSCRIPT_GROUP, "version": TRANSCRIPT_VERSION,
                  "groupPriorityMinimum": 1000, "versionPriority": 15,
                  "service": {"name": SERVICE, "namespace": NAMESPACE, "port": 443},
                  "caBundle": base64.b64encode(ca_pem.encode()).decode()}},
    ]


def register(plane: ControlPlane, endpoint: TranscriptEndpoint) -> None:
    """Registers the transcript API at `endpoint` (idempotent), with the control plane's
    store API CA."""
    if not endpoint.address:
        raise RuntimeError("this host has no non-loopback IPv4 address: the API server "
                           "cannot be pointed at the transcript API (an EndpointSlice may "
                           "not name a loopback address)")
    tls = plane.store_api_tls
    assert tls is not None, "the control plane has not been started"
    body = {"apiVersion": "v1", "kind": "List",
            "items": manifests(endpoint, tls.ca.read_text())}
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                  input=json.dumps(body))


def unregister(plane: ControlPlane) -> None:
    """Removes the APIService (first: discovery stops asking for it) and its Service."""
    plane.kubectl("delete", "apiservice", TRANSCRIPT_API_SERVICE, "--ignore-not-found",
                  check=False)
    plane.kubectl("delete", "service", SERVICE, "-n", NAMESPACE, "--ignore-not-found",
                  check=False)
    plane.kubectl("delete", "endpointslice", f"{SERVICE}-host", "-n", NAMESPACE,
                  "--ignore-not-found", check=False)


def wait_available(plane: ControlPlane, timeout: float = 60) -> None:
    """Until the API server's aggregator says the APIService is Available (it reached the
    transcript API's discovery through the front proxy)."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        done = plane.kubectl("get", "apiservice", TRANSCRIPT_API_SERVICE, "-o", "json",
                             check=False)
        if done.returncode == 0:
            conditions = json.loads(done.stdout).get("status", {}).get("conditions") or []
            available: dict[str, Any] = next(
                (c for c in conditions if c.get("type") == "Available"), {})
            if available.get("status") == "True":
                return
            said = f"{available.get('reason')}: {available.get('message')}"
        time.sleep(0.25)
    raise TimeoutError(f"APIService {TRANSCRIPT_API_SERVICE} not Available after "
                       f"{timeout:.0f}s ({said})")
