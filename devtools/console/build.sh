#!/usr/bin/env bash
# Builds the console's pages (kubectl-plugin/console: TypeScript and Preact, bundled by
# Vite) into kubectl-plugin/agentrun_kubectl/console/static, which the Python package
# ships. Cached outside the checkout, as the other builds are: the npm packages keyed by
# package-lock.json, the built pages keyed by the lock and every source file, so a warm
# machine copies the pages and runs no npm at all.
#
#   devtools/console/build.sh            # build if not cached, then copy into the package
#   AGENTRUN_CACHE=/somewhere build.sh   # the cache root (default ~/.cache/agentrun)
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
src="$here/kubectl-plugin/console"
out="$here/kubectl-plugin/agentrun_kubectl/console/static"

command -v npm >/dev/null || {
  echo "make console needs Node.js (>= 20.19) and npm: the console's pages are built with them" >&2
  exit 1
}

# What the pages are made of: the lock (every package, exactly), the build's settings and
# every source file; names and bytes.
sources=(package.json package-lock.json vite.config.ts tsconfig.json index.html)
mapfile -t files < <(cd "$src" && { printf '%s\n' "${sources[@]}"; find src -type f; } | LC_ALL=C sort)
key=$(cd "$src" && for f in "${files[@]}"; do printf '%s\0' "$f"; cat "$f"; done | sha256sum | cut -c1-16)
modules_key=$( { node --version; sha256sum <"$src/package-lock.json"; } | sha256sum | cut -c1-16)
cache_root=${AGENTRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}
cache="$cache_root/console"
built="$cache/pages-$key"
work="$cache/work-$modules_key"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

if [ ! -f "$built/.complete" ]; then
  started=$(date +%s)
  if [ ! -f "$work/.installed" ]; then
    rm -rf "$work" && mkdir -p "$work"
    cp "$src/package.json" "$src/package-lock.json" "$work/"
    # Exactly the lock's packages; no audit or funding calls.
    (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
    touch "$work/.installed"
  fi
  rm -rf "$work/src" && cp -r "$src/src" "$work/src"
  cp "$src/package.json" "$src/vite.config.ts" "$src/tsconfig.json" "$src/index.html" "$work/"
  rm -rf "$built"
  (cd "$work" && CONSOLE_OUT_DIR="$built" npm run --silent build)
  touch "$built/.complete"
  echo "console pages built in $(( $(date +%s) - started ))s ($built)" >&2
fi

rm -rf "$out"
mkdir -p "$out"
cp -r "$built/." "$out/"
rm -f "$out/.complete"
echo "$out"
