#!/usr/bin/env bash
# Installs HAProxy from the distribution's packages when it is missing, so the
# replica tests (tests/proxy/replicas.rs) have a real load balancer and the
# public-deployment tests (tests/proxy/public.rs) a real TLS terminator. Quiet and
# instant when `haproxy` is already on PATH. Needs root (CI runs as root).
set -euo pipefail

if command -v haproxy >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: haproxy is missing and installing it needs root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends haproxy >/dev/null
# The package may start a system service with its own config; the test runs
# its own haproxy with a generated config and needs no system instance.
command -v haproxy >/dev/null 2>&1 || {
    echo "install.sh: haproxy still missing after apt-get install" >&2
    exit 1
}
haproxy -v | head -n 1
