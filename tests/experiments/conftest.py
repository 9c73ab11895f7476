"""Fixtures for the pipeline tests: run each notebook once, at the "tiny" scale.

A notebook runs its pipeline through the framework exactly as the command line does,
so executing the notebook (as a percent-format script, with ``runpy``) both tests
the notebook and produces the pipeline's artefacts for the other tests to inspect.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import jax
import pytest

from experiments import _framework, _notebook, _outcome

NOTEBOOKS = Path(_framework.__file__).resolve().parent / "notebooks"


class NotebookRuns:
    """Runs each pipeline's notebook at most once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, _outcome.PipelineOutcome] = {}

    def __call__(self, name: str) -> _outcome.PipelineOutcome:
        if name not in self._done:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv(_framework.SCALE_ENV_VAR, "tiny")
                mp.setenv(_notebook.OUT_ENV_VAR, str(self.root))
                mp.delenv(_notebook.FULL_ENV_VAR, raising=False)
                with (
                    jax.numpy_dtype_promotion("strict"),
                    jax.numpy_rank_promotion("raise"),
                ):
                    namespace = runpy.run_path(
                        str(NOTEBOOKS / f"{name}.py"), run_name="__main__"
                    )
            self._done[name] = namespace["outcome"]
        return self._done[name]


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory) -> NotebookRuns:
    """``notebook_run(name)`` -> the PipelineOutcome of notebook ``name`` (tiny)."""
    return NotebookRuns(tmp_path_factory.mktemp("notebooks"))
