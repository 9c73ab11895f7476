"""Execute the pipelines' notebooks and store them, with outputs, for the site.

The documentation site renders ``docs/notebooks/*.ipynb`` as they are stored; it
does not execute them (a quick run of every pipeline takes minutes). This script
makes those files: it converts each ``experiments/notebooks/<name>.py`` (jupytext,
percent format) to a notebook, executes it at the given scale in a scratch
directory (the pipeline's results go there, as ``results/<name>/``), and writes
the executed notebook with a first cell that says when, on which commit and
machine, at which scale and in how long it ran. Run it from the repository root
after a change that should show in the rendered results::

    python docs/render_notebooks.py                 # every notebook, quick scale
    python docs/render_notebooks.py amp formats     # some of them

It needs the ``dev`` extra (jupytext, nbclient, ipykernel).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "experiments" / "notebooks"
RENDERED = ROOT / "docs" / "notebooks"
#: The first cell of every rendered notebook starts with this line (tests read it).
PROVENANCE_TITLE = "**Stored outputs.**"


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    # the code the notebooks run; the docs being edited beside a run do not count
    changed = git("status", "--porcelain", "--", "mpjax", "lbm_jax", "experiments")
    dirty = " (with uncommitted changes to the code)" if changed else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def _provenance(scale: str) -> str:
    """What the first cell says, taken as the run starts; ``{wall_s}`` is left to
    fill in when it ends."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{PROVENANCE_TITLE} This page shows the notebook "
        f"`experiments/notebooks/{{name}}.py` as it ran on {date}, at commit "
        f"`{_commit()}`, at the {scale!r} scale, on {platform.machine()} with "
        f"{os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the "
        "start; no GPU unless the environment below names one), in {wall_s} s. "
        "The site does not run it again: `python docs/render_notebooks.py` does, "
        "and rewrites this page."
    )


def render(name: str, scale: str) -> Path:
    """Execute notebook ``name`` at ``scale`` and store it under ``docs/notebooks``."""
    source = SOURCES / f"{name}.py"
    if not source.is_file():
        known = sorted(p.stem for p in SOURCES.glob("*.py"))
        raise ValueError(f"no notebook {name!r}; expected one of {known}")
    notebook = jupytext.read(source)
    env = {
        "MPJAX_EXPERIMENTS_FULL": "1" if scale == "full" else "0",
        # the tests' scale: seconds per pipeline, its figures only a smoke test
        "MPJAX_EXPERIMENTS_SCALE": "tiny" if scale == "tiny" else "",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    text = _provenance(scale)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update(env, MPJAX_EXPERIMENTS_OUT=str(Path(scratch) / "results"))
        start = time.perf_counter()
        NotebookClient(
            notebook,
            timeout=3600,
            kernel_name="python3",
            resources={"metadata": {"path": scratch}},
        ).execute()
        wall_s = time.perf_counter() - start
    text = text.replace("{name}", name).replace("{wall_s}", f"{wall_s:.0f}")
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell(text))
    notebook.metadata.pop("jupytext", None)
    RENDERED.mkdir(exist_ok=True)
    target = RENDERED / f"{name}.ipynb"
    nbformat.write(notebook, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks (default: all)")
    parser.add_argument("--scale", choices=("quick", "full", "tiny"), default="quick")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem for p in SOURCES.glob("*.py"))
    for name in names:
        start = time.perf_counter()
        target = render(name, args.scale)
        took = time.perf_counter() - start
        print(f"{name}: {target.relative_to(ROOT)} ({took:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
