# QPR images: the qpr CLI, the pipeline (dvc.yaml, flows/, src/) and the search service.
#
#   runtime      (default, last stage) CPU: PyTorch's CPU build + faiss-cpu
#   runtime-gpu  CUDA: PyTorch's CUDA build + faiss-gpu; run it with the NVIDIA runtime
#
# Both are Debian bookworm with its python3 (3.11, what requirements.lock was resolved
# for) and a venv built in a separate stage, so pip caches and build files stay out.
#
#   docker build -t qpr:cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#   docker build -t qpr:gpu --target runtime-gpu .
#
# Without TORCH_INDEX_URL (or local wheels, FIND_LINKS) pip resolves torch==2.13.0 to the
# multi-GB CUDA build even for the CPU image; the hashed lock then stops the build (the CUDA
# build's nvidia-* wheels are not in it). Registry-less builds with podman/buildah on a
# debootstrap base, local wheels and the host's CA bundle: `make docker-build` (README).
#
# The base is pinned by digest, so a rebuild starts from the same bytes until the pin is
# moved on purpose. The digest is the multi-platform index of debian:bookworm-20260918-slim
# (what bookworm-slim pointed at from 18 Sep 2026), as docker-library/repo-info records it
# in repos/debian/remote/bookworm-20260918-slim.md. To move it: `docker buildx imagetools
# inspect debian:bookworm-slim` and paste the new index digest. docker/build.sh without
# Docker passes its own debootstrap base (BASE_IMAGE=localhost/debian:bookworm).
ARG BASE_IMAGE=debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

# ---------------------------------------------------------------- venv builders
FROM ${BASE_IMAGE} AS builder-base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.11.* python3-venv=3.11.* \
       ca-certificates=202* \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
# Dependencies first, the project's code last: a code change rebuilds one small layer.
COPY requirements.lock ./
COPY docker/pip-install.sh docker/

FROM builder-base AS builder
# Where pip finds wheels besides PyPI: PyTorch's CPU wheel index (TORCH_INDEX_URL) and/or
# a folder of wheels mounted into the build (FIND_LINKS, e.g. -v /opt/wheels:/wheels:ro).
# PIP_CERT: a CA bundle to verify the index with (-v /etc/ssl/certs:/host-certs:ro).
ARG TORCH_INDEX_URL=""
ARG FIND_LINKS=""
ARG PIP_CERT=""
# 1: also install the `transformer` extra (to train model.encoder=transformer in the image)
ARG WITH_TRANSFORMER=0
RUN TORCH_INDEX_URL="${TORCH_INDEX_URL}" FIND_LINKS="${FIND_LINKS}" PIP_CERT="${PIP_CERT}" \
    WITH_TRANSFORMER="${WITH_TRANSFORMER}" FAISS=faiss-cpu bash docker/pip-install.sh /opt/venv
COPY pyproject.toml README.md ./
COPY src ./src
COPY flows ./flows
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-compile . \
    && /opt/venv/bin/qpr --help > /dev/null

# The same lock with PyTorch's CUDA build (PyPI's default torch for Linux x86_64; its
# nvidia-* runtime wheels come along, so no CUDA base image is needed, only a host with
# the NVIDIA driver) and faiss-gpu instead of faiss-cpu (one module: never both).
FROM builder-base AS builder-gpu
ARG GPU_TORCH_INDEX_URL=""
ARG PIP_CERT=""
RUN TORCH_INDEX_URL="${GPU_TORCH_INDEX_URL}" PIP_CERT="${PIP_CERT}" \
    FAISS=faiss-gpu bash docker/pip-install.sh /opt/venv
COPY pyproject.toml README.md ./
COPY src ./src
COPY flows ./flows
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-compile .

# ---------------------------------------------------------------- runtime images
FROM ${BASE_IMAGE} AS runtime-base
# git: DVC needs a repository to run the pipeline; python3: the venv's interpreter.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.11.* git=1:2.39.* \
       ca-certificates=202* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 qpr
# NUMBA_CACHE_DIR: the compiled BM25 kernels (qpr.retrieval.maxscore) are cached where the
# unprivileged user can write (the venv is root's).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    GIT_AUTHOR_NAME=qpr GIT_AUTHOR_EMAIL=qpr@localhost \
    GIT_COMMITTER_NAME=qpr GIT_COMMITTER_EMAIL=qpr@localhost
WORKDIR /app
# The project as `dvc repro` needs it (stage deps name files in src/ and flows/). data/ is
# generated (qpr data ensure) or mounted; outputs and tracking state are written here.
COPY --chown=qpr:qpr dvc.yaml params.yaml data.dvc .gitignore .dvcignore ./
COPY --chown=qpr:qpr .dvc/config .dvc/.gitignore ./.dvc/
COPY --chown=qpr:qpr flows ./flows
COPY --chown=qpr:qpr src ./src
COPY --chown=qpr:qpr docker/smoke.sh ./docker/
RUN mkdir -p models && chown qpr:qpr /app models
EXPOSE 8000
ENTRYPOINT ["qpr"]
CMD ["--help"]

FROM runtime-base AS runtime-gpu
COPY --from=builder-gpu /opt/venv /opt/venv
# What the NVIDIA container runtime reads to mount the driver into the container.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001

FROM runtime-base AS runtime
COPY --from=builder /opt/venv /opt/venv
USER 10001
