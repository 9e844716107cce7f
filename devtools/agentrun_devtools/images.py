"""`make images`: the operator, store API, runner and trial-Postgres images, built with neither a
registry nor a Docker engine.

A Debian bookworm base is made from Debian packages with mmdebstrap; buildah builds the
repository's Dockerfiles on it (`--pull=never`, chroot isolation, the host's network) and
writes one OCI archive per image. Nothing is cached in the checkout: the base tarball,
buildah's storage and the archives live under `${AGENTRUN_CACHE:-~/.cache/agentrun}/images`,
and each archive is keyed by what went into it (the Dockerfile, the files it copies, the
base), so a second run with nothing changed builds nothing.

The host's CA bundle is bind-mounted read-only into every RUN step (pip and apt reach their
indexes through a TLS-intercepting proxy here), never copied into an image.

Load an archive into containerd with `ctr -n k8s.io images import FILE`: each archive names
its image in the `io.containerd.image.name` annotation, fully qualified
(`docker.io/agentrun/operator:dev`), which is what kubelet looks for when a pod says
`image: agentrun/operator:dev`.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrun_devtools import cache

REPO = Path(__file__).resolve().parents[2]
# Where the host keeps its CA bundle (read here), and where Debian's tools inside a RUN
# step look for one (mounted there): the same path on a Debian host.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGE_CA = "/etc/ssl/certs/ca-certificates.crt"
BASE_NAME = "localhost/agentrun/debian-base:bookworm"
# Bump when the way an image is made changes in a way its inputs do not show.
RECIPE = "1"
# buildah's storage keeps what every earlier build made: the images a rebuild took the tag
# from, and each stage's --layers cache, about 1.5 GB per change of the sources. Past this
# size the untagged ones go after a build (the next build of a changed image may then redo
# a stage it had cached: the dependencies' pip install).
STORAGE_BUDGET = 8 * 2**30

# The base: what a Python program and a Postgres install need, and no more. Documentation,
# manual pages and translations are left out (copyright files stay), as in Debian's -slim.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
BASE_DPKG_OPTS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
TOOLS = {"mmdebstrap": "mmdebstrap", "buildah": "buildah", "umoci": "umoci", "runc": "runc"}


@dataclass(frozen=True)
class Image:
    """One image to build: a short name, its Dockerfile and the name it is published as."""

    short: str
    dockerfile: Path
    name: str
    build_args: tuple[tuple[str, str], ...] = field(default=())


def qualified(name: str) -> str:
    """The name containerd and kubelet use for an image reference: `agentrun/operator:dev`
    is `docker.io/agentrun/operator:dev`, `postgres:15` is `docker.io/library/postgres:15`."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    if not rest:
        return f"docker.io/library/{name}"
    return f"docker.io/{name}"


def default_images(operator: str, runner: str, postgres: str,
                   store_api: str = "agentrun/store-api:dev",
                   receiver: str = "agentrun/receiver:dev") -> list[Image]:
    return [
        Image("operator", REPO / "Dockerfile", qualified(operator)),
        Image("store-api", REPO / "store-api-image" / "Dockerfile", qualified(store_api)),
        Image("receiver", REPO / "receiver-image" / "Dockerfile", qualified(receiver)),
        Image("runner", REPO / "runner-image" / "Dockerfile", qualified(runner)),
        Image("postgres", REPO / "devtools" / "images" / "postgres" / "Dockerfile",
              qualified(postgres)),
    ]


def cache_root() -> Path:
    return cache.root() / "images"


def log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def ensure_tools() -> None:
    """apt-get install whichever of mmdebstrap, buildah, umoci and runc is missing."""
    missing = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    log(f"installing {' '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, env=env)


# --- what a Dockerfile copies -------------------------------------------------------------

def _instructions(dockerfile: Path) -> Iterator[list[str]]:
    """The Dockerfile's instructions, continuation lines joined, split into words."""
    pending = ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield shlex.split(pending + stripped, comments=False)
        pending = ""
    if pending:
        yield shlex.split(pending)


def named_stages(dockerfile: Path) -> list[str]:
    """The stages the Dockerfile names (`FROM ... AS name`) before its last one."""
    stages = [words for words in _instructions(dockerfile) if words[0].upper() == "FROM"]
    return [words[-1] for words in stages[:-1]
            if len(words) >= 4 and words[-2].upper() == "AS"]


def copied_sources(dockerfile: Path) -> list[str]:
    """The build-context patterns the Dockerfile's COPY and ADD take (not `--from` copies)."""
    sources: list[str] = []
    for words in _instructions(dockerfile):
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = words[1:]
        if any(arg.startswith("--from") for arg in args):
            continue
        paths = [arg for arg in args if not arg.startswith("--")]
        sources.extend(paths[:-1])
    return sources


def _ignore_patterns(context: Path) -> list[str]:
    ignore = context / ".dockerignore"
    if not ignore.exists():
        return []
    lines = (line.strip() for line in ignore.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def _ignored(relative: str, patterns: Sequence[str]) -> bool:
    # The subset of .dockerignore this repository uses: plain paths, globs, `**/name`.
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            return True
    return False


def context_files(dockerfile: Path, context: Path) -> list[Path]:
    """Every file of the build context the Dockerfile copies, .dockerignore applied."""
    patterns = _ignore_patterns(context)
    found: set[Path] = set()
    for source in copied_sources(dockerfile):
        for match in sorted(context.glob(source)):
            candidates = [match] if match.is_file() else sorted(match.rglob("*"))
            for path in candidates:
                relative = path.relative_to(context).as_posix()
                if path.is_file() and not _ignored(relative, patterns):
                    found.add(path)
    return sorted(found)


def image_key(image: Image, base_key: str, context: Path = REPO) -> str:
    """A hash of everything the image is made from: recipe, base, Dockerfile, build
    arguments, and the name, mode and bytes of each file it copies."""
    digest = hashlib.sha256()
    for part in (RECIPE, base_key, image.name, repr(image.build_args)):
        digest.update(part.encode() + b"\0")
    digest.update(image.dockerfile.read_bytes() + b"\0")
    for path in context_files(image.dockerfile, context):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(oct(path.stat().st_mode & 0o777).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:20]


def base_key() -> str:
    recipe = json.dumps([RECIPE, BASE_PACKAGES, BASE_MIRRORS, BASE_DPKG_OPTS])
    return hashlib.sha256(recipe.encode()).hexdigest()[:20]


# --- buildah ------------------------------------------------------------------------------

class Buildah:
    """buildah with its storage under the cache (not /var/lib/containers)."""

    def __init__(self, cache: Path, driver: str) -> None:
        self.driver = driver
        self.root = cache / f"storage-{driver}"
        self.runroot = cache / f"run-{driver}"

    def argv(self, *args: str) -> list[str]:
        return ["buildah", "--root", str(self.root), "--runroot", str(self.runroot),
                "--storage-driver", self.driver, *args]

    def run(self, *args: str, capture: bool = False) -> str:
        done = subprocess.run(self.argv(*args), check=True, text=True,
                              stdout=subprocess.PIPE if capture else None)
        return done.stdout if capture else ""

    def works(self) -> str | None:
        """None if a container's root can be mounted with this driver, else why not."""
        try:
            container = self.run("from", "scratch", capture=True).strip()
        except subprocess.CalledProcessError as error:
            return str(error)
        try:
            done = subprocess.run(self.argv("mount", container), text=True, capture_output=True)
            if done.returncode != 0:
                return done.stderr.strip()
            subprocess.run(self.argv("umount", container), check=True, capture_output=True)
            return None
        finally:
            subprocess.run(self.argv("rm", container), capture_output=True)

    def label(self, image: str, key: str) -> str | None:
        done = subprocess.run(self.argv("inspect", "--type", "image", image),
                              text=True, capture_output=True)
        if done.returncode != 0:
            return None
        labels = json.loads(done.stdout).get("OCIv1", {}).get("config", {}).get("Labels") or {}
        value = labels.get(key)
        return value if isinstance(value, str) else None


def choose_buildah(cache: Path) -> Buildah:
    """overlay storage if it works here, else vfs (slower, every layer a full copy)."""
    chosen = cache / "storage-driver"
    if chosen.exists():
        return Buildah(cache, chosen.read_text().strip())
    overlay = Buildah(cache, "overlay")
    why = overlay.works()
    driver = "overlay"
    if why is not None:
        log(f"overlay storage does not work here ({why}); using vfs")
        driver = "vfs"
    chosen.write_text(driver + "\n")
    return Buildah(cache, driver)


# --- the base -----------------------------------------------------------------------------

def build_base(buildah: Buildah, cache: Path) -> str:
    """Make (or find) the Debian bookworm base in buildah's storage; returns its key."""
    key = base_key()
    if buildah.label(BASE_NAME, "dev.agentrun.base-key") == key:
        return key
    tarball = cache / "base" / f"bookworm-{key}.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        with step(f"mmdebstrap bookworm ({', '.join(BASE_PACKAGES)})"):
            argv = ["mmdebstrap", "--variant=apt", "--quiet",
                    "--include=" + ",".join(BASE_PACKAGES)]
            argv += [f"--dpkgopt={opt}" for opt in BASE_DPKG_OPTS]
            argv += ["--format=tar", "bookworm", str(partial), *BASE_MIRRORS]
            # mmdebstrap reads sources from stdin when stdin is not a terminal.
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
        partial.rename(tarball)
    with step(f"commit {BASE_NAME}"):
        container = buildah.run("from", "scratch", capture=True).strip()
        try:
            buildah.run("add", "--quiet", container, str(tarball), "/")
            buildah.run("config", "--cmd", '["/bin/bash"]', "--env", "LANG=C.UTF-8",
                        "--label", f"dev.agentrun.base-key={key}", container)
            buildah.run("commit", "--quiet", "--rm", container, BASE_NAME)
        except BaseException:
            subprocess.run(buildah.argv("rm", container), capture_output=True)
            raise
    return key


# --- the images ---------------------------------------------------------------------------

class step:
    """Times one step and logs it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = 0.0

    def __enter__(self) -> step:
        log(f"{self.what} ...")
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        outcome = "failed" if exc[0] else "done"
        log(f"{self.what}: {outcome} in {time.monotonic() - self.started:.1f}s")


def archive_path(cache: Path, image: Image) -> Path:
    return cache / "archives" / f"{image.short}.oci.tar"


def name_archive(layout: Path, name: str) -> None:
    """Name the image in the layout's index the way containerd's importer reads it.

    `ctr images import` takes `io.containerd.image.name` as the image's name; without it,
    it turns `org.opencontainers.image.ref.name` into `import-<date>:<ref>` or drops it."""
    index_file = layout / "index.json"
    index = json.loads(index_file.read_text())
    for manifest in index["manifests"]:
        annotations = manifest.setdefault("annotations", {})
        annotations["io.containerd.image.name"] = name
        annotations["org.opencontainers.image.ref.name"] = name
    index_file.write_text(json.dumps(index, separators=(",", ":")))


def write_archive(layout: Path, archive: Path) -> None:
    """A tar of the OCI layout, entries sorted, ownership and times zeroed."""
    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(archive, "w") as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=path.relative_to(layout).as_posix(), recursive=False,
                    filter=clean)


def stage_name(image: Image, stage: str) -> str:
    """The tag kept on an image's earlier stage, so that pruning leaves its layers."""
    return f"localhost/agentrun/{image.short}-{stage}:cache"


def build_image(buildah: Buildah, cache: Path, image: Image, base: str) -> Path:
    """Build one image (unless its archive is current) and return its archive."""
    archive = archive_path(cache, image)
    key = image_key(image, base)
    stamp = archive.with_suffix(".key")
    if archive.exists() and stamp.exists() and stamp.read_text().strip() == key:
        log(f"{image.short}: {image.name} is current ({archive})")
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    argv = ["bud", "--pull=never", "--layers", "--isolation", "chroot", "--network", "host",
            "--build-arg", f"BASE_IMAGE={BASE_NAME}", "-f", str(image.dockerfile)]
    for arg, value in image.build_args:
        argv += ["--build-arg", f"{arg}={value}"]
    if HOST_CA.exists():
        argv += ["-v", f"{HOST_CA}:{IMAGE_CA}:ro"]
    # Each earlier stage is built and tagged first (the build below finds it in the
    # --layers cache): its result is no image's parent, so untagged it would be pruned
    # with the layers under it, the dependencies' install among them.
    for stage in named_stages(image.dockerfile):
        with step(f"{image.short}: buildah bud --target {stage}"):
            buildah.run(*argv, "--target", stage, "-t", stage_name(image, stage), str(REPO))
    # (A Dockerfile outside the repository, as a test's, is shown whole.)
    shown = image.dockerfile.relative_to(REPO) if image.dockerfile.is_relative_to(REPO) \
        else image.dockerfile
    with step(f"{image.short}: buildah bud {shown}"):
        buildah.run(*argv, "--label", f"dev.agentrun.key={key}", "-t", image.name, str(REPO))
    with step(f"{image.short}: export {archive}"), \
            tempfile.TemporaryDirectory(dir=archive.parent) as scratch:
        layout = Path(scratch) / "layout"
        buildah.run("push", "--quiet", image.name, f"oci:{layout}:{image.name}")
        name_archive(layout, image.name)
        partial = Path(scratch) / "archive.tar"
        write_archive(layout, partial)
        partial.rename(archive)
    stamp.write_text(key + "\n")
    return archive


def build(images: Sequence[Image], cache: Path | None = None) -> dict[str, Path]:
    """Build the base and the images; returns each image's archive by short name.

    One build at a time per cache: CI builds the images in the background while the tests
    that need them may already ask (and two builds would share buildah's storage and apt);
    a second caller waits for the first, then finds its archives current."""
    cache = cache or cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(images, cache)


def _build(images: Sequence[Image], cache: Path) -> dict[str, Path]:
    ensure_tools()
    base = base_key()
    # The warm path: nothing changed, nothing to start buildah for.
    current = {}
    for image in images:
        archive = archive_path(cache, image)
        stamp = archive.with_suffix(".key")
        if archive.exists() and stamp.exists() and \
                stamp.read_text().strip() == image_key(image, base):
            current[image.short] = archive
    if len(current) == len(images):
        for image in images:
            log(f"{image.short}: {image.name} is current ({current[image.short]})")
        return current
    buildah = choose_buildah(cache)
    base = build_base(buildah, cache)
    built = {image.short: build_image(buildah, cache, image, base) for image in images}
    prune(buildah)
    return built


def disk_usage(path: Path) -> int:
    """Bytes under `path`, each hard-linked file once (du)."""
    done = subprocess.run(["du", "-s", "--block-size=1", str(path)], text=True,
                          capture_output=True, check=True)
    return int(done.stdout.split()[0])


def prune(buildah: Buildah, budget: int = STORAGE_BUDGET) -> None:
    """Removes the untagged images from buildah's storage once it is over `budget` bytes."""
    used = disk_usage(buildah.root)
    if used <= budget:
        return
    with step(f"storage {used / 2**30:.1f} GiB, over {budget / 2**30:.0f} GiB: "
              "buildah rmi --prune"):
        done = subprocess.run(buildah.argv("rmi", "--prune"), text=True, capture_output=True)
    # The images are built: a prune that fails (an image still used by a working
    # container) is reported, not fatal.
    if done.returncode != 0:
        log(f"prune failed: {done.stderr.strip()[-500:]}")
    log(f"storage now {disk_usage(buildah.root) / 2**30:.1f} GiB")


# --- running an image without a kubelet ----------------------------------------------------

@dataclass
class Mount:
    """A mount in a container: a tmpfs (an emptyDir) when `source` is None, else a bind."""

    destination: str
    source: Path | None = None


def unpack(archive: Path, into: Path) -> Path:
    """Unpack an OCI archive into a runc bundle (rootfs + config.json from the image's
    config: user, environment, entrypoint, working directory) and return the bundle."""
    layout = into / "layout"
    layout.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="tar")
    index = json.loads((layout / "index.json").read_text())
    ref = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    bundle = into / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{ref}", str(bundle)],
                   check=True, capture_output=True, text=True)
    shutil.rmtree(layout)
    return bundle


class Container:
    """An unpacked image run with runc as the kubelet would: the image's user, a read-only
    root filesystem, tmpfs where the chart puts emptyDirs. It shares the host's network
    (a test reaches a server on a loopback port)."""

    def __init__(self, bundle: Path, name: str, args: Sequence[str] | None = None,
                 env: dict[str, str] | None = None, mounts: Sequence[Mount] = ()) -> None:
        self.bundle = bundle
        self.name = name
        self.state = bundle.parent / "runc"
        # Each container starts from the image's own config, kept beside the one runc reads.
        config_file = bundle / "config.json"
        original = bundle / "config.image.json"
        if not original.exists():
            shutil.copyfile(config_file, original)
        config = json.loads(original.read_text())
        process = config["process"]
        process["terminal"] = False
        # The chart drops every capability.
        process["capabilities"] = {kind: [] for kind in
                                   ("bounding", "effective", "inheritable", "permitted",
                                    "ambient")}
        if args is not None:
            process["args"] = list(args)
        process["env"] = [*process.get("env", []), *(f"{k}={v}" for k, v in (env or {}).items())]
        config["root"]["readonly"] = True
        for mount in mounts:
            if mount.source is None:
                config["mounts"].append({"destination": mount.destination, "type": "tmpfs",
                                         "source": "tmpfs",
                                         "options": ["nosuid", "nodev", "mode=1777"]})
            else:
                config["mounts"].append({"destination": mount.destination, "type": "bind",
                                         "source": str(mount.source),
                                         "options": ["rbind", "rw"]})
        linux = config["linux"]
        linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] != "network"]
        config_file.write_text(json.dumps(config))
        self.child: subprocess.Popen[str] | None = None

    @property
    def user(self) -> tuple[int, int]:
        user = json.loads((self.bundle / "config.json").read_text())["process"]["user"]
        return int(user["uid"]), int(user["gid"])

    def _runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.state), *args]

    def run(self, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run to completion; stdout and stderr captured."""
        try:
            return subprocess.run(self._runc("run", "--bundle", str(self.bundle), self.name),
                                  capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        finally:
            self.delete()

    def start(self, log_file: Path) -> None:
        """Start in the background, output to log_file."""
        with log_file.open("w") as out:
            self.child = subprocess.Popen(
                self._runc("run", "--bundle", str(self.bundle), self.name),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)

    def exec(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command in the started container (as a kubelet's exec probe does)."""
        return subprocess.run(self._runc("exec", self.name, *args), capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (what the kubelet sends), then wait; returns the exit code."""
        if self.child is None:
            return None
        subprocess.run(self._runc("kill", self.name, "TERM"), capture_output=True)
        try:
            return self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            subprocess.run(self._runc("kill", self.name, "KILL"), capture_output=True)
            return self.child.wait(10)
        finally:
            self.child = None
            self.delete()

    def delete(self) -> None:
        subprocess.run(self._runc("delete", "--force", self.name), capture_output=True)


def unpacked_size(bundle: Path) -> int:
    total = 0
    for path in (bundle / "rootfs").rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.lstat().st_size
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operator", default="agentrun/operator:dev")
    parser.add_argument("--store-api", default="agentrun/store-api:dev")
    parser.add_argument("--receiver", default="agentrun/receiver:dev")
    parser.add_argument("--runner", default="agentrun/runner:dev")
    parser.add_argument("--postgres", default="agentrun/postgres:dev")
    parser.add_argument("--only", action="append",
                        choices=["operator", "store-api", "receiver", "runner", "postgres"],
                        help="build only this image (repeatable)")
    args = parser.parse_args(argv)
    images = default_images(args.operator, args.runner, args.postgres, args.store_api,
                            args.receiver)
    if args.only:
        images = [image for image in images if image.short in args.only]
    started = time.monotonic()
    archives = build(images)
    log(f"all done in {time.monotonic() - started:.1f}s")
    for image in images:
        archive = archives[image.short]
        print(f"{image.name}\t{archive}\t{archive.stat().st_size / 1e6:.0f} MB")
    print("load into containerd: ctr -n k8s.io images import ARCHIVE", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
