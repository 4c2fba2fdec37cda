#!/usr/bin/env bash
# Build the QPR image with whatever engine this machine has (make docker-build).
#
#   docker/build.sh [cpu|gpu]      → image qpr:cpu (target runtime) or qpr:gpu (runtime-gpu)
#
# With Docker: a plain `docker build` from the default base (debian:bookworm-slim), torch
# from PyTorch's CPU index. Without Docker (podman/buildah, no image registry reachable):
# the base image is made once with debootstrap (localhost/debian:bookworm), the build runs
# with `buildah bud --isolation chroot`, the host CA bundle is mounted for pip, and a local
# wheel folder (QPR_WHEELS, default /opt/wheels) is used as find-links when present.
# Environment: BASE_IMAGE, TORCH_INDEX_URL, QPR_WHEELS, IMAGE (name prefix, default qpr).
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:-cpu}
case "$variant" in
  cpu) target=runtime ;;
  gpu) target=runtime-gpu ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
image=${IMAGE:-qpr}:$variant
cpu_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
wheels=${QPR_WHEELS:-/opt/wheels}
start=$(date +%s)

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  args=(--target "$target" -t "$image")
  [[ -n "${BASE_IMAGE:-}" ]] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  [[ "$variant" == cpu ]] && args+=(--build-arg "TORCH_INDEX_URL=$cpu_index")
  docker build "${args[@]}" .
  size=$(docker image inspect "$image" --format '{{.Size}}')
else
  for tool in buildah podman; do
    command -v "$tool" >/dev/null || {
      echo "neither docker nor $tool found: apt-get install podman buildah debootstrap runc" >&2
      exit 1
    }
  done
  base=${BASE_IMAGE:-localhost/debian:bookworm}
  if [[ "$base" == localhost/debian:bookworm ]] && ! podman image exists "$base"; then
    command -v debootstrap >/dev/null || { echo "apt-get install debootstrap" >&2; exit 1; }
    rootfs=$(mktemp -d)/rootfs
    echo "making $base with debootstrap (no image registry needed) ..."
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    tar -C "$rootfs" -c . | podman import - "$base"
    rm -rf "$(dirname "$rootfs")"
  fi
  args=(--isolation chroot --layers --target "$target" -t "localhost/$image"
        --build-arg "BASE_IMAGE=$base")
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    args+=(-v /etc/ssl/certs:/host-certs:ro
           --build-arg PIP_CERT=/host-certs/ca-certificates.crt)
  fi
  if [[ "$variant" == cpu ]]; then
    if compgen -G "$wheels/torch-*.whl" >/dev/null; then
      args+=(-v "$wheels:/wheels:ro" --build-arg FIND_LINKS=/wheels)
    else
      args+=(--build-arg "TORCH_INDEX_URL=$cpu_index")
    fi
  fi
  buildah bud "${args[@]}" .
  size=$(podman image inspect "localhost/$image" --format '{{.Size}}')
fi
echo "built $image (target $target) in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB"
