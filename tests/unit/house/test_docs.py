"""The documents a newcomer reads first stay short and true: the README's length and its two commands, the generated
documents (docs/timings.md, each role's README.md) as their scripts write them, the changelog fragments as
antsibull-changelog reads them, and one version_added for a collection never released before."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.modules import ROOT

README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def test_the_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md is {len(lines)} lines: keep it a newcomer's first page (at most 250)"
    assert max(len(line) for line in lines if not line.startswith(("```", "bash ", "|"))) <= 200


def test_the_two_commands_and_a_real_inventory_are_in_the_first_screens():
    text = README.read_text()
    first = "\n".join(text.splitlines()[:40])
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"timed tests (.+)", ci)
    assert test_command, ".ci/run names no test command"
    assert "ansible-playbook lab.yml" in first and "deploy.yml -e draft_tokens=16" in first
    command = f"bash scripts/bootstrap.sh && {test_command.group(1).strip()}"
    assert command in first, "the README's test command is the one .ci/run runs"
    screens = "\n".join(text.splitlines()[:120])
    assert "ansible_connection: eagle3.ops.pct" in screens and "pct_vmid:" in screens


@pytest.mark.parametrize("script", ["timings.py", "role_readmes.py"])
def test_generated_documents_are_what_their_scripts_write(script: str):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"], capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_every_role_has_a_readme():
    missing = [r.name for r in sorted((ROOT / "roles").iterdir()) if r.is_dir() and not (r / "README.md").exists()]
    assert not missing, f"roles without README.md: {missing} (python scripts/role_readmes.py writes them)"


def test_the_changelog_fragments_lint_clean():
    tool = BIN / "antsibull-changelog"
    assert tool.exists(), "antsibull-changelog is a dev dependency: bash scripts/bootstrap.sh installs it"
    proc = subprocess.run([str(tool), "lint"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    # The configuration writes the changelog a release will have (nothing released yet: no CHANGELOG.md).
    config = yaml.safe_load((ROOT / "changelogs" / "config.yaml").read_text())
    assert config["output"] == [{"file": "CHANGELOG.md", "format": "md"}]


def test_version_added_is_the_one_version():
    found = {}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for match in re.finditer(r'^version_added:\s*["\']?([\d.]+)', path.read_text(), re.MULTILINE):
            found[str(path.relative_to(ROOT))] = match.group(1)
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    wrong = {path: v for path, v in found.items() if v != version}
    assert found and not wrong, f"version_added other than the collection's {version}: {wrong}"
