# The nlagg image: nodes, the eavesdropper and the launcher of a docker-compose testbed.
# Build it with scripts/image, which makes the wheelhouse this file installs from (offline, no pip
# index and no network in the build) and passes it in a temporary build context:
#   scripts/image                                                     # FROM python:3.11-slim
#   scripts/base-image && scripts/image --base localhost/nlagg-base   # no registry (deploy/README.md)
# Build context (made by scripts/image): wheels/ (every dependency), app/ (the nlagg wheel),
# ca/ (extra CA certificates the host trusts; may be empty).
ARG BASE=python:3.11-slim
FROM ${BASE} AS base

ENV LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    PATH=/opt/nlagg/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Certificates first: a TLS-intercepting proxy's CA must be trusted by anything in the image that
# makes TLS connections.
COPY ca/ /usr/local/share/ca-certificates/
RUN if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then update-ca-certificates >/dev/null; fi

# The dependencies, installed in a stage of their own so the wheelhouse never becomes a layer of the
# image; they change rarely, so this stage and its copy below are reused when only nlagg changes.
FROM base AS deps
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/nlagg \
    && /opt/nlagg/bin/pip install --no-index --find-links /tmp/wheels /tmp/wheels/*.whl

FROM base
COPY --from=deps /opt/nlagg /opt/nlagg
COPY app/ /tmp/app/
RUN /opt/nlagg/bin/pip install --no-index --no-deps /tmp/app/*.whl \
    && rm -rf /tmp/app \
    && nlagg --help >/dev/null \
    && groupadd --system --gid 10001 nlagg \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin nlagg \
    && mkdir -p /plan /transcript /state \
    && chown nlagg:nlagg /plan /transcript /state \
    && chmod 1777 /transcript /state

# The compose file may run the services as another uid (NLAGG_UID, the owner of the plan's files):
# the volume mount points are world-writable (sticky) and every cache lives under /tmp for that
# reason. /transcript (the eavesdropper's) and /state (a node's checkpoint) are named volumes there.
USER 10001:10001
WORKDIR /plan
CMD ["nlagg", "--help"]
