#!/usr/bin/env bash
# Find or build a CRIU that works on this kernel (>= 4.1) and print the binary's path.
#
# Debian 12's criu 3.17 fails on recent kernels (vDSO `vvar_vclock`), so CRIU is built once from
# Debian trixie's source package into a cache outside the repository:
#   ${GPUBUDGET_CACHE:-$HOME/.cache/jupyter-gpubudget}/criu-<series>-<patch set>/tree/criu/criu
# A stamp file holds the checksum of this script and of the patches in criu-patches/ (applied to
# the source before building): the build is reused until either changes.
# Source lookups use a private apt state directory, so the machine's own apt lists are untouched.
# Build dependencies are installed with apt-get (waiting up to 15 min for the dpkg lock).
set -euo pipefail

VERSION=4.1  # trixie's criu (4.1.1 when this was written); the cache is per series and patch set
CACHE=${GPUBUDGET_CACHE:-$HOME/.cache/jupyter-gpubudget}
HERE=$(cd "$(dirname "$0")" && pwd)
# the stamp: this script and the patches applied to CRIU's source; builds of other patch sets
# (other checkouts on the same machine) live side by side
SELF_SUM=$(cat "$0" "$HERE"/criu-patches/*.patch | sha256sum | cut -d' ' -f1)
DIR=$CACHE/criu-$VERSION-${SELF_SUM:0:12}
SRC=$DIR/tree
BIN=$SRC/criu/criu
STAMP=$DIR/.built
log() { echo "build-criu: $*" >&2; }

version_ok() {  # a criu binary that runs and says >= 4.1
    local v
    v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -1) || return 1
    [ -n "$v" ] || return 1
    [ "$(printf '%s\n4.1\n' "$v" | sort -V | head -1)" = "4.1" ]
}

# 1. an explicitly chosen binary
if [ -n "${GPUBUDGET_CRIU:-}" ]; then
    version_ok "$GPUBUDGET_CRIU" || { log "GPUBUDGET_CRIU=$GPUBUDGET_CRIU is not a CRIU >= 4.1"; exit 1; }
    echo "$GPUBUDGET_CRIU"; exit 0
fi
# 2. the cached build
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SELF_SUM" ] && version_ok "$BIN"; then
    echo "$BIN"; exit 0
fi
# 3. a system CRIU that is new enough
if command -v criu >/dev/null && version_ok "$(command -v criu)"; then
    command -v criu; exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/criu.lock"
flock 9   # another worktree may be building the same cache right now
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SELF_SUM" ] && version_ok "$BIN"; then
    echo "$BIN"; exit 0
fi

DEPS="build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev
libnftables-dev libaio-dev uuid-dev iproute2 nftables xz-utils"
missing=()
for p in $DEPS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing build dependencies: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${missing[@]}" >&2
fi

# the machine's own Debian mirror (deb822 or one-line sources)
MIRROR=$(sed -n 's/^URIs: *\(\S*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
         | head -1)
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list ]; then
    MIRROR=$(sed -n 's/^deb \(\[[^]]*\] \)\?\(\S*debian\)\/\? .*/\2/p' /etc/apt/sources.list | head -1)
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}

rm -rf "$DIR"
mkdir -p "$DIR/apt/lists/partial" "$DIR/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" \
    > "$DIR/apt/sources.list"
APT=(apt-get -o "Dir::Etc::SourceList=$DIR/apt/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
     -o "Dir::State::Lists=$DIR/apt/lists" -o "Dir::Cache=$DIR/apt/cache" -o "APT::Sandbox::User=root")
mkdir -p "$DIR/apt/cache/archives/partial"
log "fetching criu $VERSION source from $MIRROR (trixie)"
"${APT[@]}" update -qq >&2
# only the .orig tarball is needed (the .dsc may 404 on some mirrors: tolerate that)
(cd "$DIR/src" && "${APT[@]}" source --download-only criu >&2) || true
TARBALL=$(ls "$DIR"/src/criu_*.orig.tar.* 2>/dev/null | head -1)
[ -n "$TARBALL" ] || { log "could not download criu's .orig tarball from trixie"; exit 1; }
mkdir -p "$SRC"
tar -xf "$TARBALL" -C "$SRC" --strip-components=1
for p in "$HERE"/criu-patches/*.patch; do
    log "applying $(basename "$p")"
    patch -d "$SRC" -p1 --quiet < "$p" >&2
done
log "building criu $VERSION (a minute on 2 cores)"
make -C "$SRC" -j"$(nproc)" criu >"$DIR/build.log" 2>&1 \
    || { tail -30 "$DIR/build.log" >&2; log "build failed: $DIR/build.log"; exit 1; }
version_ok "$BIN" || { log "built $BIN does not run"; exit 1; }
echo "$SELF_SUM" > "$STAMP"
echo "$BIN"
