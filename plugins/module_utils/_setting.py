# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The served setting as given (``-e draft_tokens=...``, ``eagle3-ops deploy --draft-tokens``): read in this one place,
with its one default. Standard library only: the CLI reads it too."""

from __future__ import annotations

from typing import Any

# What the servers verify per step when nothing is given: 16, as the seeds served.
DEFAULT_DRAFT_TOKENS = 16
AUTO = "auto"


def served_setting(value: Any) -> dict[str, Any]:
    """``{"auto": bool, "draft_tokens": ...}`` for a given draft_tokens: ``auto`` (any case and spacing) asks for a
    benchmark's choice; nothing given (None, an empty string) is the default; anything else is kept as given, for
    sglang_speculative_args to judge (it names a bad value in one sentence)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return {"auto": True, "draft_tokens": AUTO}
    if value is None or (isinstance(value, str) and not value.strip()):
        return {"auto": False, "draft_tokens": DEFAULT_DRAFT_TOKENS}
    return {"auto": False, "draft_tokens": value}
