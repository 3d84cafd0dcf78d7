#!/usr/bin/env bash
# System packages the tests need beyond Python: a real SLURM (slurm-wlm, munge) and Grid
# Engine (gridengine-*), which tests/jobqueue start on this machine, and `ip` (iproute2)
# and nsenter/unshare (util-linux) for the multi-host tests, which build hosts from
# network namespaces; Chromium (chromium) for the dashboard's browser tests
# (tests/browser, driven by playwright, which never downloads its own browsers). Idempotent and quick when they are there; needs root and apt-get,
# and otherwise says so and does nothing (those tests then skip with the reason, and
# fail under CI=true).
set -euo pipefail
packages=(slurm-wlm munge gridengine-master gridengine-exec gridengine-client chromium)
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
command -v ip >/dev/null || missing+=(iproute2)
{ command -v nsenter >/dev/null && command -v unshare >/dev/null; } || missing+=(util-linux)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-system-deps: not root or no apt-get: not installing ${missing[*]}" \
        "(the tests needing them will skip)" >&2
    exit 0
fi
echo "install-system-deps: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
