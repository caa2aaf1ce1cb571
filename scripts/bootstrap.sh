#!/usr/bin/env bash
# Prepare a Debian 12 machine (as root) to run eagle3-ops and its local lab:
# Debian packages for LXC and the ssh hop, then a project virtualenv in .venv with pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bootstrap: run as root (the lab needs LXC and a second sshd): sudo $0" >&2
  exit 1
fi

packages=(lxc debootstrap openssh-server openssh-client openssl psmisc iproute2 procps rsync python3-venv python3-pip python3-apt git)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
echo "bootstrap: ready (.venv with $(.venv/bin/ansible --version | head -1))"
