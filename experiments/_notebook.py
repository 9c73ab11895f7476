"""Helpers for the notebooks in ``experiments/notebooks/``.

The notebooks call the same framework functions as the command line and write to
the same place: ``results/<pipeline>/`` under the current working directory (for a
notebook, the directory of the ``.ipynb`` file), replacing the previous run there
and keeping it as ``<pipeline>.prev``. Two environment variables adapt them without
editing: ``MPJAX_EXPERIMENTS_OUT`` (parent directory of the result directories) and
``MPJAX_EXPERIMENTS_FULL=1`` (paper-scale settings instead of quick ones); tests set
``MPJAX_EXPERIMENTS_SCALE=tiny`` as well (see
:func:`experiments._framework.resolve_scale`).

Running a notebook needs the ``dev`` extra (jupytext, nbclient, ipykernel). Convert
it next to where the results should go, then execute it with nbclient's
``jupyter execute``::

    jupytext --to ipynb -o lbm_accuracy.ipynb experiments/notebooks/lbm_accuracy.py
    jupyter execute --inplace lbm_accuracy.ipynb   # results in ./results/lbm_accuracy

or open the ``.ipynb`` in Jupyter. Converted ``.ipynb`` files and ``results/`` are
ignored by git.
"""

from __future__ import annotations

import os
from pathlib import Path

from experiments import _framework
from experiments._outcome import PipelineOutcome

__all__ = ["OUT_ENV_VAR", "FULL_ENV_VAR", "run_for_notebook", "show_outcome"]

OUT_ENV_VAR = "MPJAX_EXPERIMENTS_OUT"
FULL_ENV_VAR = "MPJAX_EXPERIMENTS_FULL"


def run_for_notebook(name: str, *, seed: int = 0) -> PipelineOutcome:
    """Run pipeline ``name`` the way ``python -m experiments <name>`` does.

    Exceptions raised by the pipeline propagate, so the notebook shows them.

    Raises:
        ValueError: for an unknown pipeline or a bad ``MPJAX_EXPERIMENTS_FULL`` value.
    """
    full = os.environ.get(FULL_ENV_VAR, "0")
    if full not in ("0", "1"):
        raise ValueError(
            f"{FULL_ENV_VAR} is {full!r}; expected '1' (full scale) or '0' (quick)."
        )
    out_root = Path(os.environ.get(OUT_ENV_VAR) or _framework.DEFAULT_RESULTS_DIR)
    return _framework.run_pipeline(
        name, out_root=out_root, quick=full == "0", seed=seed, catch=False
    )


def show_outcome(outcome: PipelineOutcome) -> None:
    """Display the outcome's table, checks and PNG figures in a notebook."""
    from IPython.display import Image, Markdown, display

    failed = [k for k, v in outcome.checks.items() if not v]
    status = "all checks passed" if not failed else f"failed checks: {failed}"
    display(
        Markdown(
            f"{outcome.table}\n\n**{outcome.name}**: {status} "
            f"({outcome.wall_s:.1f} s; results in `{outcome.out_dir}`)"
        )
    )
    if outcome.out_dir is None:
        return
    for png in sorted(outcome.out_dir.glob("*.png")):
        display(Image(filename=str(png)))
