"""The development node's two pure decisions: when a projected token is renewed
(refresh_due, a kubelet's rule), and how an env value naming a mountPath is rewritten for
a process that has no mounts (mapped_env)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from agentrun_devtools.devnode import mapped_env, refresh_due

ISSUED = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)


def after(**delta: float) -> datetime.datetime:
    return ISSUED + datetime.timedelta(**delta)


REFRESH: list[tuple[str, datetime.datetime, datetime.datetime, bool]] = [
    # (row, expires at, now, renew?)
    ("just issued", after(hours=1), after(seconds=1), False),
    ("an hour's token at 79% of its life", after(hours=1), after(seconds=2844), False),
    ("an hour's token at exactly 80%", after(hours=1), after(seconds=2880), True),
    ("an hour's token at 90%", after(hours=1), after(seconds=3240), True),
    ("an hour's token past its expiry", after(hours=1), after(hours=2), True),
    ("a 10-minute token (the shortest allowed) at 7 minutes", after(minutes=10),
     after(minutes=7), False),
    ("a 10-minute token at 8 minutes", after(minutes=10), after(minutes=8), True),
    ("a 48-hour token at 23 hours: below both limits", after(hours=48), after(hours=23), False),
    ("a 48-hour token at 24 hours: 24 hours old comes before 80%", after(hours=48),
     after(hours=24), True),
    ("a year's token at 24 hours", after(days=365), after(hours=24), True),
    ("a token that expired as it was issued", ISSUED, ISSUED, True),
]


@pytest.mark.parametrize(("expires_at", "now", "due"), [r[1:] for r in REFRESH],
                         ids=[r[0] for r in REFRESH])
def test_refresh_due(expires_at: datetime.datetime, now: datetime.datetime, due: bool) -> None:
    assert refresh_due(ISSUED, expires_at, now) is due


STORE = "/var/run/secrets/agentrun.dev/store"
LOCAL = Path("/work/pods/ns_p_1234abcd/volumes/store-token")

MAPPED: list[tuple[str, dict[str, Path], str, str]] = [
    # (row, mounts, env value, what the process sees)
    ("the token file under the mount", {STORE: LOCAL}, f"{STORE}/token", f"{LOCAL}/token"),
    ("the mountPath itself", {STORE: LOCAL}, STORE, str(LOCAL)),
    ("the mountPath with a trailing slash", {STORE: LOCAL}, f"{STORE}/", f"{LOCAL}/"),
    ("a mountPath written with a trailing slash", {f"{STORE}/": LOCAL}, f"{STORE}/token",
     f"{LOCAL}/token"),
    ("a sibling that shares a prefix is not under the mount", {STORE: LOCAL},
     f"{STORE}-other/token", f"{STORE}-other/token"),
    ("a value that only contains the path is left alone", {STORE: LOCAL},
     f"file={STORE}/token", f"file={STORE}/token"),
    ("an unrelated value", {STORE: LOCAL}, "postgresql://db/agentrun",
     "postgresql://db/agentrun"),
    ("nested mounts: the innermost wins",
     {"/var/run/secrets": Path("/outer"), STORE: LOCAL}, f"{STORE}/token", f"{LOCAL}/token"),
    ("nested mounts: outside the inner one, the outer one",
     {"/var/run/secrets": Path("/outer"), STORE: LOCAL}, "/var/run/secrets/other",
     "/outer/other"),
    ("no mounts", {}, f"{STORE}/token", f"{STORE}/token"),
]


@pytest.mark.parametrize(("mounts", "value", "seen"), [r[1:] for r in MAPPED],
                         ids=[r[0] for r in MAPPED])
def test_mapped_env(mounts: dict[str, Path], value: str, seen: str) -> None:
    assert mapped_env({"AGENTRUN_STORE_TOKEN_FILE": value}, mounts) == {
        "AGENTRUN_STORE_TOKEN_FILE": seen}
