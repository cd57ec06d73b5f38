#!/usr/bin/env node
// Runs the native `mcp-id-guard` binary from the platform package npm installed
// next to this one (`@mcp-id-guard/<platform>`, an optional dependency that
// only installs where its `os`, `cpu` and `libc` match).
"use strict";

const { spawn } = require("node:child_process");
const { platforms, platformKey, packageName, binaryFile } = require("../platform.js");

function fail(message) {
  process.stderr.write(`mcp-id-guard: ${message}\n`);
  process.exit(1);
}

function binaryPath() {
  const key = platformKey();
  if (!Object.hasOwn(platforms, key)) {
    fail(`no prebuilt binary for ${key}; build one with: cargo install mcp-id-guard --features cli`);
  }
  try {
    return require.resolve(`${packageName(key)}/${binaryFile(key)}`);
  } catch {
    fail(
      `the package ${packageName(key)} is missing (installed with --omit=optional?); ` +
        "reinstall mcp-id-guard with its optional dependencies",
    );
  }
}

// No shell: the arguments reach the binary exactly as given.
const child = spawn(binaryPath(), process.argv.slice(2), { stdio: "inherit" });

// A supervisor that stops this process (SIGTERM) must stop the proxy too and
// let it finish open exchanges; this process then ends the way the proxy did.
const forwarded = ["SIGINT", "SIGTERM", "SIGHUP"];
for (const signal of forwarded) {
  process.on(signal, () => child.kill(signal));
}
child.on("error", (error) => fail(`could not start ${error.path || "the binary"}: ${error.message}`));
child.on("exit", (code, signal) => {
  if (signal) {
    for (const name of forwarded) process.removeAllListeners(name);
    process.kill(process.pid, signal);
  } else {
    process.exit(code);
  }
});
