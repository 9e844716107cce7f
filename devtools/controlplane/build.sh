#!/usr/bin/env bash
# Builds the test/development control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, helm) from the Go module proxy at the versions pinned in the
# wrapper modules beside this script, and caches the binaries outside the checkout, keyed
# by those versions. Prints the directory holding the binaries on its last line.
#
#   devtools/controlplane/build.sh            # build if missing, print the bin directory
#   AGENTRUN_CACHE=/somewhere build.sh        # choose the cache root (default ~/.cache/agentrun)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The version a wrapper's go.mod requires, whether in a require block or on one line.
required() {
  awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$2"
}
k8s_version=$(required k8s.io/kubernetes "$here/kubernetes/go.mod")
etcd_version=$(required go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")
helm_version=$(required helm.sh/helm/v3 "$here/helm/go.mod")
for v in "$k8s_version" "$etcd_version" "$helm_version"; do
  [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read the pinned versions (got '$v')" >&2; exit 1; }
done
go_version=$(go env GOVERSION)
key="k8s-${k8s_version}_etcd-${etcd_version}_helm-${helm_version}_${go_version}"
cache_root=${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}
bin="$cache_root/controlplane/$key/bin"
# One build of a key at a time: both test processes of `make test` and CI's background build
# may ask at once; a second caller waits here for the first, then finds the binaries.
mkdir -p "$(dirname "$bin")"
exec 9>"$(dirname "$bin").lock"
flock 9

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
export CGO_ENABLED=0
# Build into a scratch copy so a read-only or shared checkout is never written to.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/kubernetes" "$here/etcd" "$here/helm" "$work/"

minor=${k8s_version#v1.}; minor=${minor%%.*}
# Without these stamps /version reports v0.0.0-master, which clients refuse to talk to.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp="$stamp -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp="$stamp -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

started=$(date +%s)
for b in "${missing[@]}"; do
  echo "building $b ..." >&2
  case "$b" in
    etcd) (cd "$work/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/.$b.tmp" go.etcd.io/etcd/server/v3) ;;
    helm) (cd "$work/helm" && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" -o "$bin/.$b.tmp" helm.sh/helm/v3/cmd/helm) ;;
    *) (cd "$work/kubernetes" && go build -trimpath -ldflags "-s -w $stamp" -o "$bin/.$b.tmp" "k8s.io/kubernetes/cmd/$b") ;;
  esac
  mv "$bin/.$b.tmp" "$bin/$b"
done
echo "built ${missing[*]} in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
