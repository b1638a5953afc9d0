# One image for every loopwire service; the command picks the service:
#   docker run loopwire serve committer | serve model-step | serve tool calculator | <any CLI command>
# Configuration is by environment only (LW_*; see README.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY loopwire ./loopwire
# tzdata: the clock tool's time zones do not depend on the base image's zoneinfo files.
# mcp-server-time: the MCP server compose's mcp-time bridge starts.
RUN pip install . tzdata "mcp-server-time==2026.10.19" \
 && useradd --system --uid 10001 --home-dir /app loopwire

USER loopwire
# exec form: loopwire is PID 1 and gets SIGTERM itself (graceful drain on `docker stop`).
ENTRYPOINT ["loopwire"]
CMD ["--help"]
