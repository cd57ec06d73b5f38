#!/usr/bin/env bash
# Instructions per request of the in-process overhead cases (issue 32's cost
# model), counted by callgrind: load-independent, so a change that adds a cost
# shows in these numbers whatever the machine is doing.
#
# For each case and size, the criterion bench binary runs FEW and then MANY
# requests (COUNT=… mode of benches/guard.rs) bare and guarded; the
# difference of the two counts divided by MANY - FEW is one request's
# instructions, start-up and the check exchange cancelling out. With
# STAGES=1, also lists the guard's functions by inclusive instructions per
# request (from the MANY run), for the per-stage table of BENCHMARKS.md. With
# FLOOR=1, also counts the floor (benches/guard.rs `Floor`: the body read
# whole and the request rebuilt, nothing scanned or tracked): what any layer
# that sees the whole body before the server pays, in the same units. With
# RMCP=1, also counts the pass-through and remapped cases against the real
# rmcp server in place of the template service (benches/guard/rmcp.rs): what
# a tracked request adds to an MCP server's own cost.
#
#   benches/cost_model.sh
#   CASES="pass_through" SIZES="1024" STAGES=1 benches/cost_model.sh
#
# Environment: CASES (untracked pass_through remapped), SIZES (256 1024),
# FEW (200), MANY (2200), STAGES (0), FLOOR (0), RMCP (0), RMCP_FEW (100),
# RMCP_MANY (600: rmcp costs a hundred times the template), TOP (30), BIN (a bench binary already
# built with `cargo bench --features internals --bench guard --no-run`).
set -euo pipefail

CASES=${CASES:-"untracked pass_through remapped"}
SIZES=${SIZES:-"256 1024"}
FEW=${FEW:-200}
MANY=${MANY:-2200}
STAGES=${STAGES:-0}
FLOOR=${FLOOR:-0}
RMCP=${RMCP:-0}
RMCP_FEW=${RMCP_FEW:-100}
RMCP_MANY=${RMCP_MANY:-600}
TOP=${TOP:-30}

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }

export CARGO_PROFILE_BENCH_DEBUG=line-tables-only
bin=${BIN:-}
[ -n "$bin" ] || bin=$(cargo bench --features internals --bench guard --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "guard" and m.get("executable"):
        print(m["executable"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

total() { # the instructions callgrind counted in file $1
    awk '/^totals:/ {print $2}' "$1"
}

run() { # case size side requests -> callgrind output file
    local out="$work/$1-$2-$3-$4.out"
    COUNT="$1:$2:$3:$4" valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" >/dev/null 2>&1
    echo "$out"
}

sides="bare guarded"
[ "$FLOOR" = 1 ] && sides="$sides floor"
printf '%-14s %6s %10s %10s %8s %10s' case size bare guarded ratio added
[ "$FLOOR" = 1 ] && printf ' %10s %8s' floor ratio
printf '\n'
for case in $CASES; do
    for size in $SIZES; do
        declare -A per=()
        for side in $sides; do
            few=$(total "$(run "$case" "$size" "$side" "$FEW")")
            many_out=$(run "$case" "$size" "$side" "$MANY")
            many=$(total "$many_out")
            per[$side]=$(( (many - few) / (MANY - FEW) ))
            [ "$side" = guarded ] && guarded_out=$many_out
        done
        printf '%-14s %6s %10d %10d %7.2fx %10d' "$case" "$size" "${per[bare]}" "${per[guarded]}" \
            "$(echo "${per[guarded]} / ${per[bare]}" | bc -l)" $(( per[guarded] - per[bare] ))
        [ "$FLOOR" = 1 ] && printf ' %10d %7.2fx' "${per[floor]}" "$(echo "${per[floor]} / ${per[bare]}" | bc -l)"
        printf '\n'
        if [ "$STAGES" = 1 ]; then
            callgrind_annotate --inclusive=yes "$guarded_out" 2>/dev/null |
                awk -v n="$MANY" -v top="$TOP" '
                    /^[0-9,]+ / && /mcp_id_guard::/ {
                        gsub(",", "", $1); shown++
                        if (shown <= top) printf "    %9.0f  %s\n", $1 / n, substr($0, index($0, $2))
                    }'
        fi
        unset per
    done
done

if [ "$RMCP" = 1 ]; then
    printf '\nagainst the real rmcp server (%s and %s requests)\n' "$RMCP_FEW" "$RMCP_MANY"
    printf '%-14s %6s %10s %10s %8s %10s\n' case size "rmcp bare" guarded ratio added
    for case in $CASES; do
        # The rmcp sides take these two (an untracked request has no
        # session at rmcp; the others answer without it).
        case $case in pass_through | remapped) ;; *) continue ;; esac
        for size in $SIZES; do
            declare -A per=()
            for side in rmcp-bare rmcp-guarded; do
                few=$(total "$(run "$case" "$size" "$side" "$RMCP_FEW")")
                many=$(total "$(run "$case" "$size" "$side" "$RMCP_MANY")")
                per[$side]=$(( (many - few) / (RMCP_MANY - RMCP_FEW) ))
            done
            printf '%-14s %6s %10d %10d %7.2fx %10d\n' "$case" "$size" "${per[rmcp-bare]}" \
                "${per[rmcp-guarded]}" "$(echo "${per[rmcp-guarded]} / ${per[rmcp-bare]}" | bc -l)" \
                $(( per[rmcp-guarded] - per[rmcp-bare] ))
            unset per
        done
    done
fi
