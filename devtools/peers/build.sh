#!/usr/bin/env bash
# Builds the peers' own code that the tests run where a peer's behaviour is the contract:
# argocd-health (Argo CD's health-check code, for the chart's health.lua scripts),
# kstatus (cli-utils' kstatus, as Flux reads our conditions) and kubelet-expansion (the
# kubelet's own $(VAR) expansion, for the development node's pods), each a small command in a
# wrapper module beside this script, from the Go module proxy at the versions pinned there.
# The binaries are cached outside the checkout, keyed by those versions, the Go toolchains
# and the wrappers' own sources. Prints the bin directory on its last line, like
# devtools/controlplane/build.sh.
#
#   devtools/peers/build.sh               # build if missing, print the bin directory
#   AGENTRUN_CACHE=/somewhere build.sh    # choose the cache root (default ~/.cache/agentrun)
#   devtools/peers/build.sh kubelet-expansion   # build that one if missing, print its bin directory
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The version a wrapper's go.mod requires, whether in a require block or on one line.
required() {
  awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$2"
}
# The toolchain a wrapper's go.mod names, else the installed Go.
toolchain() {
  awk '$1=="toolchain" {print $2; found=1; exit} END {if (!found) print ""}' "$1"
}
cache_root=${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}
export CGO_ENABLED=0

# kubelet-expansion is keyed on its own: it follows the control plane's Kubernetes release
# (pinned in its go.mod like devtools/controlplane/kubernetes/go.mod), and a change of it
# must not rebuild Argo CD.
k8s_version=$(required k8s.io/kubernetes "$here/kubelet-expansion/go.mod")
[[ $k8s_version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read the pinned versions (got '$k8s_version')" >&2; exit 1; }
expansion_go=$(toolchain "$here/kubelet-expansion/go.mod")
expansion_go=${expansion_go:-$(go env GOVERSION)}
expansion_sources=$(cd "$here" && cat kubelet-expansion/go.mod kubelet-expansion/go.sum \
  kubelet-expansion/*.go | sha256sum | cut -c1-12)
expansion_bin="$cache_root/peers/kubelet-expansion_k8s-${k8s_version}_${expansion_go}_${expansion_sources}/bin"
# One build of a key at a time (see the lock below, for the other two).
mkdir -p "$expansion_bin"
exec 8>"$(dirname "$expansion_bin").lock"
flock 8
if [ ! -x "$expansion_bin/kubelet-expansion" ]; then
  scratch=$(mktemp -d)
  cp -r "$here/kubelet-expansion" "$scratch/"
  echo "building kubelet-expansion ..." >&2
  (cd "$scratch/kubelet-expansion" && GOTOOLCHAIN=$expansion_go go build -trimpath -ldflags "-s -w" \
    -o "$expansion_bin/.kubelet-expansion.tmp" .)
  mv "$expansion_bin/.kubelet-expansion.tmp" "$expansion_bin/kubelet-expansion"
  rm -rf "$scratch"
fi
if [ "${1:-}" = kubelet-expansion ]; then
  echo "$expansion_bin"
  exit 0
fi

argocd_version=$(required github.com/argoproj/argo-cd/v3 "$here/argocd-health/go.mod")
cliutils_version=$(required sigs.k8s.io/cli-utils "$here/kstatus/go.mod")
for v in "$argocd_version" "$cliutils_version"; do
  [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read the pinned versions (got '$v')" >&2; exit 1; }
done
# Argo CD 3.6 needs Go 1.27: its wrapper names the toolchain, which the go command fetches
# from the module proxy (the installed Go may be older, and GOTOOLCHAIN=local here).
argocd_go=$(toolchain "$here/argocd-health/go.mod")
argocd_go=${argocd_go:-$(go env GOVERSION)}
kstatus_go=$(toolchain "$here/kstatus/go.mod")
kstatus_go=${kstatus_go:-$(go env GOVERSION)}
# The commands are ours as much as the peers': an edit of main.go (or go.sum) is a new key.
sources=$(cd "$here" && cat argocd-health/go.mod argocd-health/go.sum argocd-health/*.go \
  kstatus/go.mod kstatus/go.sum kstatus/*.go | sha256sum | cut -c1-12)
key="argocd-${argocd_version}_${argocd_go}_cli-utils-${cliutils_version}_${kstatus_go}_${sources}"
bin="$cache_root/peers/$key/bin"
# One build of a key at a time: both test processes of `make test` and CI's background build
# may ask at once; a second caller waits here for the first, then finds the binaries.
exec 8>&-
mkdir -p "$(dirname "$bin")"
exec 9>"$(dirname "$bin").lock"
flock 9

want=(argocd-health kstatus)
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
# Build into a scratch copy so a read-only or shared checkout is never written to.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/argocd-health" "$here/kstatus" "$work/"

started=$(date +%s)
for b in "${missing[@]}"; do
  echo "building $b ..." >&2
  case "$b" in
    argocd-health) go_toolchain=$argocd_go ;;
    kstatus) go_toolchain=$kstatus_go ;;
  esac
  (cd "$work/$b" && GOTOOLCHAIN=$go_toolchain go build -trimpath -ldflags "-s -w" -o "$bin/.$b.tmp" .)
  mv "$bin/.$b.tmp" "$bin/$b"
done
echo "built ${missing[*]} in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
