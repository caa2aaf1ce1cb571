"""Fixtures the modules' tests share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from tests.unit.plugins.modules.test_eagle3_export import speculators_config
from tests.unit.plugins.modules.test_safetensors_remap import drafter_tensors


@pytest.fixture
def epoch(tmp_path) -> Path:
    """One epoch's checkpoint as speculators saves it (train/4: the drafter's tensors and its config.json)."""
    d = tmp_path / "train" / "4"
    d.mkdir(parents=True)
    save_file(drafter_tensors(), str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(speculators_config()))
    return d
