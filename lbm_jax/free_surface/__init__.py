"""Free-surface flows (volume of fluid): a liquid whose surface moves with the flow.

:class:`FreeSurface` joins a :class:`lbm_jax.Simulation` (the liquid) with cell
flags, masses, surface tension and gravity in one pure step over a
:class:`FreeSurfaceState`, which runs through :func:`lbm_jax.run` like any other
state. :func:`curvature` is the interface curvature of a fill field and
:func:`sphere_fill` the exact fill field of a circle or sphere. The observables
of the free-surface cases (:func:`surface_maps`, :func:`crown`,
:func:`count_droplets`) and their theory (:func:`lamb_mode`,
:func:`damped_oscillation`) live here too.
"""

from lbm_jax.free_surface._analysis import (
    count_droplets,
    crown,
    damped_oscillation,
    lamb_mode,
    power_law,
    surface_maps,
)
from lbm_jax.free_surface._curvature import MAX_CURVATURE, curvature, sphere_fill
from lbm_jax.free_surface._model import FreeSurface
from lbm_jax.free_surface._state import FILL_MARGIN, Flag, FreeSurfaceState

__all__ = [
    "FILL_MARGIN",
    "MAX_CURVATURE",
    "Flag",
    "FreeSurface",
    "FreeSurfaceState",
    "count_droplets",
    "crown",
    "curvature",
    "damped_oscillation",
    "lamb_mode",
    "power_law",
    "sphere_fill",
    "surface_maps",
]
