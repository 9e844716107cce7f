"""The images `make images` builds, run from their OCI archives with runc the way a kubelet
would run them: as the image's user, read-only root filesystem, tmpfs for the emptyDirs.

The archives come from the cached build (seconds when nothing changed; a cold build takes
minutes). Building needs root (buildah, runc); a machine without it fails here with the
reason rather than skipping.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import subprocess
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest
from agentrun_devtools import images
from agentrun_devtools.processes import free_port
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.loader_vectors import (
    BYPASS,
    RUNNER_ENV,
    RUNNER_REFUSAL,
    RUNNER_REFUSAL_EXIT,
    elf_interpreter,
    plant,
)

pytestmark = pytest.mark.images

NAMES = {
    "operator": "docker.io/agentrun/operator:dev",
    "store-api": "docker.io/agentrun/store-api:dev",
    "receiver": "docker.io/agentrun/receiver:dev",
    "runner": "docker.io/agentrun/runner:dev",
    "postgres": "docker.io/agentrun/postgres:dev",
}
UIDS = {"operator": 10001, "store-api": 10001, "receiver": 10001, "runner": 10001,
        "postgres": 999}
# Where Debian keeps the CA bundle its TLS libraries read.
DEBIAN_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def archives() -> dict[str, Path]:
    if os.geteuid() != 0:
        pytest.fail("building and running images needs root (buildah, runc)")
    return images.build(images.default_images("agentrun/operator:dev", "agentrun/runner:dev",
                                              "agentrun/postgres:dev", "agentrun/store-api:dev",
                                              "agentrun/receiver:dev"))


@pytest.fixture(scope="module")
def bundles(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Path]:
    return {short: images.unpack(archive, tmp_path_factory.mktemp(short))
            for short, archive in archives.items()}


def container(bundles: dict[str, Path], short: str, args: list[str] | None = None,
              env: dict[str, str] | None = None, mounts: Sequence[images.Mount] = ()
              ) -> images.Container:
    """The image as the chart runs it: an emptyDir at /tmp, and whatever else it mounts."""
    name = f"agentrun-test-{short}-{os.getpid()}-{secrets.token_hex(3)}"
    return images.Container(bundles[short], name, args=args, env=env,
                            mounts=[images.Mount("/tmp"), *mounts])


@pytest.mark.parametrize("short", sorted(NAMES))
def test_archive_names_its_image_for_containerd(archives: dict[str, Path], short: str) -> None:
    # `ctr -n k8s.io images import` registers io.containerd.image.name; kubelet looks up
    # `agentrun/operator:dev` as docker.io/agentrun/operator:dev.
    with tarfile.open(archives[short]) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    [manifest] = index["manifests"]
    assert manifest["annotations"]["io.containerd.image.name"] == NAMES[short]


@pytest.mark.parametrize("short", sorted(NAMES))
def test_runs_as_its_non_root_user(bundles: dict[str, Path], short: str) -> None:
    # Postgres images need no Python (postgres:15 has none): ask bash there.
    args = ["bash", "-c", "echo $(id -u) $(id -g); : > /written || true; echo ok > /tmp/x"]
    if short != "postgres":
        args = ["python3", "-c", "import os\n"
                "print(os.getuid(), os.getgid())\n"
                "try:\n    open('/written', 'w')\nexcept OSError as e:\n    print(e.strerror)\n"
                "open('/tmp/x', 'w').write('ok')\n"]
    probe = container(bundles, short, args=args)
    done = probe.run()
    assert done.returncode == 0, done.stderr
    uid = UIDS[short]
    assert done.stdout.split()[:2] == [str(uid), str(uid)]
    assert "Read-only file system" in done.stdout + done.stderr


def test_operator_store_api_and_receiver_print_their_help(bundles: dict[str, Path]) -> None:
    done = container(bundles, "operator", args=["agentrun-operator", "--help"]).run()
    assert done.returncode == 0, done.stderr
    assert "usage: agentrun-operator" in done.stdout
    store_api = container(bundles, "store-api", args=["agentrun-store-api", "--help"]).run()
    assert store_api.returncode == 0, store_api.stderr
    assert "usage: agentrun-store-api" in store_api.stdout
    receiver = container(bundles, "receiver", args=["agentrun-receiver", "--help"]).run()
    assert receiver.returncode == 0, receiver.stderr
    assert "usage: agentrun-receiver" in receiver.stdout


# What each image must not carry (pyproject.toml's extras), and what it must.
CARRIES = {
    "operator": (("kopf", "kubernetes", "sqlalchemy", "psycopg", "alembic"),
                 ("google.adk", "google.genai", "litellm", "anthropic")),
    "store-api": (("google.adk", "sqlalchemy", "psycopg", "alembic", "kubernetes", "aiohttp"),
                  ("kopf", "litellm", "anthropic")),
    "receiver": (("kubernetes", "aiohttp", "cloudevents", "jsonpointer"),
                 ("kopf", "google.adk", "litellm", "sqlalchemy", "psycopg", "alembic")),
    "runner": (("google.adk", "litellm", "anthropic", "aiohttp"),
               ("kopf", "kubernetes", "sqlalchemy", "psycopg", "alembic",
                "prometheus_client")),
}


@pytest.mark.parametrize("short", sorted(CARRIES))
def test_an_image_carries_its_programs_packages_and_no_others(
        bundles: dict[str, Path], short: str) -> None:
    present, absent = CARRIES[short]
    probe = ("import importlib.util, json, sys\n"
             "def found(m):\n"
             "    try:\n"
             "        return importlib.util.find_spec(m) is not None\n"
             "    except ModuleNotFoundError:\n"
             "        return False\n"
             "print(json.dumps({m: found(m) for m in sys.argv[1:]}))")
    done = container(bundles, short, args=["python3", "-c", probe, *present, *absent]).run()
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [m for m in present if not found[m]] == [], found
    assert [m for m in absent if found[m]] == [], found


def test_the_operator_image_says_where_its_runners_store_api_must_come_from(
        bundles: dict[str, Path]) -> None:
    # The store API is a program of its own (the store API's image): an operator told
    # nothing of it stops at once and says what to do.
    done = container(bundles, "operator", args=["agentrun-operator"],
                     env={"DATABASE_URL": "postgresql+psycopg://x@127.0.0.1:9/x"}).run()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--store-api-url" in done.stderr and "agentrun-store-api" in done.stderr, \
        done.stderr


def test_runner_refuses_to_start_without_a_durable_store(bundles: dict[str, Path]) -> None:
    env = {
        "AGENTRUN_NAMESPACE": "default", "AGENTRUN_RUN_NAME": "image-check",
        "AGENTRUN_RUN_UID": "00000000-0000-0000-0000-000000000001", "AGENTRUN_ATTEMPT": "1",
        "AGENTRUN_AGENT": "noop-agent", "AGENTRUN_INPUT_DIGEST": "sha256:0",
    }
    done = container(bundles, "runner", env=env).run()
    assert done.returncode not in (0, None)
    assert "no durable session store is configured" in done.stderr, done.stderr


def test_the_runner_starts_isolated_through_its_static_launcher(
        bundles: dict[str, Path], tmp_path: Path) -> None:
    """The image's `agentrun-runner` (its ENTRYPOINT, what the operator's pods run) is the
    launcher: a static program, which removes the variables that load code before Python
    starts. The same variables make the image's Python run every planted vector when it is
    started directly."""
    launcher = bundles["runner"] / "rootfs" / "opt" / "agentrun" / "bin" / "agentrun-runner"
    assert elf_interpreter(launcher) is None
    vectors = plant(tmp_path / "planted", seen_as=Path("/planted"))
    planted = [images.Mount("/planted", tmp_path / "planted")]
    env = {**RUNNER_ENV, **vectors.env}

    done = container(bundles, "runner", env=env, mounts=planted).run()

    assert done.returncode == RUNNER_REFUSAL_EXIT, done.stdout + done.stderr
    assert RUNNER_REFUSAL in done.stderr
    assert vectors.created() == []

    container(bundles, "runner", args=["python3", *BYPASS], env=env, mounts=planted).run()
    assert vectors.created() == sorted(vectors.markers)


def test_isolated_python_finds_the_runner_and_the_sample_agents(
        bundles: dict[str, Path]) -> None:
    # What the launcher runs: -I keeps neither the working directory nor the user's site on
    # sys.path, and reads no PYTHON* variable; the runner and /agents are found without.
    probe = ("import os, pathlib, agentrun_runner.agents as a\n"
             "where = pathlib.Path(os.environ['AGENTRUN_AGENTS_DIR'])\n"
             "print(*(a.load_agent(where, n).name for n in ('support-agent', 'noop-agent')))")
    done = container(bundles, "runner", args=["python3", "-I", "-c", probe]).run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["support_agent", "noop_agent"], done.stdout


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    # A fresh PersistentVolume as the kubelet hands it over with fsGroup 999: root's, group
    # 999, group-writable, setgid.
    data = tmp_path / "volume"
    data.mkdir()
    os.chown(data, 0, 999)
    data.chmod(0o2770)
    return data


def _connect(port: int, password: str, deadline: float) -> psycopg.Connection:
    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, user="agentrun",
                                   password=password, dbname="agentrun", connect_timeout=3)
        except psycopg.OperationalError as error:
            if "password authentication failed" in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture
def postgres(bundles: dict[str, Path], volume: Path, tmp_path: Path
             ) -> Iterator[tuple[images.Container, int, str, Path]]:
    port = free_port()
    password = secrets.token_urlsafe(24)
    env = {"POSTGRES_USER": "agentrun", "POSTGRES_PASSWORD": password,
           "POSTGRES_DB": "agentrun", "PGPORT": str(port)}
    server = container(bundles, "postgres", env=env, mounts=[
        images.Mount("/var/lib/postgresql/data", volume), images.Mount("/var/run/postgresql")])
    log = tmp_path / "postgres.log"
    server.start(log)
    try:
        yield server, port, password, log
    finally:
        server.stop()


def test_postgres_initialises_its_volume_and_takes_password_logins(
    postgres: tuple[images.Container, int, str, Path], volume: Path, bundles: dict[str, Path]
) -> None:
    server, port, password, log = postgres
    try:
        connection = _connect(port, password, time.monotonic() + 90)
    except psycopg.OperationalError as error:
        pytest.fail(f"{error}\n{log.read_text()}")
    with connection:
        row = connection.execute("select current_user, current_database(), "
                                 "current_setting('data_directory')").fetchone()
    assert row == ("agentrun", "agentrun", "/var/lib/postgresql/data/pgdata")
    assert (volume / "pgdata" / "PG_VERSION").read_text().strip() == "15"
    assert (volume / "pgdata").stat().st_uid == 999
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _connect(port, "wrong", time.monotonic() + 10)
    assert "initialised /var/lib/postgresql/data/pgdata" in log.read_text()
    # The chart's readiness probe, run inside the container.
    probe = server.exec("pg_isready", "-U", "agentrun")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    # SIGTERM, as on pod deletion: a clean shutdown.
    assert server.stop() == 0, log.read_text()

    # The pod comes back on its volume with another password in its env: the data and the
    # first password stay (the chart keeps its Secret for this reason).
    again = container(bundles, "postgres", env={
        "POSTGRES_USER": "agentrun", "POSTGRES_PASSWORD": "another", "POSTGRES_DB": "agentrun",
        "PGPORT": str(port)}, mounts=[images.Mount("/var/lib/postgresql/data", volume),
                                     images.Mount("/var/run/postgresql")])
    again_log = log.with_name("again.log")
    again.start(again_log)
    try:
        with _connect(port, password, time.monotonic() + 90) as connection:
            assert connection.execute("select 1").fetchone() == (1,)
    finally:
        assert again.stop() == 0, again_log.read_text()
    assert "initialised" not in again_log.read_text()


def test_postgres_refuses_to_initialise_without_a_password(
    bundles: dict[str, Path], volume: Path
) -> None:
    done = container(bundles, "postgres", env={"POSTGRES_USER": "agentrun"}, mounts=[
        images.Mount("/var/lib/postgresql/data", volume),
        images.Mount("/var/run/postgresql")]).run()
    assert done.returncode == 1
    assert "POSTGRES_PASSWORD is empty" in done.stderr
    assert list(volume.iterdir()) == []


def certificates(text: str) -> set[str]:
    """The base64 bodies of the PEM certificates in `text`, whitespace left out."""
    return {"".join(body.split()) for body in re.findall(
        r"-----BEGIN CERTIFICATE-----(.+?)-----END", text, re.S)}


def local_certificates() -> set[str]:
    """The CAs this host adds to Debian's bundle (an intercepting proxy); none on most."""
    found: set[str] = set()
    for path in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        found |= certificates(path.read_text())
    return found


@pytest.mark.parametrize("short", sorted(NAMES))
def test_the_hosts_ca_bundle_is_not_baked_in(bundles: dict[str, Path], short: str) -> None:
    """Each image's bundle holds Debian's CAs, those its own ca-certificates package ships,
    and nothing of the host's (mounted into every RUN step, never copied)."""
    rootfs = bundles[short] / "rootfs"
    bundle = rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt"
    held = certificates(bundle.read_text())
    shipped: set[str] = set()
    for path in (rootfs / "usr" / "share" / "ca-certificates").rglob("*.crt"):
        shipped |= certificates(path.read_text())
    assert held and held <= shipped, sorted(held - shipped)[:3]
    assert not held & local_certificates()


def planted_ca(directory: Path) -> str:
    """A CA certificate of no one's (PEM), made for the test."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentrun test CA, planted")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (directory / "planted-ca.crt").write_text(pem)
    return pem


def test_a_planted_host_ca_reaches_the_build_steps_and_stays_out_of_the_image(
        archives: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On any machine, whether or not its host adds a CA: a CA planted in the host's bundle
    (the host's bundle and one more) is what a build's RUN step sees, and the image built
    holds none of it. `archives` has put the Debian base in buildah's storage."""
    pem = planted_ca(tmp_path)
    host = tmp_path / "host-ca-certificates.crt"
    host.write_text((images.HOST_CA.read_text() if images.HOST_CA.exists() else "") + pem)
    monkeypatch.setattr(images, "HOST_CA", host)
    [body] = certificates(pem)
    marker = pem.splitlines()[2]  # a line of the body: grep -F finds it in the bundle
    assert "".join(marker.split()) in body
    dockerfile = tmp_path / "Dockerfile"
    # The RUN step looks where Debian's tools do (OpenSSL's cert.pem links there; apt and
    # pip read it), not where images.py says it mounts: a mount elsewhere must fail here.
    dockerfile.write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
        f"RUN grep -qF '{marker}' {DEBIAN_BUNDLE} && echo seen > /etc/planted-ca-seen\n")
    probe = images.Image("ca-probe", dockerfile, f"localhost/agentrun/ca-probe-{os.getpid()}:test")
    buildah = images.choose_buildah(images.cache_root())
    try:
        archive = images.build_image(buildah, tmp_path / "cache", probe, images.base_key())
    finally:
        subprocess.run(buildah.argv("rmi", "--force", probe.name), capture_output=True)
    rootfs = images.unpack(archive, tmp_path / "probe") / "rootfs"
    # The RUN step read the planted CA where Debian's tools look for the bundle...
    assert (rootfs / "etc" / "planted-ca-seen").read_text() == "seen\n"
    # ...and the image keeps Debian's bundle, without it.
    held = certificates((rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt").read_text())
    assert held and body not in held


def test_storage_over_its_budget_keeps_only_the_tagged_images(tmp_path: Path) -> None:
    """Each rebuild takes the tag from the image before it, which stays in buildah's
    storage: a build over the budget prunes those, never a tagged image."""
    if os.geteuid() != 0:
        pytest.fail("buildah needs root here")
    (tmp_path / "cache").mkdir()
    buildah = images.choose_buildah(tmp_path / "cache")
    tag = "localhost/agentrun/prune-test:dev"

    def commit(content: bytes) -> str:
        container = buildah.run("from", "scratch", capture=True).strip()
        payload = tmp_path / "payload"
        payload.write_bytes(content)
        try:
            buildah.run("add", "--quiet", container, str(payload), "/payload")
            return buildah.run("commit", "--quiet", "--rm", container, tag,
                               capture=True).strip()
        except BaseException:
            buildah.run("rm", container, capture=True)
            raise

    def stored() -> set[str]:
        listed = json.loads(buildah.run("images", "--all", "--json", "--no-trunc",
                                        capture=True) or "[]")
        return {entry["id"].removeprefix("sha256:") for entry in listed}

    try:
        earlier = commit(os.urandom(1 << 20))
        current = commit(os.urandom(1 << 20))
        assert {earlier, current} <= stored()
        images.prune(buildah, budget=1 << 40)
        assert earlier in stored(), "under its budget, the storage is left alone"
        images.prune(buildah, budget=0)
        assert stored() == {current}
    finally:
        buildah.run("rmi", "--all", "--force", capture=True)
