"""Sphinx configuration of the documentation site.

Build (the ``docs`` extra), warnings as errors, no network needed::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import importlib
import pkgutil
import sys
import typing
from pathlib import Path

from docutils import nodes
from sphinx.pycode import ModuleAnalyzer

ROOT = Path(__file__).resolve().parents[1]
# Document the code of this checkout, not an installed copy elsewhere.
sys.path.insert(0, str(ROOT))

project = "mpjax + lbm_jax"
author = "mpjax contributors"
copyright = "2026, mpjax contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "myst_nb",  # Markdown (MyST) pages and the stored notebooks
]
templates_path = ["_templates"]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# `name` in a docstring is code, as in Markdown
default_role = "literal"
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# -- API reference ------------------------------------------------------------
autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# tree_flatten/tree_unflatten are JAX's pytree protocol, not API to call.
autodoc_default_options = {
    "exclude-members": "__init__, __new__, tree_flatten, tree_unflatten"
}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# a class's "Attributes:" as fields of its description (autodoc lists the
# dataclass fields as members too, which would describe each one twice)
napoleon_use_ivar = True

# Every cross-reference must resolve. The site is built without network access, so
# the other projects' inventories (intersphinx) are not fetched: references to
# their types in signatures cannot resolve and are ignored, package by package.
nitpicky = True
nitpick_ignore_regex = [
    # JAX: jax.Array, jax.sharding.Mesh, jax.typing.ArrayLike, jnp dtypes, ...
    (r"py:.*", r"(jax|jaxlib|jnp)(\..*)?"),
    # NumPy arrays and dtypes; ml_dtypes' float8/bfloat16 types
    (r"py:.*", r"(numpy|np|ml_dtypes)(\..*)?"),
    # Optax transformations and states; jmp's policy (Policy.to_jmp/from_jmp)
    (r"py:.*", r"(optax|jmp)(\..*)?"),
    # Flax modules, NNX variables and optimizers
    (r"py:.*", r"flax(\..*)?"),
    # matplotlib figures and axes returned by the plotting helpers
    (r"py:.*", r"matplotlib(\..*)?"),
    # Python's standard library (its inventory is not fetched either); Sphinx
    # splits ``Mapping[type, ...]`` into a target ``collections.abc.Mapping[type``
    (r"py:.*", r"(collections\.abc|pathlib|os|enum|abc|contextlib)\.\w+(\[\w+)?"),
]

# -- MyST and notebooks ---------------------------------------------------------
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]
# The notebooks are stored with the outputs of their last run
# (docs/render_notebooks.py); the build renders them and never executes them.
nb_execution_mode = "off"
# the pipelines' tables are GitHub-flavoured Markdown (CommonMark has no tables)
nb_render_markdown_format = "gfm"

# -- HTML -------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "mpjax + lbm_jax"
html_theme_options = {"show_toc_level": 2, "navigation_with_keys": False}
html_static_path = ["_static"]
html_css_files = ["custom.css"]


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    """Leave a NamedTuple's fields to its docstring's ``Attributes`` section.

    autodoc would document each field a second time, as "Alias for field number N".
    """
    return True if type(obj).__name__ == "_tuplegetter" else None


def _type_variable_as_text(app, env, node, contnode):
    """Show a type variable in a signature (``T``, ``_M``) as text, not a link.

    A type variable is a placeholder of its signature, with nothing to document.
    """
    module, _, name = node.get("reftarget", "").rpartition(".")
    try:
        target = getattr(importlib.import_module(module), name, None)
    except (ImportError, ValueError):  # not a module path
        return None
    if isinstance(target, typing.TypeVar):
        return nodes.Text(name)
    return None


def _home_comment(package: str, name: str, obj: object) -> list[str] | None:
    """The ``#:`` comment of constant ``name`` in the module of ``package`` that
    defines it (a package re-exports its constants from private modules)."""
    modules = [importlib.import_module(package)]
    if hasattr(modules[0], "__path__"):
        modules += [
            importlib.import_module(info.name)
            for info in pkgutil.iter_modules(modules[0].__path__, package + ".")
            if not info.name.endswith("__main__")
        ]
    for module in modules:
        if getattr(module, name, None) is not obj:
            continue
        comment = ModuleAnalyzer.for_module(module.__name__).find_attr_docs()
        if ("", name) in comment:
            return list(comment[("", name)])
    return None


_PROSE: dict[str, list[str]] = {}


def _constant_and_property_docstrings(app, what, name, obj, options, lines):
    """Document a re-exported constant by its comment, not its type's docstring,
    and keep a constant's or property's docstring as written (see below).

    Without the first, ``lbm_jax.MIN_TAU`` would show ``float``'s docstring.
    """
    if what not in ("data", "attribute", "property"):
        return
    package, _, short = name.rpartition(".")
    if what == "data" and lines and lines == _docstring_lines(type(obj)):
        lines[:] = _home_comment(package, short, obj) or []
    _PROSE[name] = list(lines)


def _undo_inline_type(app, what, name, obj, options, lines):
    """Napoleon reads the first line of a constant's or property's docstring as
    ``type: description`` ("Implementation of the step: ..." would become a type);
    this project's never start with a type, so they keep their own text."""
    if what in ("data", "attribute", "property") and name in _PROSE:
        lines[:] = _PROSE.pop(name)


def _docstring_lines(obj: object) -> list[str]:
    from sphinx.util.docstrings import prepare_docstring

    return prepare_docstring(obj.__doc__ or "")


def setup(app):
    # around Napoleon's reading of the docstrings (priority 500)
    app.connect(
        "autodoc-process-docstring", _constant_and_property_docstrings, priority=400
    )
    app.connect("autodoc-process-docstring", _undo_inline_type, priority=600)
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
    app.connect("missing-reference", _type_variable_as_text)
