// Which platform package carries the binary for this machine. Shared by the
// launcher and by the script that stages the packages (packaging/npm/stage.mjs).
"use strict";

const platforms = require("./platforms.json");

/** `linux-x64-gnu`, `darwin-arm64`, `win32-x64-msvc`, ...: a key of platforms.json when supported. */
function platformKey() {
  let key = `${process.platform}-${process.arch}`;
  if (process.platform === "linux") {
    // Node built against glibc reports its version; on musl (Alpine) it does not.
    const glibc = process.report && process.report.getReport().header.glibcVersionRuntime;
    key += glibc ? "-gnu" : "-musl";
  } else if (process.platform === "win32") {
    key += "-msvc";
  }
  return key;
}

/** The npm name of the package that carries the binary for `key`. */
function packageName(key) {
  return `@mcp-id-guard/${key}`;
}

/** The binary's path inside its platform package. */
function binaryFile(key) {
  return `bin/mcp-id-guard${platforms[key].exe || ""}`;
}

module.exports = { platforms, platformKey, packageName, binaryFile };
