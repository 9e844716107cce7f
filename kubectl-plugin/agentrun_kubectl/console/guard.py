"""Who may use the console: the decision on each request, before anything else runs.

The console acts with the user's own Kubernetes identity, so anything that can make the
user's browser (or another program on this machine) send it a request could act as the
user. Four checks stand in the way, first failing one wins:

1. its `Host` is not `127.0.0.1:<port>` or `localhost:<port>` (DNS rebinding: a page of
   another site whose name now points here): 403, nothing read;
2. it carries `?token=` equal to the console's token, as a GET: 303 to the same path
   without the token, setting the cookie;
3. it carries no cookie `agentrun-console-<port>` equal to the token (a wrong `?token=`
   included): 401;
4. it changes state (not GET, HEAD or OPTIONS) without a same-origin header (`Origin` of
   this console, or `Sec-Fetch-Site: same-origin` where no `Origin` is sent): 403;
5. otherwise: served.

The cookie's name carries the port: a browser sends a host's cookies to every port of that
host, so two consoles (or another local server) must not see each other's.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


class Verdict(enum.Enum):
    SERVE = "serve"
    EXCHANGE = "exchange"  # the URL's token: set the cookie, redirect without it
    WRONG_HOST = "wrong-host"
    UNAUTHORIZED = "unauthorized"
    CROSS_SITE = "cross-site"


# What each refusal says (the body of its answer).
SAID = {
    Verdict.WRONG_HOST: "This console answers only to http://127.0.0.1:{port} and "
                        "http://localhost:{port}.",
    Verdict.UNAUTHORIZED: "Open the console with the URL `kubectl agentrun console` printed "
                          "(it carries the token).",
    Verdict.CROSS_SITE: "A request that changes something must come from the console's own "
                        "page (same origin).",
}


@dataclass(frozen=True)
class Request:
    """What the guard reads of a request."""

    method: str
    host: str | None
    query_token: str | None
    cookie: str | None
    origin: str | None
    fetch_site: str | None


def cookie_name(port: int) -> str:
    return f"agentrun-console-{port}"


def allowed_hosts(port: int) -> frozenset[str]:
    return frozenset(f"{name}:{port}" for name in LOOPBACK_NAMES)


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def admit(request: Request, *, port: int, token: str) -> Verdict:
    """The guard's decision on one request (the table above)."""
    hosts = allowed_hosts(port)
    if (request.host or "").lower() not in hosts:
        return Verdict.WRONG_HOST
    if request.query_token is not None and request.method == "GET" and _same(
            request.query_token, token):
        return Verdict.EXCHANGE
    if not _same(request.cookie, token):
        return Verdict.UNAUTHORIZED
    if request.method.upper() not in SAFE_METHODS:
        if request.origin is not None:
            same_origin = request.origin.lower() in {f"http://{h}" for h in hosts}
        else:
            same_origin = (request.fetch_site or "").lower() == "same-origin"
        if not same_origin:
            return Verdict.CROSS_SITE
    return Verdict.SERVE
