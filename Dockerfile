# QPR image: the qpr CLI and the pipeline code on a slim Python 3.11 base.
# Build:  docker build -t qpr .            (or podman/buildah; see README "Docker")
# CPU PyTorch: pass --build-arg PIP_EXTRA_INDEX_URL=<PyTorch's CPU wheel index>, otherwise
# pip resolves torch==2.13.0 to the (much larger) CUDA build.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
WORKDIR /build
RUN python3 -m venv /opt/venv
COPY requirements.lock ./
RUN /opt/venv/bin/pip install -r requirements.lock
COPY pyproject.toml README.md ./
COPY src ./src
COPY flows ./flows
RUN /opt/venv/bin/pip install --no-deps .

FROM ${BASE_IMAGE} AS runtime
# git: DVC needs a repository to run the pipeline inside the container.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git=1:2.39.* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 qpr
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
COPY --chown=qpr:qpr dvc.yaml params.yaml data.dvc ./
COPY --chown=qpr:qpr .dvc/config ./.dvc/config
COPY --chown=qpr:qpr flows ./flows
COPY --chown=qpr:qpr src ./src
USER 10001
ENTRYPOINT ["qpr"]
CMD ["--help"]
