#!/usr/bin/env bash
# mcp-id-guard against nginx in front of the same upstream (issue 12, section 5).
#
# Upstream: rmcp 3.11's echo server from tools/loadtest (`--serve`), with
# TCP_NODELAY, on loopback. Fronts: nginx (benches/nginx/proxy_vs_nginx.conf:
# one worker, upstream keepalive 64, proxy_buffering off, HTTP/1.1, Host set
# for the upstream) and `mcp-id-guard --upstream ...` with its defaults. One
# MCP session per front, opened through that front. Load: wrk, 1 thread, 32
# connections, `tools/call` of echo with unique ids, every response checked
# (benches/nginx/echo_call.lua). Rounds alternate the order of the fronts
# (nginx first, then the proxy first, ...) so drift falls on both alike.
#
#   benches/proxy_vs_nginx.sh
#   ROUNDS=6 SECONDS_PER_RUN=10 PROXY_ARGS="--max-upstream-connections 64" benches/proxy_vs_nginx.sh
#
# Environment: ROUNDS (6), SECONDS_PER_RUN (10), WARMUP_SECONDS (3),
# CONNECTIONS (32), PROXY_ARGS (extra flags for mcp-id-guard), PROXY_ENV
# (extra environment for it, e.g. TOKIO_WORKER_THREADS=1), NGINX_FORWARDED
# (1: nginx also sends X-Forwarded-For, -Proto and -Host, as mcp-id-guard
# does, so the upstream gets the same request from both), HYPER (1: a bare
# hyper-util reverse proxy, `loadtest --bare-proxy`, runs as a third front:
# the floor of any proxy built on hyper, against the same nginx). Installs
# nginx and wrk from Debian when missing (needs root). Loopback only.
set -euo pipefail

ROUNDS=${ROUNDS:-6}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
WARMUP_SECONDS=${WARMUP_SECONDS:-3}
CONNECTIONS=${CONNECTIONS:-32}
PROXY_ARGS=${PROXY_ARGS:-}
PROXY_ENV=${PROXY_ENV:-}
NGINX_FORWARDED=${NGINX_FORWARDED:-0}
HYPER=${HYPER:-0}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    echo "installing nginx and wrk from Debian" >&2
    apt-get update -qq
    apt-get install -y -qq nginx-light wrk >/dev/null \
        || apt-get install -y -qq nginx wrk >/dev/null
fi

# shellcheck source=benches/common.sh
. benches/common.sh

echo "building mcp-id-guard and the echo server (release)" >&2
build

upstream_port=$(free_port)
nginx_port=$(free_port)
proxy_port=$(free_port)

"$echo_bin" --serve "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_for_port "$upstream_port" "the echo server"

mkdir -p "$work/nginx"
forwarded=""
if [ "$NGINX_FORWARDED" = 1 ]; then
    forwarded='proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $http_host;'
fi
sed -e "s|@PREFIX@|$work/nginx|g" -e "s|@NGINX_PORT@|$nginx_port|g" \
    -e "s|@UPSTREAM_PORT@|$upstream_port|g" -e "s|@FORWARDED@|$forwarded|" \
    benches/nginx/proxy_vs_nginx.conf >"$work/nginx/nginx.conf"
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" 2>"$work/nginx/stderr.log" &
pids+=($!)
wait_for_port "$nginx_port" "nginx"

# As many requests per connection as nginx's `keepalive_requests` below.
# shellcheck disable=SC2086 # PROXY_ENV and PROXY_ARGS are word lists
env $PROXY_ENV "$proxy_bin" --listen "127.0.0.1:$proxy_port" \
    --upstream "http://127.0.0.1:$upstream_port" \
    --max-requests-per-connection 1000000 $PROXY_ARGS >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for_port "$proxy_port" "mcp-id-guard"

declare -A url session
url[nginx]="http://127.0.0.1:$nginx_port/mcp"
url[proxy]="http://127.0.0.1:$proxy_port/mcp"
fronts="nginx proxy"
if [ "$HYPER" = 1 ]; then
    hyper_port=$(free_port)
    "$echo_bin" --bare-proxy "127.0.0.1:$hyper_port" \
        --upstream "127.0.0.1:$upstream_port" >"$work/hyper.log" 2>&1 &
    pids+=($!)
    wait_for_port "$hyper_port" "the bare hyper proxy"
    url[hyper]="http://127.0.0.1:$hyper_port/mcp"
    fronts="nginx proxy hyper"
fi
for front in $fronts; do
    session[$front]=$(open_session "${url[$front]}")
done

# One wrk run against a front; prints its RESULT line.
drive() {
    local front=$1 seconds=$2 output
    output=$(MCP_SESSION_ID="${session[$front]}" wrk -t1 -c"$CONNECTIONS" -d"${seconds}s" \
        --timeout 10s --latency -s benches/nginx/echo_call.lua "${url[$front]}")
    printf '%s\n' "$output" | grep '^RESULT'
}

field() { # field NAME LINE
    printf '%s\n' "$2" | tr ' ' '\n' | awk -F= -v name="$1" '$1 == name { print $2 }'
}

echo "warming up the fronts (${WARMUP_SECONDS} s each)" >&2
for front in $fronts; do
    drive "$front" "$WARMUP_SECONDS" >/dev/null
done

echo "nginx $(nginx -v 2>&1 | sed 's|.*/||'), $("$proxy_bin" --version), wrk -t1 -c$CONNECTIONS, ${SECONDS_PER_RUN} s per run, $ROUNDS rounds${PROXY_ARGS:+, proxy args: $PROXY_ARGS}${PROXY_ENV:+, proxy env: $PROXY_ENV}$([ "$NGINX_FORWARDED" = 1 ] && echo ', nginx sends X-Forwarded-*')"
printf '%-6s %-6s %10s %9s %9s %6s %7s\n' round front req/s p50_ms p99_ms bad errors
results="$work/results"
: >"$results"
failed=0
for round in $(seq "$ROUNDS"); do
    # Each round starts with the next front, so drift falls on all alike.
    # shellcheck disable=SC2086 # fronts is a word list
    order=$(printf '%s\n' $fronts | awk -v r="$round" '{ f[NR - 1] = $0 } END { for (i = 0; i < NR; i++) print f[(i + r - 1) % NR] }' | tr '\n' ' ')
    for front in $order; do
        line=$(drive "$front" "$SECONDS_PER_RUN")
        rps=$(field rps "$line"); p50=$(field p50_ms "$line"); p99=$(field p99_ms "$line")
        bad=$(field bad "$line")
        errors=$(($(field socket_errors "$line") + $(field non2xx "$line")))
        printf '%-6s %-6s %10s %9s %9s %6s %7s\n' "$round" "$front" "$rps" "$p50" "$p99" "$bad" "$errors"
        if [ "$bad" != 0 ] || [ "$errors" != 0 ]; then
            failed=1
            echo "  $line" >&2
        fi
        echo "$round $front $rps $p99" >>"$results"
    done
done

python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    round_, front, rps, p99 = line.split()
    runs.setdefault(int(round_), {})[front] = (float(rps), float(p99))
print()
print(f"{'round':<6} {'proxy/nginx req/s':>18} {'proxy/nginx p99':>16}")
rps_ratios, p99_ratios = [], []
for round_, fronts in sorted(runs.items()):
    rps_ratio = fronts["proxy"][0] / fronts["nginx"][0]
    p99_ratio = fronts["proxy"][1] / fronts["nginx"][1]
    rps_ratios.append(rps_ratio)
    p99_ratios.append(p99_ratio)
    print(f"{round_:<6} {rps_ratio:>18.3f} {p99_ratio:>16.3f}")
for front in sorted(next(iter(runs.values()))):
    rps = statistics.median(r[front][0] for r in runs.values())
    p99 = statistics.median(r[front][1] for r in runs.values())
    print(f"median {front}: {rps:.0f} req/s, p99 {p99:.2f} ms")
if all("hyper" in fronts for fronts in runs.values()):
    hyper_rps = statistics.median(f["hyper"][0] / f["nginx"][0] for f in runs.values())
    hyper_p99 = statistics.median(f["hyper"][1] / f["nginx"][1] for f in runs.values())
    print(f"median ratio hyper/nginx (the floor): throughput {hyper_rps:.3f}, p99 {hyper_p99:.3f}")
rps_median = statistics.median(rps_ratios)
p99_median = statistics.median(p99_ratios)
print(f"median ratio proxy/nginx: throughput {rps_median:.3f}, p99 {p99_median:.3f}")
met = rps_median >= 0.95 and p99_median <= 1.10
print("target (throughput >= 0.95x nginx, p99 <= 1.10x):", "met" if met else "not met")
PY

if [ "$failed" != 0 ]; then
    echo "some responses were wrong or missing (see above)" >&2
    exit 1
fi
