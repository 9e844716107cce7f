"""A throwaway Postgres server for tests and benchmarks: Debian's server binaries, a fresh
data directory, a free loopback port.

Postgres refuses to run as root (`initdb: cannot be run as root`); when we are root the
server runs as the `postgres` user the Debian package creates, with the data directory
owned by it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    if found:
        return Path(found[0]).parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).parent
    raise FileNotFoundError(
        "Postgres server binaries not found: install Debian's `postgresql` package "
        "(apt-get install -y postgresql), as .ci/run does"
    )


class Postgres:
    """A running Postgres server; `url` is a SQLAlchemy URL for database `agentrun`."""

    def __init__(self, root: Path | None = None, database: str = "agentrun") -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="agentrun-pg-"))
        self.database = database
        self.port = free_port()
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self._bin = _bin_dir()
        # As root, initdb runs through runuser and the server drops to `postgres` itself.
        self._user = "postgres" if os.geteuid() == 0 else None
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if self._user else []
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://agentrun@127.0.0.1:{self.port}/{self.database}"

    def _own(self, path: Path) -> None:
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self) -> Postgres:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for d in (self.data, self.socket_dir):
            d.mkdir(exist_ok=True)
            self._own(d)
        self.data.chmod(0o700)
        subprocess.run(
            [*self._as_postgres, str(self._bin / "initdb"), "-D", str(self.data),
             "-U", "agentrun", "-A", "trust", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True,
        )
        self._serve()
        wait_for(self._ready, timeout=60, what="postgres")
        subprocess.run(
            [str(self._bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "agentrun", self.database],
            check=True, capture_output=True,
        )
        return self

    def _serve(self) -> None:
        self.child = Child(
            "postgres",
            [str(self._bin / "postgres"), "-D", str(self.data),
             "-p", str(self.port), "-k", str(self.socket_dir),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=300"],
            self.root / "postgres.log",
            user=self._user,
        )

    def halt(self) -> None:
        """Stops the server but keeps its data: the store becomes unreachable."""
        if self.child is not None:
            self.child.stop(grace=10)
            self.child = None

    def resume(self) -> None:
        """Starts the halted server again, same data, same port."""
        self._serve()
        wait_for(self._ready, timeout=60, what="postgres")

    def _ready(self) -> bool:
        if self.child is not None and not self.child.alive():
            raise ProcessDied(f"postgres exited:\n{self.child.log_tail()}")
        done = subprocess.run(
            [str(self._bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
        )
        return done.returncode == 0

    def create_database(self, name: str) -> str:
        """Creates another database on this server; returns its SQLAlchemy URL."""
        subprocess.run(
            [str(self._bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "agentrun", name],
            check=True, capture_output=True,
        )
        return f"postgresql+psycopg://agentrun@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.child is not None:
            # SIGTERM is Postgres' "smart" shutdown; SIGINT would be "fast". Either is fine
            # for a throwaway server; Child.stop escalates to SIGKILL if it lingers.
            self.child.stop(grace=10)
            self.child = None
        shutil.rmtree(self.root, ignore_errors=True)
