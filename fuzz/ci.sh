#!/usr/bin/env bash
# A short bounded run of both fuzz targets, so a change that breaks one of
# their invariants fails where it lands (.ci/run calls this). Each target
# starts from the committed seeds and regression inputs and runs for
# FUZZ_SECONDS (default 30). Installs cargo-fuzz from crates.io when missing.
set -euo pipefail
cd "$(dirname "$0")"

seconds="${FUZZ_SECONDS:-30}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
export RUSTC_BOOTSTRAP=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in request_path sse_rewriter; do
    mkdir -p "corpus/$target"
    echo "== fuzz: $target for ${seconds}s"
    status=0
    cargo fuzz run --sanitizer none -O "$target" "corpus/$target" "seeds/$target" "regressions/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "^stat::number_of_executed_units|DONE|panicked|^thread '|ERROR" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log" >&2
        echo "fuzz: $target found a failing input (see fuzz/artifacts/$target)" >&2
        exit 1
    fi
done
