# syntax=docker/dockerfile:1
# One image for every fairq component; the command picks which:
#   docker run fairq api --host 0.0.0.0 --port 8000   (the default)
#   docker run fairq dispatcher | worker | batch-worker | sim --model NAME
# Where no registry image can be pulled, deploy/image/build.sh (make image) points this at
# a Debian bookworm base made with debootstrap (deploy/image/base.sh).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Builder: a virtual environment with fairq and its dependencies, built from a wheel.
# Build tools live only here (a dependency without a wheel for the platform compiles).
FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fairq
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY gateway ./gateway
COPY batch ./batch
COPY dispatcher ./dispatcher
COPY scaler ./scaler
COPY sim ./sim
COPY workers ./workers
COPY fairq ./fairq
COPY benchmarks ./benchmarks
# A wheel, not an editable install: the image carries no source tree, and a file
# missing from the package data (Lua scripts, simulator profiles) fails here.
# Behind a private index or a TLS-intercepting proxy, pass pip's settings and CA bundle
# as build secrets, `--secret id=pip-conf,src=pip.conf --secret id=pip-ca,src=ca.pem`
# (deploy/image/build.sh does): mounted for this step only, they reach no layer.
RUN --mount=type=secret,id=pip-conf --mount=type=secret,id=pip-ca \
    { [ ! -f /run/secrets/pip-conf ] || export PIP_CONFIG_FILE=/run/secrets/pip-conf; } \
    && { [ ! -f /run/secrets/pip-ca ] || export PIP_CERT=/run/secrets/pip-ca; } \
    && /opt/fairq/bin/pip install --upgrade pip \
    && /opt/fairq/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/fairq/bin/pip install /wheels/fairq-*.whl \
    && /opt/fairq/bin/fairq --help > /dev/null \
    && /opt/fairq/bin/pip uninstall --yes --quiet pip setuptools

# Final: the same Python, the virtual environment, an unprivileged user; no compiler,
# no pip (uninstalled above: nothing installs at run time), no source.
FROM ${PYTHON_IMAGE} AS final
ENV PATH=/opt/fairq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 fairq \
    && useradd --system --uid 10001 --gid fairq --no-create-home --shell /usr/sbin/nologin fairq
COPY --from=builder /opt/fairq /opt/fairq
WORKDIR /tmp
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["fairq"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
