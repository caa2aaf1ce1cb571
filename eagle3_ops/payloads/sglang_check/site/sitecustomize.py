"""Applies eagle3-ops' SGLang CPU shims at interpreter start-up, in every process SGLang spawns.

Only on PYTHONPATH when ``sglang_check.launch_server`` starts SGLang, and only active with
``EAGLE3_SGLANG_CPU_SHIMS=1``: SGLang's scheduler and detokenizer are fresh interpreters (multiprocessing
spawn), so the shims have to be in place before their first import of SGLang too.
"""

import os

if os.environ.get("EAGLE3_SGLANG_CPU_SHIMS") == "1":
    from sglang_check import cpu_shims

    cpu_shims.apply(models=True)
