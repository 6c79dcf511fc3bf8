#!/usr/bin/env bash
# Build the Dockerfile with buildah (no Docker daemon): `make image` runs this.
#
#   deploy/image/build.sh            # builds fairq:0.1.0 (buildah names it localhost/fairq:0.1.0)
#
# Environment (all optional):
#   IMAGE         the tag to build                      (fairq:0.1.0, the manifests' name)
#   PYTHON_IMAGE  the base to build on, pulled if absent (docker.io/library/python:3.11-slim-bookworm)
#   DEBIAN_BASE   the base made with debootstrap (deploy/image/base.sh) when PYTHON_IMAGE
#                 can be neither found nor pulled   (localhost/fairq-base:bookworm, kept and reused)
#   MIRROR        the Debian mirror for that base    (http://deb.debian.org/debian)
#
# buildah, and debootstrap when the base must be made, are installed with apt-get when
# missing (as root; said first). The build stage's `pip install` gets this machine's
# package index settings and CA bundle as build secrets (deploy/image/pipconf.py): they
# reach no layer of the image.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-fairq:0.1.0}
PYTHON_IMAGE=${PYTHON_IMAGE:-docker.io/library/python:3.11-slim-bookworm}
DEBIAN_BASE=${DEBIAN_BASE:-localhost/fairq-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
# chroot isolation runs the build's RUN steps without an OCI runtime or a network
# namespace of their own: it works in VMs and containers alike.
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

# Debian's package for each command this script needs.
need() {
    local command=$1 package=$2 why=$3
    command -v "$command" >/dev/null 2>&1 && return
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "build.sh: $command is missing ($why): install Debian's $package, as root" >&2
        exit 1
    fi
    echo "build.sh: installing Debian's $package (apt-get, as root): $why"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null
}

exists() { buildah images --quiet "$1" >/dev/null 2>&1; }

need buildah buildah "it builds the Dockerfile without a Docker daemon"
start=$(date +%s)

if exists "$PYTHON_IMAGE" || timeout 120 buildah pull --quiet "$PYTHON_IMAGE" >/dev/null; then
    base=$PYTHON_IMAGE
else
    echo "build.sh: $PYTHON_IMAGE cannot be pulled: building on a Debian base made with debootstrap"
    if ! exists "$DEBIAN_BASE"; then
        need debootstrap debootstrap "it makes the Debian base from Debian's packages"
        deploy/image/base.sh "$DEBIAN_BASE" "$MIRROR"
        echo "build.sh: base made in $(($(date +%s) - start)) s"
    fi
    base=$DEBIAN_BASE
fi

secrets=$(mktemp -d)
trap 'rm -rf "$secrets"' EXIT
ca=$("$PYTHON" deploy/image/pipconf.py "$secrets/pip.conf")
args=(--secret "id=pip-conf,src=$secrets/pip.conf")
[ -z "$ca" ] || args+=(--secret "id=pip-ca,src=$ca")

echo "build.sh: buildah build -t $IMAGE on $base"
buildah build --layers --build-arg PYTHON_IMAGE="$base" "${args[@]}" -t "$IMAGE" .

size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -1)
echo "build.sh: built $IMAGE on $base in $(($(date +%s) - start)) s; $size"
