#!/usr/bin/env bash
# Builds the Python wheel and the npm packages of `mcp-id-guard` from this
# checkout, installs each the way a user would (a fresh virtualenv; an npm
# project installing the packed tarballs), runs the ASGI middleware's pytest
# suite (python/tests) against the installed wheel, and shows the installed
# command keeping a real MCP server's answers apart (see burst.py): a FastMCP server
# from PyPI (mcp 1.27.0) behind the pip-installed command, a TypeScript SDK
# server from npm behind the npm-installed one (and run by it, `-- node
# echo-server.mjs`), each with its control case;
# and, with a FastMCP server that closes request streams for polling
# (SEP-1699), that a request's id is not given to another request while the
# server still runs it (see polling.py); and that `mcp-id-guard probe` finds
# the bug in the FastMCP server alone and nothing behind the proxy, printing
# what README.md's probe sample shows (probe.py).
#
# One release build of the binary serves both: the npm packages carry the
# binary taken out of the wheel. Loopback traffic only; every step is bounded.
#
# Usage: packaging/test-packages.sh   (needs python3 with venv, node and npm,
# and the package registries; runs in a temporary directory it removes)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/mcp-id-guard-packaging.XXXXXX")"
# Each background step runs under `timeout`, which leads its own process
# group: killing the group stops the step and every server it started.
groups=()

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for group in "${groups[@]}"; do
        kill -TERM -- "-$group" 2>/dev/null || true
    done
    for group in "${groups[@]}"; do
        wait "$group" 2>/dev/null || true
    done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs "$@" in its own process group, bounded by $1 seconds; returns its status.
bounded() {
    local seconds=$1
    shift
    timeout --kill-after=10 "$seconds" "$@" &
    local pid=$!
    groups+=("$pid")
    local status=0
    wait "$pid" || status=$?
    if [ "$status" -eq 124 ]; then
        echo "packaging: timed out after ${seconds}s: $*" >&2
    fi
    return "$status"
}

step() { printf '== packaging: %s (%ss so far)\n' "$1" "$SECONDS"; }

cd "$repo"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# Proxy variables stay as they are (pip and npm may need them to reach the
# registries); the test's own HTTP clients ignore them and talk to 127.0.0.1.

step "build tools (maturin, uv) into a virtualenv"
python3 -m venv "$work/build-venv"
bounded 300 "$work/build-venv/bin/pip" install --quiet -r "$repo/packaging/python/requirements-build.txt"

step "build the reverse-proxy binary (release, features cli) into the wheel's data directory"
# CARGO_TARGET_DIR, if set, is honoured, so a CI cache of the release build is reused.
bounded 1500 "$repo/packaging/python/stage-binary.sh"

step "build the wheel (release build of the extension module mcp_id_guard._core, with the staged binary)"
bounded 1500 "$work/build-venv/bin/maturin" build --release --out "$work/dist"
wheel="$(ls "$work"/dist/mcp_id_guard-"$version"-*.whl)"
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
python3 - "$wheel" <<'PYTHON'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for wanted in (".data/scripts/mcp-id-guard", "/LICENSE-MIT", "/LICENSE-APACHE",
               "mcp_id_guard/__init__.py", "mcp_id_guard/_core.pyi", "mcp_id_guard/py.typed"):
    if not any(name.endswith(wanted) for name in names):
        sys.exit(f"packaging: the wheel has no {wanted.lstrip('/')}: {names}")
if not any(name.startswith("mcp_id_guard/_core.") and name.endswith((".so", ".pyd")) for name in names):
    sys.exit(f"packaging: the wheel has no extension module mcp_id_guard._core: {names}")
if any("tests/" in name for name in names):
    sys.exit(f"packaging: the wheel carries the tests: {names}")
PYTHON

step "install the wheel into a fresh virtualenv, with the FastMCP server (mcp 1.27.0)"
python3 -m venv "$work/venv"
# One resolution: the wheel's own dependency (anyio) at the pinned version.
bounded 300 "$work/venv/bin/pip" install --quiet "$wheel" -r "$repo/packaging/python/requirements-test.txt"
installed="$work/venv/bin/mcp-id-guard"
if [ "$(timeout 30 "$installed" --version)" != "mcp-id-guard $version" ]; then
    echo "packaging: the installed command does not report version $version" >&2
    exit 1
fi
# The command as uvx runs it, from the wheel and nothing else: its one
# dependency (anyio, for the middleware) from local files pip fetched first.
bounded 300 "$work/venv/bin/pip" download --quiet --dest "$work/wheelhouse" "$wheel" \
    -c "$repo/packaging/python/requirements-test.txt"
uvx_version="$(UV_CACHE_DIR="$work/uv-cache" UV_NO_CONFIG=1 timeout 120 \
    "$work/build-venv/bin/uvx" --offline --no-index --find-links "$work/wheelhouse" --quiet \
    --from "$wheel" mcp-id-guard --version)"
if [ "$uvx_version" != "mcp-id-guard $version" ]; then
    echo "packaging: uvx --from the wheel printed '$uvx_version'" >&2
    exit 1
fi

step "pip: the ASGI middleware IdGuard (pytest python/tests) against the installed wheel"
# From a directory outside the checkout, with the tests' own rootdir and
# configuration: `import mcp_id_guard` must find the installed package (and
# its native _core), never python/mcp_id_guard of the source tree; the
# conftest refuses any copy outside the virtualenv.
mkdir -p "$work/pytest"
env -C "$work/pytest" "$work/venv/bin/python" -c 'import mcp_id_guard; print("packaging: testing", mcp_id_guard.__file__)'
# Each run leaves a JUnit report in $MCP_ID_GUARD_PYTEST_REPORTS when that is
# set (.ci/run checks them: tests ran, none failed, none skipped).
reports="${MCP_ID_GUARD_PYTEST_REPORTS:-$work/pytest-reports}"
mkdir -p "$reports"
# jlowin's FastMCP 4 needs mcp 2: its file runs in the mcp 2.3.0 suite below,
# and is left out here rather than skipped.
MCP_ID_GUARD_EXPECT_UNDER="$work/venv" PYTHONDONTWRITEBYTECODE=1 bounded 600 env -C "$work/pytest" \
    "$work/venv/bin/python" -m pytest -c "$repo/python/tests/pytest.ini" --rootdir "$repo/python/tests" \
    --junitxml "$reports/mcp1.xml" --ignore "$repo/python/tests/test_fastmcp.py" "$repo/python/tests"

step "pip: the same pytest suite with python-sdk 2.x (mcp 2.3.0, MCPServer) in a second fresh virtualenv"
python3 -m venv "$work/venv-mcp2"
bounded 300 "$work/venv-mcp2/bin/pip" install --quiet "$wheel" -r "$repo/packaging/python/requirements-test-mcp2.txt"
env -C "$work/pytest" "$work/venv-mcp2/bin/python" -c 'import mcp; from mcp.server.mcpserver import MCPServer; print("packaging: testing with mcp", mcp.__file__)'
MCP_ID_GUARD_EXPECT_UNDER="$work/venv-mcp2" PYTHONDONTWRITEBYTECODE=1 bounded 600 env -C "$work/pytest" \
    "$work/venv-mcp2/bin/python" -m pytest -c "$repo/python/tests/pytest.ini" --rootdir "$repo/python/tests" \
    --junitxml "$reports/mcp2.xml" "$repo/python/tests"

step "pip: 12 concurrent id-1 calls, FastMCP server alone vs. behind the installed mcp-id-guard"
bounded 180 "$work/venv/bin/python" "$repo/packaging/burst.py" --label pip --guard "$installed" \
    -- "$work/venv/bin/python" "$repo/packaging/python/fastmcp_echo_server.py"

step "pip: a polled request's id reused while the server runs it, FastMCP server alone vs. behind the installed mcp-id-guard"
# About 50 s when it passes: a trial that loses an answer by hanging costs its
# 8-second deadline, as the three of the bare early run always do.
bounded 300 "$work/venv/bin/python" "$repo/packaging/polling.py" --label pip-polling --guard "$installed" \
    -- "$work/venv/bin/python" "$repo/packaging/python/fastmcp_polling_server.py"

step "pip: the same polled-id trials with IdGuard in the FastMCP server's process (the installed wheel's middleware)"
bounded 300 "$work/venv/bin/python" "$repo/packaging/polling.py" --in-process --label pip-polling-in-process \
    -- "$work/venv/bin/python" "$repo/packaging/python/fastmcp_polling_server.py"

step "pip: mcp-id-guard probe finds the bug in the FastMCP server alone, and nothing behind the installed mcp-id-guard; README.md's probe sample is what it prints"
bounded 300 "$work/venv/bin/python" "$repo/packaging/probe.py" --label pip-probe --guard "$installed" --readme "$repo/README.md" \
    -- "$work/venv/bin/python" "$repo/packaging/python/fastmcp_echo_server.py"

step "npm: stage and pack the launcher package and this platform's binary package (binary from the wheel)"
npm_work="$work/npm"
mkdir -p "$npm_work/tarballs" "$npm_work/project" "$npm_work/project-no-optional"
"$work/venv/bin/python" - "$wheel" "$npm_work/mcp-id-guard" <<'PYTHON'
import shutil, sys, zipfile
wheel, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    (member,) = [name for name in archive.namelist() if name.endswith(".data/scripts/mcp-id-guard")]
    with archive.open(member) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out)
PYTHON
node "$repo/packaging/npm/stage.mjs" --version "$version" --binary "$npm_work/mcp-id-guard" --out "$npm_work/stage" >/dev/null
for package in "$npm_work"/stage/*/; do
    bounded 120 npm pack --silent --pack-destination "$npm_work/tarballs" "$package" >/dev/null
done
for tarball in "$npm_work"/tarballs/*.tgz; do
    listing="$(tar -tzf "$tarball")"
    for license in LICENSE-MIT LICENSE-APACHE; do
        grep -qx "package/$license" <<<"$listing" || { echo "packaging: $tarball has no $license" >&2; exit 1; }
    done
done
ls "$npm_work/tarballs"

step "npm: install the tarballs into a project with a TypeScript SDK server (@modelcontextprotocol/sdk 1.32.2)"
cp "$repo"/packaging/npm/test/{package.json,package-lock.json,echo-server.mjs} "$npm_work/project/"
npm_flags=(--no-audit --no-fund --loglevel=error)
bounded 300 npm ci "${npm_flags[@]}" --prefix "$npm_work/project"
# --offline: the other platforms' optional packages are not published, so npm
# must not ask the registry for them; missing optional packages are skipped.
bounded 120 npm install --offline "${npm_flags[@]}" --prefix "$npm_work/project" "$npm_work"/tarballs/*.tgz
echo '{"private": true}' >"$npm_work/project-no-optional/package.json"
bounded 120 npm install --offline --omit=optional "${npm_flags[@]}" --prefix "$npm_work/project-no-optional" \
    "$npm_work/tarballs/mcp-id-guard-$version.tgz"

step "npm: the installed command against hostile arguments and signals (node --test)"
MCP_ID_GUARD_NPM_BIN="$npm_work/project/node_modules/.bin/mcp-id-guard" \
    MCP_ID_GUARD_NPM_BIN_NO_OPTIONAL="$npm_work/project-no-optional/node_modules/.bin/mcp-id-guard" \
    MCP_ID_GUARD_VERSION="$version" \
    bounded 120 node --test "$repo/packaging/npm/test/launcher.test.mjs"

step "npm: 12 concurrent id-1 calls, TypeScript SDK server alone vs. behind the npm-installed mcp-id-guard"
bounded 180 "$work/venv/bin/python" "$repo/packaging/burst.py" --label npm \
    --guard "$npm_work/project/node_modules/.bin/mcp-id-guard" -- node "$npm_work/project/echo-server.mjs"

step "npm: the same with one command, mcp-id-guard --upstream-port N -- node echo-server.mjs (the server as the guard's child)"
bounded 180 "$work/venv/bin/python" "$repo/packaging/burst.py" --label npm-child --guard-runs-server \
    --guard "$npm_work/project/node_modules/.bin/mcp-id-guard" -- node "$npm_work/project/echo-server.mjs"

step "done: the wheel and the npm packages were built, installed and checked"
