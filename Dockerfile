# syntax=docker/dockerfile:1
# The nlagg image: nodes, the eavesdropper and the launcher of a docker-compose testbed.
# Multi-arch (every dependency ships amd64 and arm64 wheels; nothing is compiled):
#   docker buildx build --platform linux/amd64,linux/arm64 -t nlagg:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY nlagg_node ./nlagg_node
COPY adversary ./adversary
RUN pip install --only-binary=:all: . \
    && rm -rf /src \
    && useradd --system --uid 10001 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin nlagg \
    && mkdir -p /plan /transcript \
    && chown nlagg:nlagg /transcript

USER nlagg
WORKDIR /plan
VOLUME ["/transcript"]
CMD ["nlagg", "--help"]
