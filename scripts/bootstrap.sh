#!/usr/bin/env bash
# Prepare a Debian 12 machine (as root) to run eagle3-ops and its local lab:
# Debian packages for LXC and the ssh hop, then a project virtualenv in .venv with pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bootstrap: run as root (the lab needs LXC and a second sshd): sudo $0" >&2
  exit 1
fi

# Every package is named: nothing is left to Recommends (installed with --no-install-recommends), and
# nothing is assumed from the base image. What each is for:
#   lxc                         the lab's containers (lxc-start, lxc-attach, debian.common.conf)
#   debootstrap debian-archive-keyring gpgv wget
#                               the lab's container template, built and signature-checked from a Debian mirror
#   tar                         packing and unpacking that template
#   openssh-server openssh-client   the hypervisor ssh hop and the controller side of it
#   openssl                     the lab Proxmox API's certificate
#   psmisc procps iproute2      fuser/pkill/pgrep/ss, used by the lab, its tests and the cleanup checks
#   sudo e2fsprogs util-linux tmux   non-root hop tests, chattr (immutable-file tests), mount/umount, a tmux
#                               pane as the GPU-cleanup trials' terminal
#   ca-certificates             HTTPS to the package indexes
#   rsync git                   checkouts and copies of the collection in tests
#   python3-venv python3-pip python3-apt   the project virtualenv; ansible's apt module on the host
packages=(lxc debootstrap debian-archive-keyring gpgv wget tar openssh-server openssh-client openssl psmisc procps
  iproute2 sudo e2fsprogs util-linux tmux ca-certificates rsync git python3-venv python3-pip python3-apt)
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
# pip itself is pinned too (Python 3.11's ensurepip brings 23.2; a newer pip changes how builds are isolated).
pip_release=26.3
# PyTorch's CPU index: PyPI has only torch's CUDA build (several GB with its nvidia-* wheels), the CPU build is there
# (a copy in pip's find-links is taken as well). Asked for torch alone: pip retries an index it cannot reach for every
# package it looks up. EAGLE3_TORCH_INDEX= (empty) asks PyPI and pip's own configuration only.
torch_index=${EAGLE3_TORCH_INDEX-https://download.pytorch.org/whl/cpu}

# SGLang, the judge of what eagle3-ops derives for it (argument resolution, the EAGLE-3 weight loader), in
# its own environment: its pins (openai, tokenizers) differ from the project's, and it is CPU-only here.
# torch first and pinned (SGLang's metadata would pull a CUDA build), then the frozen list without deps.
sglang_env() {
  set -euo pipefail
  local lock=roles/sglang_runtime/files/requirements-cpu.lock
  if [ ! -x .venv-sglang/bin/python ]; then
    "$python" -m venv .venv-sglang
  fi
  if ! cmp -s "$lock" .venv-sglang/.installed-lock; then
    .venv-sglang/bin/python -m pip install -q "pip==$pip_release"
    # torch's dependencies are in the lock (installed below without resolving)
    .venv-sglang/bin/python -m pip install -q --no-deps ${torch_index:+--extra-index-url "$torch_index"} \
      "$(sed -n 's/^sglang_runtime_torch: //p' roles/sglang_runtime/defaults/main.yml)"
    .venv-sglang/bin/python -m pip install -q --no-deps -r "$lock"
    cp "$lock" .venv-sglang/.installed-lock
  fi
}
# sed, not head: head closes the pipe early and ansible then prints a "Broken pipe" traceback on reruns.
# SGLang's router (smg), pinned as the sglang_router role installs it: the unit tests of the router module
# drive the real router.
router_env() {
  set -euo pipefail
  local lock=roles/sglang_router/files/requirements.lock
  if [ ! -x .venv-router/bin/python ]; then
    "$python" -m venv .venv-router
  fi
  if ! cmp -s "$lock" .venv-router/.installed-lock; then
    .venv-router/bin/python -m pip install -q --no-deps -r "$lock"
    cp "$lock" .venv-router/.installed-lock
  fi
}
# The three environments are independent: SGLang's and the router's install while the project's does (each pip
# install is mostly one core's work; this machine has two or more).
sglang_env &
sglang_pid=$!
router_env &
router_pid=$!
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q "pip==$pip_release"
# The project and its tools under the frozen releases CI passed with (the file says how to regenerate it).
.venv/bin/python -m pip install -q -c scripts/requirements-dev.lock -e '.[dev]'
# This checkout is the collection eagle3.ops: ansible.cfg's collections_path starts at .venv, where this link
# makes eagle3.ops.* resolve to the working tree (edits apply at once, no reinstall).
mkdir -p .venv/ansible_collections/eagle3
ln -sfn ../../.. .venv/ansible_collections/eagle3/ops
# An installed copy of eagle3.ops in the user's collections (older molecule runs left one there) shadows the
# checkout for ansible-lint and goes stale: a copy of this very collection, reinstallable at any time.
stale=~/.ansible/collections/ansible_collections/eagle3/ops
if [ -f "$stale/MANIFEST.json" ] && [ ! -L "$stale" ] && grep -q '"namespace": "eagle3"' "$stale/MANIFEST.json"; then
  echo "bootstrap: removing the installed copy $stale (it shadows this checkout)"
  rm -rf "$stale"
fi
wait "$sglang_pid" || { echo "bootstrap: installing SGLang into .venv-sglang failed (see pip's error above)" >&2; exit 1; }
wait "$router_pid" || { echo "bootstrap: installing the router into .venv-router failed (see pip's error above)" >&2; exit 1; }
echo "bootstrap: ready (.venv with $(.venv/bin/ansible --version 2>/dev/null | sed -n 1p); .venv-sglang with sglang" \
  "$(.venv-sglang/bin/python -c 'from importlib.metadata import version; print(version("sglang"))'))"
