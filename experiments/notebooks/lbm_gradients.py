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
# # Gradients through 16-bit population storage
#
# The accuracy study extended to derivatives: the relative error of dL/dθ, the
# adjoint through `Simulation.advance` (checkpoints kept in the storage format),
# against the FP64/FP64 adjoint, for each storage policy on three problems:
# Taylor-Green vortices (L = kinetic energy, θ = initial amplitude), the Poiseuille
# channel (L = flux, θ = driving force) and the lid-driven cavity (L = circulation
# of the primary vortex, θ = lid speed). The FP64 adjoint is checked against float64
# central differences. The same code runs as `python -m experiments lbm_gradients`.
#
# Results go to `results/lbm_gradients/` in the directory the notebook runs in, as
# for the command line (the previous run is kept as `lbm_gradients.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/lbm_gradients/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs paper-scale settings (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o lbm_gradients.ipynb \
#         <repo>/experiments/notebooks/lbm_gradients.py
#     jupyter execute --inplace lbm_gradients.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("lbm_gradients")
show_outcome(outcome)

# %% [markdown]
# The provenance of the run: package versions, backend, device, git commit, seed.

# %%
environment = json.loads((outcome.out_dir / "environment.json").read_text())
print(json.dumps(environment, indent=1))

# %% [markdown]
# The report written next to the figure:

# %%
print((outcome.out_dir / "REPORT.md").read_text())
