"""``python -m sglang_check.launch_server ARGS``: SGLang's own launch_server, after the CPU shims.

On a CPU-only host SGLang needs cpu_shims.py applied before it is imported (torchvision's operator schemas,
the sgl_kernel stand-in); this entry point applies them in the server process and hands the arguments to
``sglang.launch_server`` unchanged. The shims reach SGLang's child processes (scheduler, detokenizer) too:
they are fresh interpreters (multiprocessing spawn), so main() puts ``site/`` on PYTHONPATH, where
``sitecustomize.py`` applies the shims at their start-up.
On a GPU host, run ``python -m sglang.launch_server`` directly.
"""

from __future__ import annotations

import os
import runpy
import sys

try:
    from . import cpu_shims
except ImportError:  # pragma: no cover - run as a loose script
    import cpu_shims  # type: ignore[no-redef]


def main() -> None:
    # The children SGLang spawns start from scratch: sitecustomize (site/) applies the shims there.
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "site"), os.path.dirname(here), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ["EAGLE3_SGLANG_CPU_SHIMS"] = "1"
    cpu_shims.apply(models=True)
    sys.argv[0] = "sglang.launch_server"
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
