#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh machine it first installs what the tests need
# (scripts/install-deps.sh) and builds the local images into Docker.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cargo build --workspace --bins
if docker info >/dev/null 2>&1; then
  ./target/debug/skiff images build
fi
cargo nextest run --workspace --no-fail-fast "$@"
