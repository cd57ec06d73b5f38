#!/usr/bin/env bash
# Builds the `mcp-id-guard` reverse-proxy binary (release, features `cli`) and
# puts it where maturin takes the wheel's scripts from (`data` in
# pyproject.toml): python/mcp_id_guard.data/scripts/mcp-id-guard. Run it before
# `maturin build` for a wheel that has the command as well as the middleware;
# packaging/test-packages.sh does. CARGO_TARGET_DIR, if set, is honoured.
#
# Usage: packaging/python/stage-binary.sh   (needs cargo and python3)
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
cargo build --release --locked --features cli --bin mcp-id-guard
target_dir="$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
scripts="$repo/python/mcp_id_guard.data/scripts"
mkdir -p "$scripts"
install -m 755 "$target_dir/release/mcp-id-guard" "$scripts/mcp-id-guard"
# As maturin's `strip = true` did for the binary when it built it itself.
if command -v strip >/dev/null; then
    strip "$scripts/mcp-id-guard"
fi
echo "staged $scripts/mcp-id-guard ($(du -k "$scripts/mcp-id-guard" | cut -f1) KiB)"
