"""Free-surface flows (volume of fluid): a liquid whose surface moves with the flow.

:class:`FreeSurface` joins a :class:`lbm_jax.Simulation` (the liquid) with cell
flags, masses and the surface tension and gravity in one pure step over a
:class:`FreeSurfaceState`, which runs through :func:`lbm_jax.run` like any other
state. :func:`curvature` is the interface curvature of a fill field, and
:func:`sphere_fill` the exact fill field of a circle or sphere.
"""

from lbm_jax.free_surface._curvature import MAX_CURVATURE, curvature, sphere_fill
from lbm_jax.free_surface._model import Flag, FreeSurface, FreeSurfaceState

__all__ = [
    "MAX_CURVATURE",
    "Flag",
    "FreeSurface",
    "FreeSurfaceState",
    "curvature",
    "sphere_fill",
]
