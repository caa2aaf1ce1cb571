"""Code that runs inside the containers, not on the controller: roles pack these packages and unpack them into
the container's payload directory (eagle3_payload), where the container's runtimes import them.

- ``training``: data, hidden states, training launcher and monitor (the payload venv: torch, speculators).
- ``serving``: the reference engine and its benchmark client (the payload venv).
- ``sglang_check``: SGLang's own argument resolution and loader, and the CPU launcher (the SGLang venv).
- ``vllm_cpu``: vLLM's hidden-state connectors for its CPU build (the vLLM venv).
- ``lab_target``: the lab's tiny target and the CPU shim for speculators' trainer (the lab only).

Each package imports what its runtime has (torch, transformers, SGLang, vLLM); none imports the controller's
``eagle3_ops`` modules.
"""
