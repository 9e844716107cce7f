#!/usr/bin/env bash
# Builds the real node (devtools/agentrun_devtools/realnode.py): containerd, its runc shim,
# ctr, crictl, the CNI plugins bridge/host-local/loopback/portmap, kubelet, kube-proxy,
# CoreDNS and a static pause binary, from the Go module proxy at the versions pinned in the
# wrapper modules beside this script, and installs what comes from Debian (runc, iptables,
# conntrack, buildah, busybox-static, socat). The binaries are cached outside the checkout,
# keyed by those versions and the Go version. Prints the bin directory on its last line,
# like devtools/controlplane/build.sh.
#
#   devtools/realnode/build.sh            # build if missing, print the bin directory
#   AGENTRUN_CACHE=/somewhere build.sh    # choose the cache root (default ~/.cache/agentrun)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# The version a wrapper's go.mod requires, whether in a require block or on one line.
required() {
  awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$2"
}
k8s_version=$(required k8s.io/kubernetes "$here/kubernetes/go.mod")
containerd_version=$(required github.com/containerd/containerd/v2 "$here/containerd/go.mod")
crictl_version=$(required sigs.k8s.io/cri-tools "$here/critools/go.mod")
cni_version=$(required github.com/containernetworking/plugins "$here/cni/go.mod")
coredns_version=$(required github.com/coredns/coredns "$here/coredns/go.mod")
for v in "$k8s_version" "$containerd_version" "$crictl_version" "$cni_version" "$coredns_version"; do
  [[ $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read the pinned versions (got '$v')" >&2; exit 1; }
done

# Debian's part. runc: `go install` of runc is refused (replace directives in its go.mod),
# and Debian's 1.1.5 runs pods here. buildah packages the pause binary and test images.
debian=(runc iptables conntrack buildah busybox-static socat gcc libc6-dev)
absent=()
for p in "${debian[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || absent+=("$p")
done
if [ ${#absent[@]} -gt 0 ]; then
  echo "installing from Debian: ${absent[*]} ..." >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${absent[@]}" >&2
fi

go_version=$(go env GOVERSION)
key="k8s-${k8s_version}_containerd-${containerd_version}_crictl-${crictl_version}_cni-${cni_version}_coredns-${coredns_version}_${go_version}"
cache_root=${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}
bin="$cache_root/realnode/$key/bin"
# One build of a key at a time: both test processes of `make test` and CI's background build
# may ask at once; a second caller waits here for the first, then finds the binaries.
mkdir -p "$(dirname "$bin")"
exec 9>"$(dirname "$bin").lock"
flock 9

want=(containerd containerd-shim-runc-v2 ctr crictl bridge host-local loopback portmap
      kubelet kube-proxy coredns pause)
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
cp -r "$here/kubernetes" "$here/containerd" "$here/critools" "$here/cni" "$here/coredns" "$work/"

minor=${k8s_version#v1.}; minor=${minor%%.*}
# The control plane's stamps: without them kubelet reports v0.0.0-master to the API server.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp="$stamp -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp="$stamp -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
containerd_stamp="-X github.com/containerd/containerd/v2/version.Version=$containerd_version"
containerd_stamp="$containerd_stamp -X github.com/containerd/containerd/v2/version.Revision=module"

build() {  # build WRAPPER OUTPUT PACKAGE [go build flags...]
  local wrapper=$1 out=$2 pkg=$3
  shift 3
  (cd "$work/$wrapper" && go build -trimpath "$@" -o "$bin/.$out.tmp" "$pkg")
  mv "$bin/.$out.tmp" "$bin/$out"
}

started=$(date +%s)
for b in "${missing[@]}"; do
  echo "building $b ..." >&2
  case "$b" in
    # containerd itself keeps cgo (as its releases do); the rest is static Go.
    containerd)
      CGO_ENABLED=1 build containerd "$b" github.com/containerd/containerd/v2/cmd/containerd \
        -ldflags "-s -w $containerd_stamp" ;;
    containerd-shim-runc-v2|ctr)
      CGO_ENABLED=0 build containerd "$b" "github.com/containerd/containerd/v2/cmd/$b" \
        -ldflags "-s -w $containerd_stamp" ;;
    crictl)
      CGO_ENABLED=0 build critools "$b" sigs.k8s.io/cri-tools/cmd/crictl \
        -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" ;;
    bridge|loopback)
      CGO_ENABLED=0 build cni "$b" "github.com/containernetworking/plugins/plugins/main/$b" -ldflags "-s -w" ;;
    host-local)
      CGO_ENABLED=0 build cni "$b" "github.com/containernetworking/plugins/plugins/ipam/$b" -ldflags "-s -w" ;;
    portmap)
      CGO_ENABLED=0 build cni "$b" "github.com/containernetworking/plugins/plugins/meta/$b" -ldflags "-s -w" ;;
    kubelet|kube-proxy)
      CGO_ENABLED=0 build kubernetes "$b" "k8s.io/kubernetes/cmd/$b" -ldflags "-s -w $stamp" ;;
    coredns)
      CGO_ENABLED=0 build coredns "$b" github.com/coredns/coredns -ldflags "-s -w" ;;
    pause)
      # No pause image can be pulled here: Kubernetes' own pause.c, linked statically so
      # that it runs in an image holding nothing else.
      src=$(cd "$work/kubernetes" && go mod download -json k8s.io/kubernetes | awk -F'"' '$2=="Dir" {print $4}')
      gcc -static -Os -Wall -Werror -DVERSION="${k8s_version}-agentrun" \
        -o "$bin/.pause.tmp" "$src/build/pause/linux/pause.c"
      strip "$bin/.pause.tmp"
      mv "$bin/.pause.tmp" "$bin/pause" ;;
  esac
done
echo "built ${missing[*]} in $(( $(date +%s) - started ))s into $bin" >&2
echo "$bin"
