# Shared by the benchmark scripts (sourced, not run): building the binaries,
# starting processes on loopback ports and stopping them on exit, and
# opening an MCP session through a front.
#
# Sets: proxy_bin, echo_bin (after `build`), work (a temporary directory)
# and pids (processes to stop on exit).

# Builds mcp-id-guard in release mode and the echo server with the
# `bench-upstream` profile (see Cargo.toml). PROXY_BIN (and ECHO_BIN) name
# binaries already built instead, e.g. to compare two builds.
build() {
    if [ -n "${PROXY_BIN:-}" ]; then
        proxy_bin=$PROXY_BIN
        echo_bin=${ECHO_BIN:-}
        return
    fi
    cargo build --release --quiet --features cli --bin mcp-id-guard
    cargo build --profile bench-upstream --quiet -p mcp-id-guard-loadtest
    local target_dir
    target_dir=$(cargo metadata --format-version 1 --no-deps \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    proxy_bin="$target_dir/release/mcp-id-guard"
    echo_bin="$target_dir/bench-upstream/loadtest"
}

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port, chosen by the kernel.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until something accepts connections on the port (at most SECONDS,
# 10 by default).
wait_for_port() {
    local port=$1 name=$2 seconds=${3:-10}
    for _ in $(seq $((seconds * 10))); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "$name did not listen on 127.0.0.1:$port within $seconds s" >&2
    exit 1
}

# initialize and notifications/initialized through one front (its URL);
# prints the session id.
open_session() {
    local url=$1 headers session status
    headers=$(curl -sS --max-time 30 -D - -o /dev/null "$url" \
        -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' \
        -H 'Mcp-Protocol-Version: 2025-06-18' \
        --data '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"benches","version":"0"}}}')
    session=$(printf '%s\n' "$headers" | tr -d '\r' | awk -F': ' 'tolower($1) == "mcp-session-id" { print $2 }')
    if [ -z "$session" ]; then
        echo "initialize through $url gave no session id" >&2
        exit 1
    fi
    status=$(curl -sS --max-time 30 -o /dev/null -w '%{http_code}' "$url" \
        -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' \
        -H 'Mcp-Protocol-Version: 2025-06-18' \
        -H "Mcp-Session-Id: $session" \
        --data '{"jsonrpc":"2.0","method":"notifications/initialized"}')
    if [ "$status" != 202 ]; then
        echo "notifications/initialized through $url: $status" >&2
        exit 1
    fi
    printf '%s' "$session"
}
