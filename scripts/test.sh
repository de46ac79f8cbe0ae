#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh machine it first installs what the tests need
# (scripts/install-deps.sh) and builds the local images into Docker.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
# No address of the default service range (10.96.0.0/12) or cluster range (10.244.0.0/16) may
# leave this machine while the tests run: route both here first, exactly as every node agent
# routes them before its first sync or pod (`ip route replace`, so an agent's own is the same
# route). Tests that run agents give their clusters service ranges of their own, which those
# agents route.
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  ip route replace local 10.96.0.0/12 dev lo table local
  ip route replace unreachable 10.244.0.0/16 proto 83
fi
checker=../shared/tools/ranges-stay-local.sh
if [ -x "$checker" ]; then
  "$checker" 10.96.0.0/12 10.244.0.0/16
fi
cargo build --workspace --bins
if docker info >/dev/null 2>&1; then
  ./target/debug/skiff images build
fi
status=0
cargo nextest run --workspace --no-fail-fast "$@" || status=$?
# The kubectl suites again with kubectl 1.33 (the version the server reports) and 1.37 (the newest
# released), installed by scripts/client-tools.sh; the system kubectl ran them above. Only when the
# whole workspace was asked for.
if [ $# -eq 0 ]; then
  for version in 1.33 1.37; do
    SKIFF_KUBECTL="${SKIFF_CLIENTS:-/opt/skiff-clients}/kubectl-$version" \
      cargo nextest run -p skiff --no-fail-fast --test kubectl_basics --test kubectl_test_cmd --test crds --test workloads \
      || status=$?
  done
fi
exit "$status"
