"""Who a request to the transcript API is from: the Kubernetes API server's front proxy says.

The transcript API is an aggregated API: users never reach it directly. The API server
authenticates them, then proxies their request here with a client certificate of its own
(its --proxy-client-cert-file) and their identity in request headers. What to trust is
what the API server publishes in the ConfigMap kube-system/extension-apiserver-authentication
(read with the Role extension-apiserver-authentication-reader): the CA of those client
certificates, the names they may carry, and which headers hold the user, uid, groups and
extra. It is read at start and again every REFRESH_SECONDS, so that a rotated front-proxy CA
is followed without a restart.

Any request without such a certificate is refused: a header saying "I am alice" is worth
nothing unless the API server's proxy sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

log = logging.getLogger("agentrun.store_api")

AUTHENTICATION_NAMESPACE = "kube-system"
AUTHENTICATION_CONFIG_MAP = "extension-apiserver-authentication"
# How often the published front-proxy trust is read again.
REFRESH_SECONDS = 30.0
# The group every authenticated user is in (the API server's own authenticators add it;
# the aggregator's own discovery requests come without it).
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"


class NotAuthenticated(Exception):
    """A request the front proxy did not vouch for: one sentence, for a 401 Status."""


@dataclass(frozen=True)
class FrontProxyTrust:
    """What the API server publishes about its front proxy (the requestheader-* keys)."""

    client_cas: tuple[x509.Certificate, ...]
    ca_pem: str
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ()
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()

    @classmethod
    def published(cls, data: Mapping[str, str]) -> FrontProxyTrust | None:
        """The trust of a ConfigMap's data; None when it names no front proxy (the API
        server runs without --requestheader-client-ca-file)."""
        pem = data.get("requestheader-client-ca-file") or ""
        if "-----BEGIN CERTIFICATE-----" not in pem:
            return None

        def names(key: str) -> tuple[str, ...]:
            raw = data.get(key)
            listed = json.loads(raw) if raw else []
            return tuple(str(n) for n in listed if n)

        return cls(client_cas=tuple(x509.load_pem_x509_certificates(pem.encode())),
                   ca_pem=pem, allowed_names=names("requestheader-allowed-names"),
                   username_headers=names("requestheader-username-headers"),
                   uid_headers=names("requestheader-uid-headers"),
                   group_headers=names("requestheader-group-headers"),
                   extra_prefixes=names("requestheader-extra-headers-prefix"))


@dataclass(frozen=True)
class User:
    """A user as the API server authenticated them."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def proxy_refusal(leaf: x509.Certificate | None, trust: FrontProxyTrust,
                  now: datetime.datetime) -> str:
    """Why a client certificate is not the API server's front proxy, or "" when it is.

    | the certificate | verdict |
    | --- | --- |
    | none | refused: only the API server's front proxy may call |
    | not issued by a published front-proxy CA | refused |
    | outside its validity | refused |
    | not for client authentication | refused |
    | its common name not among the allowed names (when names are published) | refused |
    | otherwise | the front proxy |
    """
    if leaf is None:
        return ("no client certificate: the transcript API is reached through the "
                "Kubernetes API server (kubectl get transcripts.store.agentrun.dev ...), "
                "which presents its front-proxy certificate")
    if not any(_issued_by(leaf, ca) for ca in trust.client_cas):
        return (f"the client certificate of {_common_name(leaf) or 'the caller'} is not "
                "issued by the API server's front-proxy CA (requestheader-client-ca-file)")
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        return "the front-proxy client certificate is not valid now"
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    if usages is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        return "the front-proxy certificate is not for client authentication"
    name = _common_name(leaf)
    if trust.allowed_names and name not in trust.allowed_names:
        return (f"the client certificate's name {name!r} is not among the front proxy's "
                f"allowed names ({', '.join(trust.allowed_names)})")
    return ""


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    # The handshake checked the chain to some CA the context trusts; a CA dropped from the
    # ConfigMap stays in that context until a restart, so the issuer is checked here
    # against the CAs published now. (The API server's front-proxy certificates are
    # issued by the front-proxy CA itself.)
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _common_name(cert: x509.Certificate) -> str:
    found = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(found[0].value) if found else ""


def user_of(headers: CIMultiDictProxy[str] | CIMultiDict[str],
            trust: FrontProxyTrust) -> User | None:
    """The user the front proxy names in `headers` (case-insensitive, multi-valued), or
    None when it names none."""
    def first(names: Sequence[str]) -> str:
        for name in names:
            for value in headers.getall(name, ()):
                if value:
                    return str(value)
        return ""

    name = first(trust.username_headers)
    if not name:
        return None
    groups = [str(v) for h in trust.group_headers for v in headers.getall(h, ()) if v]
    extra: dict[str, list[str]] = {}
    for header, value in headers.items():
        for prefix in trust.extra_prefixes:
            if header.lower().startswith(prefix.lower()) and len(header) > len(prefix):
                key = unquote(header[len(prefix):]).lower()
                extra.setdefault(key, []).append(str(value))
    # As the API server's own authentication does: every authenticated user is in
    # system:authenticated (the aggregator's discovery requests carry no groups at all).
    if name != ANONYMOUS and AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return User(name=name, uid=first(trust.uid_headers), groups=tuple(groups),
                extra={k: tuple(v) for k, v in extra.items()})


class FrontProxy:
    """The API server's front proxy, as it publishes itself: verifies each request's client
    certificate and reads its user from the headers it names."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core: Any = client.CoreV1Api(api)
        self.trust: FrontProxyTrust | None = None
        self.why = "the front-proxy trust (kube-system/extension-apiserver-authentication) " \
                   "has not been read yet"
        self._contexts: list[ssl.SSLContext] = []
        self._loaded: set[str] = set()

    def serve_on(self, context: ssl.SSLContext) -> None:
        """Asks clients of `context` for a certificate, trusting the front-proxy CA (and
        the CAs published later)."""
        # The handshake proves the client holds the key of a certificate some trusted CA
        # issued (the context may trust the system's roots too); whose certificate it is,
        # proxy_refusal decides on every request. Optional, so that a caller without one
        # is told why in a Status instead of a failed handshake.
        context.verify_mode = ssl.CERT_OPTIONAL
        self._contexts.append(context)
        self._trust_cas()

    async def refresh(self) -> None:
        """Reads the published trust again; keeps the last one when it cannot be read."""
        try:
            found = await asyncio.to_thread(
                self._core.read_namespaced_config_map, AUTHENTICATION_CONFIG_MAP,
                AUTHENTICATION_NAMESPACE, _preload_content=False)
        except ApiException as e:
            self.why = (f"the store API cannot read {AUTHENTICATION_NAMESPACE}/"
                        f"{AUTHENTICATION_CONFIG_MAP} ({e.status} {e.reason}): it needs the "
                        "Role extension-apiserver-authentication-reader there")
            log.warning("event=front-proxy-trust-unreadable status=%s", e.status)
            return
        except Exception as e:  # the API server unreachable: the trust read last holds
            if self.trust is None:
                self.why = "the store API could not reach the Kubernetes API server to read " \
                           "the front-proxy trust yet"
            log.warning("event=front-proxy-trust-unreadable error=%r", e)
            return
        data = json.loads(found.data).get("data") or {}
        try:
            trust = FrontProxyTrust.published(data)
        except ValueError as e:
            self.why = f"the published front-proxy trust cannot be read: {e}"
            log.warning("event=front-proxy-trust-invalid error=%r", e)
            return
        if trust is None:
            self.why = ("the Kubernetes API server publishes no front proxy (it runs "
                        "without --requestheader-client-ca-file): aggregated APIs cannot "
                        "be served")
            log.warning("event=front-proxy-missing")
            return
        if trust != self.trust:
            log.info("event=front-proxy-trust names=%s cas=%d", ",".join(trust.allowed_names),
                     len(trust.client_cas))
        self.trust = trust
        self._trust_cas()

    def _trust_cas(self) -> None:
        if self.trust is None:
            return
        # An SSL context's trust only grows: a new CA is added, a dropped one stays trusted
        # by the handshake (and refused by proxy_refusal, which reads the CAs of now).
        for context in self._contexts:
            for ca in self.trust.client_cas:
                loaded = f"{id(context)}:{ca.fingerprint(hashes.SHA256()).hex()}"
                if loaded not in self._loaded:
                    context.load_verify_locations(cadata=ca.public_bytes(Encoding.PEM).decode())
                    self._loaded.add(loaded)

    async def follow(self, interval: float = REFRESH_SECONDS) -> None:
        """Refreshes until cancelled."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(interval)
                await self.refresh()

    def user(self, peer_der: bytes | None, headers: CIMultiDictProxy[str]) -> User:
        """The user of a request whose client certificate is `peer_der`, or
        NotAuthenticated."""
        if self.trust is None:
            raise NotAuthenticated(self.why)
        leaf = x509.load_der_x509_certificate(peer_der) if peer_der else None
        refused = proxy_refusal(leaf, self.trust, datetime.datetime.now(datetime.UTC))
        if refused:
            raise NotAuthenticated(refused)
        found = user_of(headers, self.trust)
        if found is None:
            raise NotAuthenticated("the front proxy named no user (no "
                                   f"{'/'.join(self.trust.username_headers)} header)")
        return found

