"""The documentation: every public name has an API entry, every docstring example
and every README example runs, and the pipelines' notebooks are rendered.

The site itself is built by ``.ci/run`` (``python -m sphinx -W``), which fails on a
broken reference or a docstring Sphinx cannot read.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import pkgutil
import re
import types

import pytest

from tests._docs import DOCS, README, ROOT, python_blocks

#: The modules whose ``__all__`` the API reference covers, name by name.
DOCUMENTED = (
    "mpjax",
    "mpjax.formats",
    "lbm_jax",
    "lbm_jax.bench",
    "lbm_jax.cases",
    "lbm_jax.free_surface",
    "lbm_jax.ibm",
    "lbm_jax.step",
)
MAX_README_LINES = 200


def _api_pages() -> tuple[set[str], set[str]]:
    """(``module.name`` of every autosummary entry, every ``automodule``) of
    docs/api/*.rst."""
    entries: set[str] = set()
    modules: set[str] = set()
    for page in sorted((DOCS / "api").glob("*.rst")):
        current, in_summary = "", False
        for line in page.read_text().splitlines():
            if directive := re.match(r"\.\. (currentmodule|automodule):: (\S+)", line):
                current = directive.group(2)
                if directive.group(1) == "automodule":
                    modules.add(current)
            if line.startswith(".. autosummary::"):
                in_summary = True
            elif in_summary and line.strip() and not line.startswith(" "):
                in_summary = False
            elif in_summary and re.fullmatch(r" +[\w.]+", line):
                entries.add(f"{current}.{line.strip()}")
    return entries, modules


def _public_names() -> list[tuple[str, str, object]]:
    out = []
    for module_name in DOCUMENTED:
        module = importlib.import_module(module_name)
        out += [(module_name, name, getattr(module, name)) for name in module.__all__]
    return out


def test_every_public_name_has_an_api_entry():
    entries, modules = _api_pages()
    missing = [
        f"{module}.{name}"
        for module, name, value in _public_names()
        if (
            value.__name__ not in modules
            if isinstance(value, types.ModuleType)
            else f"{module}.{name}" not in entries
        )
    ]
    assert not missing, f"add these to docs/api/*.rst: {missing}"


def test_every_api_entry_is_a_public_name():
    entries, modules = _api_pages()
    public = {f"{module}.{name}" for module, name, _ in _public_names()}
    assert not entries - public, "entries without a public name"
    assert modules == set(DOCUMENTED)


def _modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    found = pkgutil.walk_packages(root.__path__, f"{package}.")
    return [package, *sorted(m.name for m in found if not m.name.endswith("__main__"))]


@pytest.mark.parametrize("name", _modules("mpjax") + _modules("lbm_jax"))
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0


def test_the_packages_have_docstring_examples():
    finder = doctest.DocTestFinder()
    examples = {
        package: sum(
            len(test.examples)
            for m in _modules(package)
            for test in finder.find(importlib.import_module(m))
        )
        for package in ("mpjax", "lbm_jax")
    }
    assert min(examples.values()) >= 50, examples


def test_readme_fits_on_a_few_screens():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def test_readme_blocks_start_at_the_margin():
    fenced = re.findall(r"^( *)```python$", README.read_text(), re.M)
    assert len(fenced) == len(python_blocks(README)) >= 2
    assert all(indent == "" for indent in fenced)


@pytest.mark.standard_promotion  # as a user runs them
@pytest.mark.parametrize("index", range(len(python_blocks(README))))
def test_readme_python_block_runs_as_written(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a block may write files
    exec(python_blocks(README)[index], {"__name__": "__main__"})
    assert capsys.readouterr().out.strip()  # every block shows its result


def test_guide_python_blocks_compile():
    # tests/lbm_jax/test_docs.py runs the guides' examples and checks their output
    pages = sorted(DOCS.rglob("*.md"))
    blocks = [(page, block) for page in pages for block in python_blocks(page)]
    assert len(blocks) >= 10
    for page, block in blocks:
        compile(block, str(page), "exec")


def test_readme_links_lead_to_files():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local and [t for t in local if not (ROOT / t).exists()] == []


def test_every_notebook_is_rendered_with_its_provenance():
    spec = importlib.util.spec_from_file_location(
        "render", DOCS / "render_notebooks.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    sources = {p.stem for p in (ROOT / "experiments" / "notebooks").glob("*.py")}
    rendered = sorted((DOCS / "notebooks").glob("*.ipynb"))
    assert {p.stem for p in rendered} == sources
    for path in rendered:
        cells = json.loads(path.read_text())["cells"]
        assert "".join(cells[0]["source"]).startswith(render.PROVENANCE_TITLE)
        outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
        assert outputs, path.name
        assert not [o for o in outputs if o["output_type"] == "error"], path.name
