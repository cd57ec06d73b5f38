#!/usr/bin/env bash
# CPU the mcp-id-guard proxy spends per MiB of a tracked JSON body, for a
# token-dense body against a long-string body of the same size (issue 22).
#
# The guard reads the structure of every tracked body to its end (failing
# closed): a long string is one memchr, an array of small objects is many
# tokens. Upstream: rmcp 3.11's echo server from tools/loadtest (`--serve`)
# on loopback. Front: the release proxy with its defaults. One MCP session;
# a client on one keep-alive connection sends `tools/call` of echo, unique
# ids, each body exactly BODY_BYTES:
#   dense: arguments {"sentinel":"s","items":[{"n":..,"name":"item-..",
#          "ok":true,"score":..,"tags":["alpha","beta"],"text":"line ..:
#          \"quoted\" words\nand a newline"},...]} (the items of
#          benches/guard.rs)
#   long:  arguments {"sentinel":"s","fill":"xxxx..."}
# and, with SHAPES, two long strings with escapes:
#   text:   a document, lines of words, "\n" every 70 bytes or so
#   quoted: the dense items as JSON quoted in one string (every quote and
#           backslash escaped), as a tool returns structured content in text
# and checks each answer (200, its own id, ECHO:s). The proxy's CPU time
# (utime + stime from /proc/<pid>/stat, user and kernel) is read before and
# after MIB_PER_SHAPE MiB of each shape, after a warm-up; it includes
# receiving and forwarding the bytes, which both shapes share, so the
# difference between them is what reading dense structure costs.
#
# CALLGRIND=1 then runs the proxy again under valgrind's callgrind and counts
# its user-space instructions per MiB for CALLGRIND_MIB MiB of each shape:
# load-independent, unlike CPU time on a shared machine.
#
#   benches/dense_cpu.sh
#   CALLGRIND=1 benches/dense_cpu.sh
#   PROXY_BIN=/path/to/other/mcp-id-guard CALLGRIND=1 benches/dense_cpu.sh
#
# Environment: SHAPES ("dense long"; also text, quoted), BODY_BYTES
# (1048576), MIB_PER_SHAPE (256; 0: callgrind only), ROUNDS (3: the shapes
# alternate, in SHAPES order, per round), CALLGRIND (0),
# CALLGRIND_MIB (16), PROXY_BIN (a proxy binary to measure instead of
# building this checkout's), PROXY_ARGS (extra flags for mcp-id-guard).
# Installs valgrind from Debian when CALLGRIND=1 and it is missing (needs
# root). Loopback only.
set -euo pipefail

SHAPES=${SHAPES:-dense long}
BODY_BYTES=${BODY_BYTES:-1048576}
MIB_PER_SHAPE=${MIB_PER_SHAPE:-256}
ROUNDS=${ROUNDS:-3}
CALLGRIND=${CALLGRIND:-0}
CALLGRIND_MIB=${CALLGRIND_MIB:-16}
PROXY_ARGS=${PROXY_ARGS:-}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [ "$CALLGRIND" = 1 ] && ! command -v valgrind >/dev/null; then
    echo "installing valgrind from Debian" >&2
    apt-get update -qq
    apt-get install -y -qq valgrind >/dev/null
fi

# shellcheck source=benches/common.sh
. benches/common.sh

echo "building mcp-id-guard (release, with line tables) and the echo server" >&2
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
build
proxy_bin=${PROXY_BIN:-$proxy_bin}

# The client: one keep-alive connection, bodies built once per shape with
# the id at a fixed place, every answer read to its end and checked.
cat >"$work/send.py" <<'EOF'
import http.client, json, sys

port, session, shape, size, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
first_id = int(sys.argv[6])

def body(members):
    return ('{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"echo","arguments":{"sentinel":"s",%s}}}'
            % ("ID", members))

def frame_len():
    return len(body("").replace("ID", str(first_id)))

def items(length):
    # `[` + items + `]`, at most `length` bytes.
    items, n, total = [], 0, len('[]')
    while True:
        item = ('{"n":%d,"name":"item-%d","ok":true,"score":%d.25,"tags":["alpha","beta"],'
                '"text":"line %d: \\"quoted\\" words\\nand a newline"}' % (n, n, n * 7, n))
        extra = len(item) + (1 if items else 0)
        if total + extra > length:
            break
        items.append(item)
        total += extra
        n += 1
    return "[" + ",".join(items) + "]"

def dense(length):
    # Padded with spaces where the last item ends.
    array = items(length - len('"items":'))
    return '"items":' + array + " " * (length - len('"items":') - len(array))

def fill(length, text):
    # `"fill":"` + text + `"`, the text cut to size on a whole escape.
    room = length - len('"fill":""')
    text = (text * (room // len(text) + 1))[:room]
    while (len(text) - len(text.rstrip("\\"))) % 2 == 1:
        text = text[:-1] + "x"
    return '"fill":"' + text + '"'

def long(length):
    return fill(length, "x")

def text(length):
    line = "line of a document with some words in it, as a file or a page reads\\n"
    return fill(length, line)

def quoted(length):
    inner = json.dumps(items(length // 2 + 4096))[1:-1]
    return fill(length, inner + "\\n")

members = {"dense": dense, "long": long, "text": text, "quoted": quoted}[shape](size - frame_len())
template = body(members).encode()
assert len(template.replace(b"ID", str(first_id).encode())) == size, "body size"
json.loads(template.replace(b"ID", b"1"))
head, tail = template.split(b"ID", 1)

conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
headers = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "Mcp-Protocol-Version": "2025-06-18",
    "Mcp-Session-Id": session,
}
for i in range(count):
    request_id = str(first_id + i).encode()
    conn.request("POST", "/mcp", body=head + request_id + tail, headers=headers)
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200 or b"ECHO:s" not in answer or b'"id":' + request_id not in answer:
        sys.exit("bad answer %d: %r" % (response.status, answer[:300]))
EOF

upstream_port=$(free_port)
"$echo_bin" --serve "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_for_port "$upstream_port" "the echo server"

# Starts the proxy (under the given wrapper, if any); sets proxy_pid, url,
# session.
start_proxy() {
    proxy_port=$(free_port)
    # shellcheck disable=SC2086 # PROXY_ARGS is a word list
    "$@" "$proxy_bin" --listen "127.0.0.1:$proxy_port" \
        --upstream "http://127.0.0.1:$upstream_port" $PROXY_ARGS >"$work/proxy.log" 2>&1 &
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_for_port "$proxy_port" "mcp-id-guard" 60
    url="http://127.0.0.1:$proxy_port/mcp"
    session=$(open_session "$url")
}

next_id=1000000
# send SHAPE COUNT: COUNT bodies of SHAPE through the proxy.
send() {
    python3 "$work/send.py" "$proxy_port" "$session" "$1" "$BODY_BYTES" "$2" "$next_id"
    next_id=$((next_id + $2))
}

# The proxy's CPU time so far, in clock ticks (user + kernel).
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$proxy_pid/stat"
}

tick=$(getconf CLK_TCK)
count=$(((MIB_PER_SHAPE * 1048576 + BODY_BYTES - 1) / BODY_BYTES))
mib=$(python3 -c "print($count * $BODY_BYTES / 1048576)")

if [ "$MIB_PER_SHAPE" != 0 ]; then
    start_proxy
    declare -A ticks=()
    for shape in $SHAPES; do
        send "$shape" 8
        ticks[$shape]=0
    done
    for round in $(seq "$ROUNDS"); do
        for shape in $SHAPES; do
            before=$(cpu_ticks)
            send "$shape" "$count"
            after=$(cpu_ticks)
            ticks[$shape]=$((ticks[$shape] + after - before))
            echo "round $round, $shape: $(python3 -c "print(f'{($after - $before) * 1000 / $tick / $mib:.3f}')") ms/MiB" >&2
        done
    done
    kill "$proxy_pid"
    wait "$proxy_pid" 2>/dev/null || true
    echo "body $BODY_BYTES B, $(python3 -c "print(f'{$mib * $ROUNDS:.0f}')") MiB per shape, proxy CPU (user + kernel), ms/MiB:"
    for shape in $SHAPES; do
        python3 -c "print(f'  {\"$shape\":6}  {${ticks[$shape]} * 1000 / $tick / ($mib * $ROUNDS):.3f}')"
    done
fi

if [ "$CALLGRIND" = 1 ]; then
    cg_count=$(((CALLGRIND_MIB * 1048576 + BODY_BYTES - 1) / BODY_BYTES))
    cg_mib=$(python3 -c "print($cg_count * $BODY_BYTES / 1048576)")
    start_proxy valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out"
    for shape in $SHAPES; do
        send "$shape" 2
    done
    echo "user-space instructions per MiB (callgrind, $cg_mib MiB per shape):"
    part=0
    for shape in $SHAPES; do
        callgrind_control --zero "$proxy_pid" >/dev/null 2>&1
        send "$shape" "$cg_count"
        callgrind_control --dump "$proxy_pid" >/dev/null 2>&1
        part=$((part + 1))
        total=$(callgrind_annotate --threshold=100 "$work/callgrind.out.$part" 2>/dev/null \
            | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }')
        python3 -c "print(f'  {\"$shape\":6}  {$total / $cg_mib:,.0f}')"
    done
    kill "$proxy_pid"
    wait "$proxy_pid" 2>/dev/null || true
fi
