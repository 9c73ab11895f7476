# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Number formats
#
# Every registered number format of `mpjax.formats` with its facts (range, epsilon,
# decimal digits) and its rounding error over a range of magnitudes. The same code
# runs as `python -m experiments formats`.
#
# Results go to `results/formats/` in the directory the notebook runs in, as for the
# command line (the previous run is kept as `formats.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/formats/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o formats.ipynb \
#         <repo>/experiments/notebooks/formats.py
#     jupyter execute --inplace formats.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("formats")
show_outcome(outcome)

# %% [markdown]
# The provenance of the run: package versions, backend, device, git commit, seed.

# %%
environment = json.loads((outcome.out_dir / "environment.json").read_text())
print(json.dumps(environment, indent=1))

# %% [markdown]
# The report written next to the figures:

# %%
print((outcome.out_dir / "REPORT.md").read_text())
