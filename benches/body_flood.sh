#!/usr/bin/env bash
# The request-body budget under a body flood (issue 42's acceptance run).
#
# Upstream: rmcp 3.11's echo server from tools/loadtest (`--serve`), on
# loopback, one for the whole matrix. Proxy: `mcp-id-guard` (release, default
# body settings: 64 MiB budget, an eighth kept for bodies <= 64 KiB, half per
# client address, 240 B/s minimum body rate after 5 s), a fresh one per run,
# with `--max-connections 4096` and its admin listener. Attack and
# measurement: `body_flood` (tools/loadtest/src/bin/body_flood.rs), which
# prints one line per run with PASS or FAIL against the criteria (95 % of
# 40-byte pings and 90 % of 1 MiB POSTs answered within 2 s, peak RSS under
# the budget plus 32 MiB) and the peak held bytes and bodies from /metrics.
#
#   benches/body_flood.sh                                   # 24 runs of 120 s: ~52 min
#   DURATION=30 benches/body_flood.sh                       # ~14 min
#   DURATION=120 CONNECTIONS=1024 benches/body_flood.sh     # the 8 largest runs
#
# Environment: DURATION (seconds per run, 120), CONNECTIONS ("16 256 1024"),
# SOURCES ("1 256": attack from 127.0.0.1, or spread over 127.0.0.1..127.0.1.0),
# PROTOCOLS ("h1 h2"), MODES ("min-rate zero-byte"), PROXY_ARGS (extra flags
# for mcp-id-guard), FLOOD_ARGS (extra flags for body_flood, e.g.
# "--rate 300"), PROXY_BIN / ECHO_BIN / FLOOD_BIN (binaries already built),
# LOG_DIR (keep each run's proxy log there).
# The legitimate client runs from 127.0.2.1, an address no attacker uses.
# Raises the descriptor limit to 8192 (`ulimit -n`). Loopback only.
set -euo pipefail

DURATION=${DURATION:-120}
CONNECTIONS=${CONNECTIONS:-"16 256 1024"}
SOURCES=${SOURCES:-"1 256"}
PROTOCOLS=${PROTOCOLS:-"h1 h2"}
MODES=${MODES:-"min-rate zero-byte"}
PROXY_ARGS=${PROXY_ARGS:-}
FLOOD_ARGS=${FLOOD_ARGS:-}
LOG_DIR=${LOG_DIR:-}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# shellcheck source=benches/common.sh
. benches/common.sh

echo "building mcp-id-guard, the echo server and body_flood" >&2
build
flood_bin=${FLOOD_BIN:-$(dirname "${echo_bin}")/body_flood}

ulimit -n 8192

upstream_port=$(free_port)
"$echo_bin" --serve "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_for_port "$upstream_port" "the echo server"

echo "load before: $(cat /proc/loadavg)"
for connections in $CONNECTIONS; do
    for sources in $SOURCES; do
        for protocol in $PROTOCOLS; do
            for mode in $MODES; do
                proxy_port=$(free_port)
                admin_port=$(free_port)
                # shellcheck disable=SC2086
                "$proxy_bin" --listen "127.0.0.1:$proxy_port" \
                    --upstream "http://127.0.0.1:$upstream_port" \
                    --admin-listen "127.0.0.1:$admin_port" \
                    --max-connections 4096 $PROXY_ARGS >"$work/proxy.log" 2>&1 &
                proxy_pid=$!
                pids+=("$proxy_pid")
                wait_for_port "$proxy_port" "mcp-id-guard"
                wait_for_port "$admin_port" "mcp-id-guard's admin listener"
                # shellcheck disable=SC2086
                timeout $((DURATION + 60)) "$flood_bin" \
                    --proxy "127.0.0.1:$proxy_port" --admin "127.0.0.1:$admin_port" \
                    --proxy-pid "$proxy_pid" --connections "$connections" \
                    --sources "$sources" --protocol "$protocol" --mode "$mode" \
                    --duration "$DURATION" $FLOOD_ARGS \
                    || echo "flood $protocol sources=$sources conns=$connections mode=$mode: body_flood failed ($?)"
                kill "$proxy_pid" 2>/dev/null || true
                wait "$proxy_pid" 2>/dev/null || true
                if [ -n "$LOG_DIR" ]; then
                    mkdir -p "$LOG_DIR"
                    cp "$work/proxy.log" "$LOG_DIR/proxy-$protocol-$sources-$connections-$mode.log"
                fi
                # Let the sockets of the run close before the next one.
                sleep 2
            done
        done
    done
done
echo "load after: $(cat /proc/loadavg)"
