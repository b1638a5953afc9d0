# One image for every loopwire service; the command picks the service:
#   docker run loopwire serve committer | serve model-step | serve tool calculator | <any CLI command>
# Configuration is by environment only (LW_*; see README.md).
#
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module. The default is the
# official slim image; where no image registry is reachable, deploy/images/build-base.sh makes
# loopwire-base:bookworm from Debian's archive (docker build --build-arg BASE_IMAGE=loopwire-base:bookworm).
ARG BASE_IMAGE=python:3.11-slim

# Stage 1: everything installed into a venv (a venv, not the system site: Debian's python3 refuses
# system-wide pip installs), built from the sources only.
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY loopwire ./loopwire
# mcp-server-time: the MCP server compose's mcp-time bridge starts.
# Non-editable install, then byte-compiled once here (the runtime's user cannot write the venv).
RUN python3 -m venv /opt/loopwire \
 && /opt/loopwire/bin/pip install . "mcp-server-time==2026.10.19" \
 && /opt/loopwire/bin/pip uninstall -y pip \
 && python3 -m compileall -q /opt/loopwire

# Stage 2: the base image, the venv, an unprivileged user; no sources, no build leftovers.
FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/loopwire/bin:$PATH
COPY --from=build /opt/loopwire /opt/loopwire
RUN useradd --system --uid 10001 --home-dir /app loopwire \
 && mkdir -p /app && chown loopwire /app
WORKDIR /app

USER loopwire
# exec form: loopwire is PID 1 and gets SIGTERM itself (graceful drain on `docker stop`).
ENTRYPOINT ["loopwire"]
CMD ["--help"]
