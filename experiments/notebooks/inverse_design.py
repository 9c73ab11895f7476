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
# # Inverse design: a body force that shapes a channel's outflow
#
# A D2Q9 channel (solid walls at the top and bottom, periodic in x, driven by a
# uniform body force) carries Poiseuille flow. A control force, bounded by
# `scale * tanh(theta)`, acts in a block of cells in the middle; the study finds the
# `theta` whose outflow profile `u_x(y)` downstream matches a skewed target, with
# `optax.adam` and gradients through `Simulation.advance` in FP16S storage, then
# runs the final design again in FP32 storage. The same code runs as
# `python -m experiments inverse_design`; the guide is `docs/lbm/inverse_design.md`.
#
# Results go to `results/inverse_design/` in the directory the notebook runs in, as
# for the command line (the previous run is kept as `inverse_design.prev`).
# `MPJAX_EXPERIMENTS_OUT=<dir>` writes them to `<dir>/inverse_design/` instead;
# `MPJAX_EXPERIMENTS_FULL=1` runs the full scale (a GPU). To run the notebook
# outside Jupyter (needs the `dev` extra), from the directory for the results:
#
#     jupytext --to ipynb -o inverse_design.ipynb \
#         <repo>/experiments/notebooks/inverse_design.py
#     jupyter execute --inplace inverse_design.ipynb

# %%
import json

from experiments._notebook import run_for_notebook, show_outcome

outcome = run_for_notebook("inverse_design")
show_outcome(outcome)

# %% [markdown]
# The loss of every iteration, the final design's loss re-run in FP32 storage, and
# the largest Mach number of that run:

# %%
results = json.loads((outcome.out_dir / "results.json").read_text())
losses = results["losses_fp16s"]
print(f"FP16S loss {losses[0]:.3g} -> {losses[-1]:.3g} ({losses[0] / losses[-1]:.0f}x)")
print(f"FP32 re-evaluation of the final design: {results['loss_final_fp32']:.3g}")
print(f"Mach number of the final FP32 run: {results['mach_fp32']:.3f}")

# %% [markdown]
# The provenance of the run: package versions, backend, device, git commit, seed.

# %%
print(json.dumps(results["environment"], indent=1))

# %% [markdown]
# The report written next to the figures:

# %%
print((outcome.out_dir / "REPORT.md").read_text())
