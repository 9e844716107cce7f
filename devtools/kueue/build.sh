#!/usr/bin/env bash
# Builds Kueue's controller manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy
# at the version pinned in the wrapper module beside this script, and copies the module's
# own manifests the development cluster installs (config/components/crd and
# config/components/webhook) beside it. Cached outside the checkout, keyed by that version,
# the Go toolchain and the wrapper's go.mod/go.sum; one build of a key at a time (a lock),
# nothing built when cached. Prints the bin directory on its last line, like
# devtools/controlplane/build.sh; the manifests are in ../config from there.
#
#   devtools/kueue/build.sh               # build if missing, print the bin directory
#   AGENTRUN_CACHE=/somewhere build.sh    # choose the cache root (default ~/.cache/agentrun)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The version a wrapper's go.mod requires, whether in a require block or on one line.
required() {
  awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$2"
}
version=$(required sigs.k8s.io/kueue "$here/go.mod")
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read the pinned Kueue version (got '$version')" >&2; exit 1; }
# Kueue v0.17 needs Go 1.25: the installed Go builds it (no toolchain to fetch).
go_version=$(go env GOVERSION)
sources=$(cd "$here" && cat go.mod go.sum | sha256sum | cut -c1-12)
cache_root=${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}
root="$cache_root/kueue/kueue-${version}_${go_version}_${sources}"
bin="$root/bin"
# Both test processes of `make test` and CI's background build may ask at once; a second
# caller waits here for the first, then finds the binary.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9

if [ -x "$bin/kueue" ] && [ -f "$root/config/.complete" ]; then
  echo "$bin"
  exit 0
fi

export CGO_ENABLED=0
# Build into a scratch copy so a read-only or shared checkout is never written to.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/go.mod" "$here/go.sum" "$work/"

started=$(date +%s)
mkdir -p "$bin"
if [ ! -x "$bin/kueue" ]; then
  echo "building kueue $version ..." >&2
  stamp="-X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
  (cd "$work" && go build -trimpath -ldflags "-s -w $stamp" -o "$bin/.kueue.tmp" \
    sigs.k8s.io/kueue/cmd/kueue)
  mv "$bin/.kueue.tmp" "$bin/kueue"
fi

# The module's own manifests, from the module cache the build just filled (verified
# against go.sum like every other download).
module_dir=$(cd "$work" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
[ -d "$module_dir/config/components/crd/bases" ] || { echo "no manifests in $module_dir" >&2; exit 1; }
rm -rf "$root/config"
mkdir -p "$root/config"
cp -r "$module_dir/config/components/crd" "$module_dir/config/components/webhook" "$root/config/"
chmod -R u+w "$root/config"
touch "$root/config/.complete"
echo "built kueue $version in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
