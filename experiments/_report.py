"""Small helpers shared by the pipelines: tables, number formatting, figures, progress.

Figures are built with :class:`matplotlib.figure.Figure` directly (no ``pyplot``), so
they render with the Agg canvas without touching matplotlib's global backend, and work
unchanged in notebooks, in tests and on headless machines.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from matplotlib.figure import Figure
from tqdm import tqdm

from experiments._outcome import UNRESOLVED

__all__ = [
    "elapsed_bar",
    "fmt",
    "markdown_table",
    "new_figure",
    "progress",
    "run_caption",
    "save_figure",
]

T = TypeVar("T")


def fmt(value: Any, spec: str = ".3g") -> str:
    """Format a number for a table; ``None``/NaN become ``n/a``, bools ``yes``/``no``.

    >>> fmt(0.000123456), fmt(None), fmt(float("inf")), fmt(True)
    ('0.000123', 'n/a', 'inf', 'yes')
    """
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Render a GitHub-flavoured markdown table; numbers are right-aligned.

    >>> print(markdown_table(["a", "b"], [["x", 1.5]]))
    | a | b |
    |---|---:|
    | x | 1.5 |
    """
    rows = [[fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(
                f"table row {r} has {len(r)} cells; expected {len(headers)} to match "
                f"the headers {list(headers)}."
            )
    numeric = [
        all(_looks_numeric(r[i]) for r in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def checks_section(
    checks: Mapping[str, bool], unresolved: Mapping[str, str] | None = None
) -> list[str]:
    """Markdown lines of a report's "Checks" section, one line per check; a failed
    check in ``unresolved`` (name -> measured spread) is shown as unresolved.

    >>> checks_section({"finite": True})
    ['## Checks', '', '- finite: pass']
    >>> checks_section({"fast": False}, {"fast": "spread 0.9-1.1"})[-1]
    '- fast: unresolved (machine load), spread 0.9-1.1'
    """
    unresolved = unresolved or {}

    def status(name: str, ok: bool) -> str:
        if ok:
            return "pass"
        if name in unresolved:
            return f"{UNRESOLVED}, {unresolved[name]}"
        return "FAIL"

    return ["## Checks", ""] + [
        f"- {name}: {status(name, ok)}" for name, ok in checks.items()
    ]


def _looks_numeric(text: str) -> bool:
    if text in ("n/a", "inf", "-inf"):
        return True
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def progress(
    iterable: Iterable[T], *, desc: str, total: int | None = None
) -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm progress bar on stderr (hidden when not a TTY)."""
    return iter(
        tqdm(
            iterable,
            desc=desc,
            total=total,
            file=sys.stderr,
            disable=None,
            leave=False,
            dynamic_ncols=True,
        )
    )


@contextlib.contextmanager
def elapsed_bar(
    desc: str, expected_s: float | None, *, tick_s: float = 0.5
) -> Iterator[tqdm]:
    """A tqdm bar on stderr that fills with wall time against ``expected_s``.

    A background thread advances it every ``tick_s`` seconds while the body runs;
    past the expected time the bar stays full and the elapsed time keeps counting.
    Like :func:`progress`, it is hidden when stderr is not a terminal.

    >>> with elapsed_bar("demo", 1.0, tick_s=0.01) as bar:
    ...     pass
    >>> bar.total
    1.0
    """
    bar = tqdm(
        total=expected_s,
        desc=desc,
        file=sys.stderr,
        disable=None,
        leave=False,
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} of ~{total:.0f} s"
        if expected_s
        else "{desc}: {elapsed}",
    )
    done = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not done.wait(tick_s):
            elapsed = time.monotonic() - start
            bar.n = min(elapsed, expected_s) if expected_s else elapsed
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        done.set()
        thread.join()
        bar.close()


def new_figure(
    nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] = (6.4, 4.2)
) -> tuple[Figure, Any]:
    """Create a figure of ``nrows x ncols`` panels, each ``size`` inches.

    Returns:
        ``(figure, axes)`` where ``axes`` is a 2-D numpy array of Axes.
    """
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def run_caption(env: Mapping[str, Any]) -> str:
    """Where and at what scale a result was produced, for figure titles.

    Args:
        env: a :func:`experiments._framework.capture_environment` dict.

    >>> run_caption({"scale": "quick", "backend": "cpu", "cpu_model": "AMD EPYC",
    ...              "cpu_count": 2, "device_kind": "cpu"})
    'quick scale, CPU: AMD EPYC (2 logical CPUs)'
    """
    if env.get("backend") == "cpu":
        model, count = env.get("cpu_model", "unknown"), env.get("cpu_count")
        machine = f"CPU: {model} ({count} logical CPUs)"
    else:
        machine = f"{str(env.get('backend')).upper()}: {env.get('device_kind')}"
    return f"{env.get('scale')} scale, {machine}"


def save_figure(fig: Figure, path: Path, *, caption: str = "", dpi: int = 110) -> Path:
    """Save ``fig`` as PNG at ``path`` and return the path.

    A ``caption`` (usually :func:`run_caption`) goes under the figure's own
    title, or becomes the title of a figure without one.
    """
    if caption:
        title = fig.get_suptitle()
        fig.suptitle(
            f"{title}\n{caption}" if title else caption,
            fontsize="medium" if title else "small",
        )
    fig.savefig(path, dpi=dpi)
    return path
