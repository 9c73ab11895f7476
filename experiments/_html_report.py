"""``index.html``: every pipeline's report, tables and figures on one static page.

The page is self-contained (figures inlined as ``data:`` URIs, styles inline), so it
opens from disk in any browser and can be mailed or archived as one file. Each
section is a pipeline's ``REPORT.md`` rendered with markdown-it; figures a report
does not show are appended to its section, so every figure appears.
"""

from __future__ import annotations

import base64
import html
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from experiments._outcome import PipelineOutcome

__all__ = ["write_index"]

_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1150px; margin: 2em auto;
       padding: 0 1em; color: #222; }
nav { background: #f4f4f4; padding: 0.6em 1em; border-radius: 6px; }
nav a { margin-right: 1em; }
section { border-top: 2px solid #ddd; margin-top: 2.5em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; }
th { background: #eee; }
td { text-align: right; }
td:first-child { text-align: left; }
img { max-width: 100%; display: block; margin: 0.8em 0; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 3px; }
pre { background: #f4f4f4; padding: 0.6em; overflow-x: auto; }
.fail { color: #c62828; font-weight: bold; }
"""


def _renderer(base: Path, prefix: str, shown: set[str]) -> MarkdownIt:
    """markdown-it with tables; images of ``base`` inlined, links made page-relative.

    ``prefix`` (``"amp/"``) is the report's folder relative to the page; a link to
    another report (``amp/REPORT.md``) becomes a jump to its section.
    """
    md = MarkdownIt("commonmark").enable("table")
    default_image = md.renderer.rules["image"]

    def image(_self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        src = str(token.attrGet("src") or "")
        path = base / src
        if src.endswith(".png") and path.is_file() and "/" not in src:
            shown.add(src)
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            token.attrSet("src", f"data:image/png;base64,{data}")
        return default_image(tokens, idx, options, env)

    def link_open(_self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        href = str(token.attrGet("href") or "")
        if href.endswith("/REPORT.md") and "/" not in href[: -len("/REPORT.md")]:
            token.attrSet("href", "#" + href[: -len("/REPORT.md")])
        elif href and "://" not in href and not href.startswith("#"):
            token.attrSet("href", prefix + href)
        return md.renderer.renderToken(tokens, idx, options, env)

    md.add_render_rule("image", image)
    md.add_render_rule("link_open", link_open)
    return md


def _section(out_root: Path, outcome: PipelineOutcome) -> str:
    name = outcome.name
    head = f'<section id="{html.escape(name)}">'
    folder = out_root / name
    report = folder / "REPORT.md"
    if outcome.out_dir is None or not report.is_file():
        last = (outcome.error or "no report").strip().splitlines()[-1]
        return (
            f"{head}<h1>{html.escape(name)}</h1><p class='fail'>No results: "
            f"{html.escape(last)}</p></section>"
        )
    shown: set[str] = set()
    body = _renderer(folder, f"{name}/", shown).render(report.read_text())
    extra = [p for p in sorted(folder.glob("*.png")) if p.name not in shown]
    if extra:
        more = "".join(f"![{p.stem}]({p.name})\n\n" for p in extra)
        body += "<h2>More figures</h2>" + _renderer(folder, "", shown).render(more)
    return f"{head}{body}</section>"


def write_index(
    out_root: Path, outcomes: Sequence[PipelineOutcome], *, scale: str
) -> Path:
    """Write ``out_root/index.html`` from ``REPORT.md`` and the pipelines' reports.

    Args:
        out_root: the results folder (holds ``REPORT.md`` and one folder per
            pipeline).
        outcomes: the pipelines of the run, in their order.
        scale: the run's scale, for the title.

    Returns:
        The path of the page.
    """
    out_root = Path(out_root)
    summary = _renderer(out_root, "", set()).render(
        (out_root / "REPORT.md").read_text()
    )
    nav = " ".join(
        f'<a href="#{html.escape(o.name)}">{html.escape(o.name)}</a>' for o in outcomes
    )
    page = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>mpjax + lbm_jax results ({html.escape(scale)} scale)</title>"
        f"<style>{_STYLE}</style></head><body>\n"
        f"<nav>{nav}</nav>\n<section id='summary'>{summary}</section>\n"
        + "\n".join(_section(out_root, o) for o in outcomes)
        + "\n</body></html>\n"
    )
    path = out_root / "index.html"
    tmp = out_root / f".index.html.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(page)
    os.replace(tmp, path)
    return path
