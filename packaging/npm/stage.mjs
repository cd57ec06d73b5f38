// Lays out the npm packages ready for `npm pack`: the launcher package
// `mcp-id-guard` (version and optional dependencies filled in) and the
// platform package that carries the binary built on this machine.
//
//   node stage.mjs --version 0.1.0 --binary path/to/mcp-id-guard --out DIR
//
// Publishing for every platform means running the platform half once per
// entry of platforms.json with that target's binary (see packaging/README.md).
import { chmodSync, copyFileSync, cpSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const here = dirname(fileURLToPath(import.meta.url));
const launcherDir = join(here, "mcp-id-guard");
const { platforms, platformKey, packageName, binaryFile } = createRequire(import.meta.url)(
  join(launcherDir, "platform.js"),
);

const { values } = parseArgs({
  options: {
    version: { type: "string" },
    binary: { type: "string" },
    out: { type: "string" },
    platform: { type: "string", default: platformKey() },
  },
});
for (const name of ["version", "binary", "out"]) {
  if (!values[name]) throw new Error(`--${name} is required`);
}
const { version, binary, out, platform: key } = values;
if (!Object.hasOwn(platforms, key)) throw new Error(`unknown platform ${key}`);

const launcher = JSON.parse(readFileSync(join(launcherDir, "package.json"), "utf8"));
launcher.version = version;
launcher.optionalDependencies = Object.fromEntries(
  Object.keys(platforms).map((platformName) => [packageName(platformName), version]),
);
const licenses = ["LICENSE-MIT", "LICENSE-APACHE"];
const copyLicenses = (dir) => {
  for (const name of licenses) copyFileSync(join(here, "..", "..", name), join(dir, name));
};

const launcherOut = join(out, "mcp-id-guard");
cpSync(launcherDir, launcherOut, { recursive: true });
writeFileSync(join(launcherOut, "package.json"), `${JSON.stringify(launcher, null, 2)}\n`);
copyLicenses(launcherOut);

const { os, cpu, libc, rustTarget } = platforms[key];
const platformPackage = {
  name: packageName(key),
  version,
  description: `The mcp-id-guard binary for ${rustTarget}; installed by the mcp-id-guard package`,
  license: launcher.license,
  homepage: launcher.homepage,
  os: [os],
  cpu: [cpu],
  ...(libc ? { libc: [libc] } : {}),
  files: [binaryFile(key), ...licenses],
  preferUnplugged: true,
};
const platformOut = join(out, key);
mkdirSync(join(platformOut, "bin"), { recursive: true });
writeFileSync(join(platformOut, "package.json"), `${JSON.stringify(platformPackage, null, 2)}\n`);
writeFileSync(
  join(platformOut, "README.md"),
  `# ${packageName(key)}\n\nThe \`mcp-id-guard\` binary for ${rustTarget}. Install \`mcp-id-guard\` instead.\n`,
);
copyLicenses(platformOut);
copyFileSync(binary, join(platformOut, binaryFile(key)));
chmodSync(join(platformOut, binaryFile(key)), 0o755);
console.log(`${launcherOut}\n${platformOut}`);
