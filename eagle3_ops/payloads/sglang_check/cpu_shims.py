"""What SGLang 0.5.23 needs to import and build models on a CPU-only host. Every shim here, and why.

Nothing in this file changes what SGLang computes: each shim stands in for a library that has no CPU
build on the package index and that the code paths eagle3-ops runs (argument resolution, the EAGLE-3
draft model's construction and ``load_weights``, the torch_native CPU server) never call.

1. ``torchvision_operator_schemas``: every torchvision wheel on the index links CUDA libraries, so its
   C++ operators fail to load beside the CPU torch, and ``import torchvision`` then stops at its meta
   registrations ("operator torchvision::nms does not exist"). SGLang imports ``torchvision.transforms``
   at import time (multimodal configs). Defining the two schemas it registers against (``nms``, ``qnms``)
   lets the pure-Python part import; calling either operator still fails, loudly.
2. ``sgl_kernel_stand_in``: ``sgl_kernel`` (SGLang's CUDA/AMX kernels) has no CPU build on the index and
   is imported by model code. SGLang's own tests install a MagicMock module for this; in ours every name
   resolves but raises when called, so a kernel that is actually used fails instead of returning a mock.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

NO_KERNEL = "sgl_kernel.{name} has no CPU build; eagle3-ops' stand-in only lets SGLang import (cpu_shims.py)"


def torchvision_operator_schemas() -> bool:
    """Define torchvision::nms and ::qnms when torchvision's own operators cannot load; True when defined.

    A host whose torchvision build matches its torch (a GPU fleet) loads the real operators and is left alone:
    defining the schemas there would collide with torchvision's own registration.
    """
    import glob
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False  # no torchvision at all: nothing registers against these operators
    for lib in glob.glob(os.path.join(next(iter(spec.submodule_search_locations)), "_C*.so")):
        try:
            torch.ops.load_library(lib)
            return False  # a working build: torchvision registers its operators itself
        except OSError:
            break  # linked against libraries this host lacks (CUDA): the case this shim exists for
    if "_torchvision_lib" in globals():
        return True
    # Schemas as torchvision declares them (torchvision/csrc/ops/nms.cpp); calling either still fails, loudly.
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    globals()["_torchvision_lib"] = lib  # the Library object must outlive this call, or the schemas go with it
    return True


class _Unavailable:
    """Any name under sgl_kernel: attribute chains resolve (``scalar_types.uint4b8``), calls raise."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(NO_KERNEL.format(name=self._name))

    def __repr__(self) -> str:
        return f"<unavailable sgl_kernel.{self._name}>"


class _NoKernel(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(name)


class _NoKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _NoKernel(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


def sgl_kernel_stand_in() -> bool:
    """Install the stand-in when the real sgl_kernel does not import; True when the stand-in is in place."""
    if any(isinstance(f, _NoKernelFinder) for f in sys.meta_path):
        return True
    try:
        import sgl_kernel  # noqa: F401

        return False
    except (ImportError, OSError):
        sys.modules.pop("sgl_kernel", None)
    sys.meta_path.insert(0, _NoKernelFinder())
    return True


def apply(models: bool = False) -> list[str]:
    """The shims needed before ``import sglang``; ``models`` adds what building a model needs. Returns their names."""
    applied = []
    if torchvision_operator_schemas():
        applied.append("torchvision_operator_schemas")
    if models:
        # SGLang picks its CPU code paths (and skips CUDA-only ones) from this variable.
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        if sgl_kernel_stand_in():
            applied.append("sgl_kernel_stand_in")
    return applied
