// What a hostile or careless caller does to the installed `mcp-id-guard` npm
// command (the launcher in front of the native binary). Run by
// packaging/test-packages.sh with `node --test`; MCP_ID_GUARD_NPM_BIN is the
// installed command, MCP_ID_GUARD_NPM_BIN_NO_OPTIONAL the same command
// installed with --omit=optional. Loopback only; every wait is bounded.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

const bin = process.env.MCP_ID_GUARD_NPM_BIN;
const binWithoutOptional = process.env.MCP_ID_GUARD_NPM_BIN_NO_OPTIONAL;
const version = process.env.MCP_ID_GUARD_VERSION;
const DEADLINE_MS = 15_000;

function run(command, args, options = {}) {
  return spawnSync(command, args, { encoding: "utf8", timeout: DEADLINE_MS, ...options });
}

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

function accepts(port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host: "127.0.0.1", port });
    socket.setTimeout(1000);
    socket.once("connect", () => (socket.destroy(), resolve(true)));
    socket.once("error", () => resolve(false));
    socket.once("timeout", () => (socket.destroy(), resolve(false)));
  });
}

async function until(condition, what) {
  const deadline = Date.now() + DEADLINE_MS;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test("runs the native binary of the platform package", () => {
  const result = run(bin, ["--version"]);
  assert.equal(result.status, 0, result.stderr);
  assert.equal(result.stdout.trim(), `mcp-id-guard ${version}`);
});

test("arguments reach the binary verbatim, never through a shell", () => {
  const dir = mkdtempSync(join(tmpdir(), "mcp-id-guard-launcher-"));
  try {
    const hostile = `$(touch ${join(dir, "a")}); \`touch ${join(dir, "b")}\` | touch ${join(dir, "c")}`;
    const result = run(bin, ["--listen", "127.0.0.1:0", "--upstream", hostile], { cwd: dir });
    assert.notEqual(result.status, 0);
    assert.ok(result.stderr.includes(JSON.stringify(hostile).slice(1, -1)), result.stderr);
    for (const name of ["a", "b", "c"]) assert.equal(existsSync(join(dir, name)), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the binary's exit status is the command's", () => {
  const result = run(bin, ["--no-such-flag"]);
  assert.equal(result.status, 2, result.stderr); // clap's usage error
});

test("SIGTERM to the command stops the proxy behind it", async () => {
  const port = await freePort();
  // Nothing listens on the upstream; the proxy starts all the same.
  const upstreamPort = await freePort();
  const launcher = spawn(bin, ["--listen", `127.0.0.1:${port}`, "--upstream", `http://127.0.0.1:${upstreamPort}`], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  launcher.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => launcher.once("exit", (code, signal) => resolve({ code, signal })));
  let proxyPid;
  try {
    await until(() => accepts(port), `the proxy on 127.0.0.1:${port}`);
    const children = readFileSync(`/proc/${launcher.pid}/task/${launcher.pid}/children`, "utf8").trim().split(/\s+/);
    assert.equal(children.length, 1, `children of the launcher: ${children}`);
    proxyPid = Number(children[0]);
    launcher.kill("SIGTERM");
    const outcome = await Promise.race([
      exited,
      new Promise((_, reject) => setTimeout(() => reject(new Error("the command did not exit")), DEADLINE_MS).unref()),
    ]);
    assert.ok(outcome.code === 0 || outcome.signal === "SIGTERM", `${JSON.stringify(outcome)} ${stderr}`);
    assert.equal(alive(proxyPid), false, "the proxy outlived the command");
    assert.equal(await accepts(port), false, "the port still accepts");
  } finally {
    launcher.kill("SIGKILL");
    // A launcher that fails this test leaves the proxy running: stop it here.
    if (proxyPid !== undefined && alive(proxyPid)) process.kill(proxyPid, "SIGKILL");
  }
});

test("a missing platform package is a clear error, not a crash", () => {
  const result = run(binWithoutOptional, ["--version"]);
  assert.equal(result.status, 1);
  assert.match(result.stderr, /@mcp-id-guard\/\S+ is missing/);
});
