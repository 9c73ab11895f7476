"""Reading the documentation's examples: the README and the pages under ``docs/``.

One home for the rule that finds a page's ```` ```python ```` blocks, shared by the
tests that run them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    """Every ```` ```python ```` block of ``path`` that starts at the margin, as
    written (a block indented inside a list would not run when copied)."""
    return python_blocks_in(path.read_text())


def block_after(path: Path, heading: str) -> str:
    """The first Python block of ``path`` after the text ``heading``."""
    text = path.read_text()
    if heading not in text:
        raise ValueError(f"{path.relative_to(ROOT)} has no {heading!r}")
    blocks = python_blocks_in(text[text.index(heading) :])
    if not blocks:
        raise ValueError(f"no Python block after {heading!r} in {path.name}")
    return blocks[0]


def python_blocks_in(text: str) -> list[str]:
    """The Python blocks of ``text`` (see :func:`python_blocks`)."""
    return _BLOCK.findall(text)
