#!/usr/bin/env bash
# Memory per held exchange: mcp-id-guard against nginx, in one run (issue 22).
#
# For each shape (`pending`: the upstream has not answered; `sse`: it
# answered 200 text/event-stream with one event, then stays quiet) and each
# front, a fresh front process is started, N clients each open a connection
# and their own session through it and send one small tracked `tools/call`
# with a unique id, and benches/held_exchanges.py (which is also the
# upstream) reads the front's resident set once every call is held. nginx:
# one worker, `proxy_buffering off` (benches/nginx/proxy_vs_nginx.conf), its
# worker's RSS. mcp-id-guard: its defaults, with room for N client and N
# upstream connections. hyper: a bare hyper-util proxy (`loadtest
# --bare-proxy`: hyper's server and pooled client, nothing of the guard), the
# floor hyper itself sets. Rounds alternate the order of the fronts.
#
#   benches/held_vs_nginx.sh
#   EXCHANGES=2000 ROUNDS=3 benches/held_vs_nginx.sh
#
# Two figures per run, both per exchange: the RSS it adds once its
# connection and session are open (`held`), and what it adds from the
# front's start, its connections and session included (`all`). The ratio
# is taken on `all`, as the issue measured it. Installs nginx from Debian
# when missing (needs root). Loopback only.
set -euo pipefail

EXCHANGES=${EXCHANGES:-2000}
ROUNDS=${ROUNDS:-3}
PROXY_ARGS=${PROXY_ARGS:-}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if ! command -v nginx >/dev/null; then
    echo "installing nginx from Debian" >&2
    apt-get update -qq
    apt-get install -y -qq nginx-light >/dev/null || apt-get install -y -qq nginx >/dev/null
fi

# shellcheck source=benches/common.sh
. benches/common.sh

echo "building mcp-id-guard (release)" >&2
build

# Starts one front in front of UPSTREAM_PORT on FRONT_PORT; sets front_pid
# (the process whose RSS is read: nginx's worker, or the proxy).
start_front() {
    local front=$1 front_port=$2 upstream_port=$3
    if [ "$front" = nginx ]; then
        rm -rf "$work/nginx" && mkdir -p "$work/nginx"
        sed -e "s|@PREFIX@|$work/nginx|g" -e "s|@NGINX_PORT@|$front_port|g" \
            -e "s|@UPSTREAM_PORT@|$upstream_port|g" -e "s|@FORWARDED@||" \
            -e "s|worker_connections 1024;|worker_connections $((EXCHANGES * 4 + 1000));|" \
            benches/nginx/proxy_vs_nginx.conf >"$work/nginx/nginx.conf"
        nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" 2>"$work/nginx/stderr.log" &
        front_launcher=$!
        wait_for_port "$front_port" "nginx"
        front_pid=$(pgrep -P "$front_launcher" | head -1)
    elif [ "$front" = hyper ]; then
        "$echo_bin" --bare-proxy "127.0.0.1:$front_port" \
            --upstream "127.0.0.1:$upstream_port" >"$work/hyper.log" 2>&1 &
        front_launcher=$!
        wait_for_port "$front_port" "the bare hyper proxy"
        front_pid=$front_launcher
    else
        # shellcheck disable=SC2086 # PROXY_ARGS is a word list
        "$proxy_bin" --listen "127.0.0.1:$front_port" \
            --upstream "http://127.0.0.1:$upstream_port" \
            --max-connections $((EXCHANGES * 2 + 100)) \
            --max-upstream-connections $((EXCHANGES * 2 + 100)) \
            $PROXY_ARGS >"$work/proxy.log" 2>&1 &
        front_launcher=$!
        wait_for_port "$front_port" "mcp-id-guard"
        front_pid=$front_launcher
    fi
}

stop_front() {
    kill "$front_launcher" 2>/dev/null || true
    wait "$front_launcher" 2>/dev/null || true
}

echo "nginx $(nginx -v 2>&1 | sed 's|.*/||'), $("$proxy_bin" --version), $EXCHANGES exchanges held, $ROUNDS rounds${PROXY_ARGS:+, proxy args: $PROXY_ARGS}"
results="$work/results"
: >"$results"
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) -eq 1 ]; then order="nginx proxy hyper"; else order="hyper proxy nginx"; fi
    for shape in pending sse; do
        for front in $order; do
            front_port=$(free_port)
            upstream_port=$(free_port)
            start_front "$front" "$front_port" "$upstream_port"
            line=$(python3 benches/held_exchanges.py --front-port "$front_port" \
                --upstream-port "$upstream_port" --pid "$front_pid" --shape "$shape" \
                -n "$EXCHANGES" 2>"$work/driver.log") || {
                cat "$work/driver.log" >&2
                exit 1
            }
            stop_front
            echo "$round $shape $front $line" >>"$results"
        done
    done
done

python3 - "$results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    round_, shape, front, data = line.split(" ", 3)
    runs.setdefault((shape, front), []).append(json.loads(data))
print(f"{'shape':<8} {'front':<6} {'held KiB':>9} {'all KiB':>8}   (per exchange; median of rounds)")
median = {}
for (shape, front), results in sorted(runs.items()):
    held = statistics.median(r["kib_per_exchange"] for r in results)
    all_ = statistics.median(r["kib_per_exchange_and_connections"] for r in results)
    median[(shape, front)] = (held, all_)
    print(f"{shape:<8} {front:<6} {held:>9.1f} {all_:>8.1f}")
print()
met = True
for shape in ("pending", "sse"):
    proxy, nginx = median[(shape, "proxy")], median[(shape, "nginx")]
    ratio = proxy[1] / nginx[1]
    met = met and ratio <= 1.5
    hyper = median[(shape, "hyper")]
    print(f"{shape}: proxy/nginx {ratio:.2f}x (all), {proxy[0] / nginx[0]:.2f}x (held);"
          f" bare hyper/nginx {hyper[1] / nginx[1]:.2f}x (all)")
print("target (at most 1.5x nginx in both shapes):", "met" if met else "not met")
PY
