"""Sizes a reader can hold in mind, read from the source (nothing is imported).

No file over :data:`MAX_FILE_LINES` lines and no function over
:data:`MAX_FUNCTION_LINES` lines (counted from its first statement after the
docstring to its end) remain without a reason written next to it. The reason is a
comment ``# long: <why>``: for a function on its ``def`` line (or the line of its
signature's closing parenthesis), for a file among its first lines (before the
first ``import``). A file that cannot carry the comment goes on :data:`ALLOWED`
with the reason (an entry whose file or function is back within the limits
fails the run, so the list cannot go stale).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("mpjax", "lbm_jax", "experiments", "tests")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MARKER = re.compile(r"#\s*long:\s*\S")

#: Offenders allowed here, by path (a file) or ``path:function``, with the reason.
ALLOWED: dict[str, str] = {}


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def _function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's end."""
    body = node.body
    first = body[0]
    if (
        len(body) > 1
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        first = body[1]
    return node.end_lineno - first.lineno + 1


def _header_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> range:
    """The lines of a function's ``def`` up to the end of its signature."""
    return range(node.lineno, node.body[0].lineno)


def _file_marked(lines: list[str]) -> bool:
    for line in lines:
        if line.startswith(("import ", "from ")):
            return False
        if MARKER.search(line):
            return True
    return False


def offenders(path: Path, text: str) -> list[str]:
    """``path`` (too long) and ``path:function (N lines)`` (too long), unmarked
    and not allowed, for one source file."""
    rel = path.relative_to(ROOT).as_posix() if path.is_absolute() else str(path)
    lines = text.splitlines()
    found = []
    if len(lines) > MAX_FILE_LINES and rel not in ALLOWED and not _file_marked(lines):
        found.append(f"{rel} ({len(lines)} lines)")
    for node in ast.walk(ast.parse(text, filename=rel)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = _function_length(node)
        if length <= MAX_FUNCTION_LINES or f"{rel}:{node.name}" in ALLOWED:
            continue
        header = [lines[i - 1] for i in _header_lines(node)]
        if not any(MARKER.search(line) for line in header):
            found.append(f"{rel}:{node.name} ({length} lines)")
    return found


def test_the_size_check_finds_long_functions_and_files():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    source = f'def f():\n    """Doc."""\n{long_body}\n'
    assert offenders(Path("a.py"), source) == [
        f"a.py:f ({MAX_FUNCTION_LINES + 1} lines)"
    ]
    marked = source.replace("def f():", "def f():  # long: one table, read in order")
    assert offenders(Path("a.py"), marked) == []
    short = f'def f():\n    """Doc."""\n{long_body.split(chr(10), 1)[1]}\n'
    assert offenders(Path("a.py"), short) == []
    big = "x = 1\n" * (MAX_FILE_LINES + 1)
    assert offenders(Path("b.py"), big) == [f"b.py ({MAX_FILE_LINES + 1} lines)"]
    assert offenders(Path("b.py"), "# long: generated table\n" + big) == []


def stale_entries(allowed: Iterable[str]) -> list[str]:
    """Allow-list entries naming nothing, or something back within the limits."""
    stale = []
    for entry in allowed:
        path, _, function = entry.partition(":")
        if not (ROOT / path).is_file():
            stale.append(entry)
            continue
        text = (ROOT / path).read_text()
        if not function:
            if len(text.splitlines()) <= MAX_FILE_LINES:
                stale.append(entry)
            continue
        lengths = [
            _function_length(n)
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name == function
        ]
        if not lengths or max(lengths) <= MAX_FUNCTION_LINES:
            stale.append(entry)
    return stale


def test_allowed_entries_still_exist():
    stale = stale_entries(ALLOWED)
    assert not stale, (
        "allow-list entries naming nothing or nothing too long (remove them): "
        + ", ".join(stale)
    )


def test_stale_entries_are_found():
    assert stale_entries(["tests/test_sizes.py", "tests/test_sizes.py:offenders"]) == [
        "tests/test_sizes.py",
        "tests/test_sizes.py:offenders",
    ]
    assert stale_entries(["no/such/file.py"]) == ["no/such/file.py"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_long_files_or_functions_without_a_reason(folder):
    bad = [
        found
        for path in _sources()
        if path.relative_to(ROOT).parts[0] == folder
        for found in offenders(path, path.read_text())
    ]
    assert not bad, (
        f"files over {MAX_FILE_LINES} lines or functions over {MAX_FUNCTION_LINES} "
        "lines (docstring excluded); split them by topic, or write the reason as "
        "'# long: <why>' on the def line (a function) or above the imports (a "
        "file):\n" + "\n".join(bad)
    )
