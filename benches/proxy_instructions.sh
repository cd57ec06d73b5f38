#!/usr/bin/env bash
# Instructions the mcp-id-guard proxy executes per request (issue 12, section 5).
#
# Throughput on a shared 2-core machine drifts by about 5 % between windows,
# more than most single changes to the request path are worth. Instructions
# counted by valgrind's callgrind do not drift (about 1 % between runs), so
# this is the measure for one change at a time; benches/proxy_vs_nginx.sh
# then says what they add up to.
#
# Same traffic as benches/proxy_vs_nginx.sh: rmcp 3.11's echo server from
# tools/loadtest (`--serve`) on loopback, the proxy with its defaults in
# front, one MCP session, wrk sending `tools/call` of echo with unique ids,
# every response checked (benches/nginx/echo_call.lua). The proxy runs under
# callgrind (about 50 times slower), so wrk uses 8 connections. Counting
# starts after a 2 s warm-up and covers MEASURE_SECONDS of load; startup is
# not counted. User-space instructions only: the kernel's share (about half
# of the proxy's CPU time) is not in the count.
#
# FRONTS adds other fronts, each counted the same way in turn: `nginx` (the
# configuration of benches/proxy_vs_nginx.sh with NGINX_FORWARDED=1, in one
# process so callgrind follows its worker), `hyper` (a bare hyper-util
# reverse proxy, `loadtest --bare-proxy`: the floor of any proxy built on
# hyper) and `upstream` (the echo server asked directly: what a request
# costs the server the fronts protect).
#
#   benches/proxy_instructions.sh
#   FRONTS="proxy hyper nginx upstream" benches/proxy_instructions.sh
#   PROXY_ARGS="--on-duplicate reject" TOP=40 benches/proxy_instructions.sh
#
# Environment: FRONTS (proxy), MEASURE_SECONDS (6), PROXY_ARGS (extra flags
# for mcp-id-guard), TOP (how many of the proxy's own functions to list, by
# inclusive cost per request; 25). Installs valgrind and wrk from Debian when
# missing (needs root), and needs nginx for the nginx front. Loopback only.
set -euo pipefail

FRONTS=${FRONTS:-proxy}
MEASURE_SECONDS=${MEASURE_SECONDS:-6}
PROXY_ARGS=${PROXY_ARGS:-}
TOP=${TOP:-25}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if ! command -v valgrind >/dev/null || ! command -v wrk >/dev/null; then
    echo "installing valgrind and wrk from Debian" >&2
    apt-get update -qq
    apt-get install -y -qq valgrind wrk >/dev/null
fi

# shellcheck source=benches/common.sh
. benches/common.sh

echo "building mcp-id-guard (release, with line tables) and the echo server" >&2
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
build

upstream_port=$(free_port)
"$echo_bin" --serve "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_for_port "$upstream_port" "the echo server"

# start FRONT PORT: the front under callgrind, in the background.
start() {
    local front=$1 port=$2
    local out="--callgrind-out-file=$work/$front.out"
    case $front in
        proxy)
            # shellcheck disable=SC2086 # PROXY_ARGS is a word list
            valgrind --tool=callgrind "$out" \
                "$proxy_bin" --listen "127.0.0.1:$port" \
                --upstream "http://127.0.0.1:$upstream_port" \
                --max-requests-per-connection 1000000 $PROXY_ARGS >"$work/$front.log" 2>&1 &
            ;;
        hyper)
            valgrind --tool=callgrind "$out" \
                "$echo_bin" --bare-proxy "127.0.0.1:$port" \
                --upstream "127.0.0.1:$upstream_port" >"$work/$front.log" 2>&1 &
            ;;
        nginx)
            mkdir -p "$work/nginx"
            local forwarded='proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $http_host;'
            sed -e "s|@PREFIX@|$work/nginx|g" -e "s|@NGINX_PORT@|$port|g" \
                -e "s|@UPSTREAM_PORT@|$upstream_port|g" -e "s|@FORWARDED@|$forwarded|" \
                -e "s|^master_process on;|master_process off;|" \
                benches/nginx/proxy_vs_nginx.conf >"$work/nginx/nginx.conf"
            valgrind --tool=callgrind "$out" \
                nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" >"$work/$front.log" 2>&1 &
            ;;
        upstream)
            valgrind --tool=callgrind "$out" \
                "$echo_bin" --serve "127.0.0.1:$port" >"$work/$front.log" 2>&1 &
            ;;
        *)
            echo "unknown front: $front" >&2
            exit 2
            ;;
    esac
}

for front in $FRONTS; do
    port=$(free_port)
    start "$front" "$port"
    front_pid=$!
    pids+=("$front_pid")
    wait_for_port "$port" "$front under callgrind" 60

    url="http://127.0.0.1:$port/mcp"
    session=$(open_session "$url")

    load() {
        MCP_SESSION_ID="$session" wrk -t1 -c8 -d"$1s" --timeout 10s \
            -s benches/nginx/echo_call.lua "$url" | grep '^RESULT'
    }
    load 2 >/dev/null
    callgrind_control --zero "$front_pid" >/dev/null 2>&1
    result=$(load "$MEASURE_SECONDS")
    callgrind_control --dump "$front_pid" >/dev/null 2>&1
    kill "$front_pid"
    wait "$front_pid" 2>/dev/null || true

    requests=$(printf '%s\n' "$result" | sed 's/.*requests=\([0-9]*\).*/\1/')
    bad=$(printf '%s\n' "$result" | sed 's/.* bad=\([0-9]*\).*/\1/')
    if [ "$bad" != 0 ] || [ "$requests" = 0 ]; then
        echo "the load run through $front failed: $result" >&2
        exit 1
    fi
    # The dump taken after the warm-up is part 1.
    annotated=$(callgrind_annotate --threshold=100 --inclusive=yes "$work/$front.out.1" 2>/dev/null)
    total=$(printf '%s\n' "$annotated" | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }')
    echo "$front: requests: $requests, instructions per request: $((total / requests))"
    [ "$front" = proxy ] || continue
    echo
    echo "the proxy's own functions, instructions per request (inclusive):"
    printf '%s\n' "$annotated" \
        | awk -v n="$requests" -v top="$TOP" '
            /\/src\/.*mcp_id_guard::/ && $1 ~ /^[0-9,]+$/ && shown < top {
                cost = $1; gsub(",", "", cost)
                name = $0; sub(/^.*mcp_id_guard::/, "mcp_id_guard::", name); sub(/ \[.*$/, "", name)
                if (!(name in seen)) { seen[name] = 1; shown++; printf "%8d  %s\n", cost / n, name }
            }'
    echo
done
