# The operator image: agentrun-operator (kopf), without ADK. Build from the repository root:
#   docker build -t agentrun/operator:dev .        (or: make docker-build)
# `make images` builds it without a Docker engine, on a Debian bookworm base made from
# Debian packages (BASE_IMAGE); any base with python3 >= 3.11 and its venv module will do.
#
# Runs as a non-root user and writes nothing to its root filesystem (bytecode is compiled
# at build time, HOME and TMPDIR point at /tmp), so `readOnlyRootFilesystem: true` works
# with an emptyDir at /tmp.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies first, from pyproject.toml alone: a change to the code reuses this layer.
# Only agentrun[operator]'s (no ADK, no model provider: pyproject.toml), exact versions
# from requirements.lock.
COPY pyproject.toml requirements.lock devtools/requirements_of.py ./
RUN python3 requirements_of.py operator <pyproject.toml >/tmp/requirements.txt \
 && python3 -m venv /opt/agentrun \
 && /opt/agentrun/bin/pip install -c requirements.lock -r /tmp/requirements.txt \
 && cp requirements.lock /opt/agentrun/requirements.lock
# README.md only here (pyproject.toml's readme): an edit of it keeps the layer above.
COPY README.md ./
COPY agentrun ./agentrun
COPY operator ./operator
RUN /opt/agentrun/bin/pip install --no-deps . \
 && /opt/agentrun/bin/python3 -m compileall -q /opt/agentrun

FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 agentrun \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin agentrun
COPY --from=build /opt/agentrun /opt/agentrun
ENV PATH=/opt/agentrun/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
USER 10001:10001
WORKDIR /tmp
# Metrics (--metrics-port; the chart's metrics.port).
EXPOSE 9090
ENTRYPOINT ["agentrun-operator"]
