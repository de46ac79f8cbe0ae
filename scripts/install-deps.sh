#!/usr/bin/env bash
# Installs what testing the workspace needs on a fresh machine (building it needs only the Rust
# toolchain and a C compiler): curl, Debian's
# busybox-static (for the local busybox image), nftables and conntrack (the proxy's kernel tests,
# in network namespaces of their own), etcd and etcdctl (the
# etcd backend's tests), Prometheus (the metrics test scrapes a server with it), qemu-user-static
# (the aarch64 pause binary's test runs it under qemu-aarch64-static), the Python
# Kubernetes client, helm 3 and 4 with kubectl 1.33 and 1.37 (scripts/client-tools.sh) and
# cargo-nextest. Whatever is already there is left alone.
set -euo pipefail

need_apt=()
command -v curl >/dev/null || need_apt+=(curl)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v nft >/dev/null || need_apt+=(nftables)
command -v conntrack >/dev/null || need_apt+=(conntrack)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v etcdctl >/dev/null || need_apt+=(etcd-client)
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v qemu-aarch64-static >/dev/null || need_apt+=(qemu-user-static)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi
python3 -c 'import kubernetes' 2>/dev/null || python3 -m pip install -q kubernetes
"$(dirname "$0")/client-tools.sh"
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
