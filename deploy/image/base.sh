#!/usr/bin/env bash
# A Debian bookworm base image with Python 3.11, made from Debian's packages with
# debootstrap and committed with buildah: what the Dockerfile's PYTHON_IMAGE points at
# where no registry image (python:3.11-slim-bookworm) can be pulled.
#
#   deploy/image/base.sh IMAGE [MIRROR]
#
# It holds what the Dockerfile expects of python:3.11-slim: `python` (3.11) with venv,
# groupadd/useradd (passwd), CA certificates, apt (the builder stage installs its build
# tools), and the security updates of the day. apt's caches, package lists, manual pages
# and translations are left out, as in Debian's slim images. Run as root.
set -euo pipefail

image=${1:?usage: base.sh IMAGE [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
security=${mirror%/debian}/debian-security
packages=python3,python3-venv,python-is-python3,passwd,ca-certificates,netbase

work=$(mktemp -d /var/tmp/fairq-base.XXXXXX)
container=
cleanup() {
    # The chroot's /proc is mounted while its packages are upgraded; never delete through it.
    umount "$work/rootfs/proc" 2>/dev/null || true
    [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

echo "base.sh: debootstrap bookworm (minbase + $packages) from $mirror"
debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }

root=$work/rootfs
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
echo "base.sh: the updates and security updates of the day"
mount -t proc proc "$root/proc"
chroot "$root" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q' \
    >"$work/upgrade.log" 2>&1 || { tail -20 "$work/upgrade.log"; exit 1; }
chroot "$root" apt-get clean
umount "$root/proc"

# As Debian's slim images: no package lists, caches, manuals or translations; an empty
# /dev (the runtime mounts its own).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/dev/* "$root"/tmp/* "$root"/root/.[!.]* 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete

tar --numeric-owner --xattrs -C "$root" -cf "$work/rootfs.tar" .
container=$(buildah from scratch)
buildah add "$container" "$work/rootfs.tar" / >/dev/null
buildah config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.description="Debian bookworm (debootstrap) with Python 3.11" \
    "$container"
buildah commit --quiet --rm "$container" "$image" >/dev/null
container=
echo "base.sh: $image ($(chroot "$root" python3 --version))"
