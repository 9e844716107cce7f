"""The chart and Helm for the chart's tests: where charts/agentrun is, the release
namespace and Kubernetes version it is rendered for, and the control plane's own helm
binary run without a cluster (lint, template)."""

from __future__ import annotations

import subprocess

from agentrun_devtools.controlplane import REPO, binaries

CHART = REPO / "charts" / "agentrun"
NAMESPACE = "agentrun-system"
ARGS = ("--namespace", NAMESPACE, "--kube-version", "v1.37.2")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binaries() / "helm"), *args], capture_output=True, text=True,
                          timeout=120)
