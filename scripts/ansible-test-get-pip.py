"""Offline stand-in for the get-pip bootstrap script ansible-test downloads from ci-files.testing.ansible.com.

ansible-test caches that script at ~/.ansible/test/cache/get_pip_<version>.py and runs it with pip-install
arguments in each new sanity virtualenv. Where that host is unreachable (closed networks, a proxy), this
stand-in seeds pip from the interpreter's own ensurepip and lets that pip install what was asked for,
through the machine's pip configuration (index, proxy certificate). scripts/sanity.sh installs it only when
the real script cannot be fetched.
"""

import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
# ensurepip points PIP_CONFIG_FILE at /dev/null while it runs; the machine's pip configuration must apply.
os.environ.pop("PIP_CONFIG_FILE", None)
# get-pip's own --no-setuptools/--no-wheel mean "do not add them", which a plain pip install already does.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
