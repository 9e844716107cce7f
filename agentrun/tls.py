"""A server's certificate (the store API's, the trigger receiver's): loaded at start, and
again whenever its files change (cert-manager, or the chart's upgrade, rewrites the
Secret's files in place: a kubelet swaps the mounted directory atomically), so that a
rotated certificate needs no restart. Standard library only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("agentrun.tls")

# How often the files are looked at for a new certificate.
RELOAD_SECONDS = 60.0


@dataclass
class ServingCertificate:
    """A certificate and its key (PEM files), as an SSL context that follows them."""

    cert_file: Path | str
    key_file: Path | str
    context: ssl.SSLContext = field(init=False)
    _stamp: tuple[float, float] = field(init=False, default=(0.0, 0.0))

    def __post_init__(self) -> None:
        self.cert_file, self.key_file = Path(self.cert_file), Path(self.key_file)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.load()

    def _mtimes(self) -> tuple[float, float]:
        return Path(self.cert_file).stat().st_mtime, Path(self.key_file).stat().st_mtime

    def load(self) -> None:
        """Loads the pair (raises with the file's name when either cannot be read)."""
        stamp = self._mtimes()
        self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        self._stamp = stamp

    def reload_if_changed(self) -> bool:
        """Loads the pair again if its files changed; True when it did. A pair that cannot
        be read (caught in the middle of a rewrite) keeps the one in use, and is tried
        again next time."""
        try:
            if self._mtimes() == self._stamp:
                return False
            self.load()
        except (OSError, ssl.SSLError) as e:
            log.warning("event=tls-reload-failed cert=%s error=%r", self.cert_file, e)
            return False
        log.info("event=tls-reloaded cert=%s", self.cert_file)
        return True

    async def follow(self, interval: float = RELOAD_SECONDS) -> None:
        """Reloads on change until cancelled."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(interval)
                self.reload_if_changed()
