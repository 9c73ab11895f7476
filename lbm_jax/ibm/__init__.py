"""Immersed-boundary capsules: membrane meshes, their mechanics, the fluid coupling.

:class:`TriangleMesh` and :func:`icosphere` describe the membrane's surface;
:class:`Membrane` gives its elastic energy and node forces; :func:`volume`,
:func:`area` and :func:`shear_plane_deformation` measure its shape. The delta
kernels (:class:`DeltaKernel`) :func:`interpolate` grid fields at the nodes and
:func:`spread` node forces onto the grid; :class:`ImmersedBoundary` joins a
membrane and a :class:`lbm_jax.Simulation` in one pure coupled step over an
:class:`IBMState`.

>>> from lbm_jax.ibm import Membrane, icosphere
>>> membrane = Membrane(icosphere(5.0, nodes=642), shear_modulus=1e-3)
>>> membrane.num_nodes, membrane.law
(642, 'skalak')
"""

from lbm_jax.ibm._coupling import IBMState, ImmersedBoundary
from lbm_jax.ibm._kernels import (
    DeltaKernel,
    delta_1d,
    get_kernel,
    interpolate,
    kernel_support,
    spread,
)
from lbm_jax.ibm._membrane import BENDING_MODELS, LAWS, Membrane
from lbm_jax.ibm._mesh import (
    ICOSPHERE_NODES,
    TriangleMesh,
    area,
    ellipsoid_axes,
    icosphere,
    shear_plane_deformation,
    volume,
)

__all__ = [
    "BENDING_MODELS",
    "ICOSPHERE_NODES",
    "LAWS",
    "DeltaKernel",
    "IBMState",
    "ImmersedBoundary",
    "Membrane",
    "TriangleMesh",
    "area",
    "delta_1d",
    "ellipsoid_axes",
    "get_kernel",
    "icosphere",
    "interpolate",
    "kernel_support",
    "shear_plane_deformation",
    "spread",
    "volume",
]
