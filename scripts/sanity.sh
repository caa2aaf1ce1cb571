#!/usr/bin/env bash
# ansible-test sanity on exactly what the collection ships: build eagle3.ops, install the artifact into a
# temporary ansible_collections tree, run the sanity tests there (ansible-test wants the collection under
# ansible_collections/NAMESPACE/NAME), then remove the temporary tree.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${EAGLE3_VENV:-$PWD/.venv}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$venv/bin/ansible-galaxy" collection build --force --output-path "$work/dist" . >/dev/null
"$venv/bin/ansible-galaxy" collection install --force -p "$work/install" "$work"/dist/eagle3-ops-*.tar.gz >/dev/null
collection="$work/install/ansible_collections/eagle3/ops"

# ansible-test bootstraps pip in each sanity virtualenv with a script from ci-files.testing.ansible.com; when
# that is unreachable, cache the offline stand-in where ansible-test looks for the script.
pip_version=$("$venv/bin/python" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
import sys
print(get_venv_packages(NativePythonConfig(version=f"{sys.version_info[0]}.{sys.version_info[1]}"))["pip"])
PY
)
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
if [ ! -s "$cache" ]; then
  mkdir -p "$(dirname "$cache")"
  if ! "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" \
      "https://ci-files.testing.ansible.com/ansible-test/get-pip-${pip_version}.py" "$cache" 2>/dev/null; then
    cp scripts/ansible-test-get-pip.py "$cache"
  fi
fi

cd "$collection"
git init -q .  # ansible-test lists a collection's files with git when it can
PATH="$venv/bin:$PATH" "$venv/bin/ansible-test" sanity --python "$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" "$@"
