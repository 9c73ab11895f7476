"""Matplotlib figures: flow fields (velocity magnitude, vorticity, streamlines) and
the capsule's deformation.

Fields use the solver's layout: a velocity ``u`` of shape ``(D, X, Y[, Z])`` with x
the first spatial axis. 3-D fields are shown as their z mid-plane. Figures are built
with :class:`matplotlib.figure.Figure` directly (no pyplot, no global state), so
this module is safe to use from scripts, tests and threads alike.

>>> import numpy as np
>>> fig = velocity_magnitude_figure(np.zeros((2, 8, 6)))
>>> len(fig.axes)  # the image and its colour bar
2
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "capsule_snapshot_figure",
    "ceiling_line",
    "crown_figure",
    "fill_figure",
    "fill_slices_figure",
    "vertical_label",
    "oscillation_figure",
    "surface_figure",
    "deformation_figure",
    "VORTICITY_LABEL",
    "plane",
    "save_figure",
    "signed_field_image",
    "streamlines_figure",
    "velocity_magnitude_figure",
    "vorticity_2d",
    "vorticity_figure",
    "vorticity_image",
]


def plane(u: Any) -> np.ndarray:
    """In-plane velocity ``(2, X, Y)``: 2-D fields as is, 3-D ones at z mid-plane.

    Raises:
        ValueError: If ``u`` is not shaped ``(2, X, Y)`` or ``(3, X, Y, Z)``.
    """
    u = np.asarray(u, dtype=np.float64)
    if u.ndim == 3 and u.shape[0] == 2:
        return u
    if u.ndim == 4 and u.shape[0] == 3:
        return u[:2, :, :, u.shape[3] // 2]
    raise ValueError(
        f"Velocity must have shape (2, X, Y) or (3, X, Y, Z), got {u.shape}."
    )


def vorticity_2d(u: Any) -> np.ndarray:
    """z-vorticity dv/dx - du/dy of an in-plane field by central differences.

    Shown on plots only; the solver's own observable lives in the core.
    """
    ux, uy = plane(u)
    return np.gradient(uy, axis=0) - np.gradient(ux, axis=1)


#: Colour-bar labels of the flow fields, in lattice units (cells and time steps).
VELOCITY_LABEL = "velocity |u| (cells/time step)"
VORTICITY_LABEL = "vorticity ω_z (1/time step)"


def _draw_solid(ax: Any, mask: np.ndarray) -> None:
    """Fill solid cells grey and outline them in black (cell (i, j) at (i, j))."""
    if not mask.any():
        return
    ax.imshow(
        np.ma.masked_where(~mask.T, np.ones(mask.T.shape)),
        origin="lower",
        interpolation="nearest",
        cmap="Greys",
        vmin=0.0,
        vmax=2.0,
    )
    ax.contour(mask.T.astype(np.float64), levels=[0.5], colors="black", linewidths=1)


def _solid_mask(solid: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    if solid is None:
        return None
    mask = np.asarray(solid, dtype=bool)
    if mask.shape != tuple(shape):
        raise ValueError(
            f"solid mask has shape {mask.shape}; expected the field's plane "
            f"{tuple(shape)} (for a 3-D field, the mask of its z mid-plane)."
        )
    return mask


def _field_image(ax: Any, data: np.ndarray, solid: np.ndarray | None, **kw: Any):
    """``data`` (X, Y) as an image on ``ax``, axes in cells, solid cells drawn."""
    im = ax.imshow(data.T, origin="lower", interpolation="nearest", **kw)
    if solid is not None:
        _draw_solid(ax, solid)
    ax.set_xlabel("x (cells)")
    ax.set_ylabel("y (cells)")
    return im


def _image(
    fig: Figure,
    data: np.ndarray,
    *,
    title: str,
    label: str,
    solid: np.ndarray | None = None,
    **kw: Any,
):
    ax = fig.add_subplot()
    im = _field_image(ax, data, solid, **kw)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label, shrink=0.8)
    return ax


def _figure(shape: tuple[int, int]) -> Figure:
    nx, ny = shape
    aspect = nx / max(ny, 1)
    width = float(np.clip(4.0 * aspect + 1.5, 4.0, 12.0))
    height = float(np.clip(width / aspect, 3.0, 8.0))
    return Figure(figsize=(width, height), layout="constrained")


def velocity_magnitude_figure(
    u: Any, *, title: str = "|u|", solid: Any = None
) -> Figure:
    """Figure of the velocity magnitude |u| in lattice units (cells per time step).

    Args:
        u: Velocity ``(2, X, Y)`` or ``(3, X, Y, Z)`` (shown at the z mid-plane).
        title: Figure title.
        solid: Optional boolean mask ``(X, Y)`` of solid cells, drawn grey with a
            black outline (e.g. a cylinder).
    """
    uv = plane(u)
    fig = _figure(uv.shape[1:])
    _image(
        fig,
        np.hypot(uv[0], uv[1]),
        title=title,
        label=VELOCITY_LABEL,
        solid=_solid_mask(solid, uv.shape[1:]),
        cmap="viridis",
    )
    return fig


def vorticity_image(
    ax: Any, u: Any, *, solid: Any = None, limit: float | None = None
) -> Any:
    """Draw the z-vorticity of ``u`` on ``ax`` in lattice units (1 / time step).

    A symmetric diverging colour map over ``[-limit, limit]``, axes in cells, solid
    cells grey with a black outline. The default ``limit`` is the 99th percentile of
    |vorticity| over the fluid cells, so a wake stays visible next to the peaks at
    a wall. Label a colour bar of the returned image with :data:`VORTICITY_LABEL`.

    Args:
        ax: Matplotlib axes.
        u: Velocity ``(2, X, Y)`` or ``(3, X, Y, Z)`` (shown at the z mid-plane).
        solid: Optional boolean mask ``(X, Y)`` of solid cells (e.g. a cylinder).
        limit: Colour range; pass one value to compare several panels (e.g. the
            first panel's ``image.get_clim()[1]``).

    Returns:
        The image (a :class:`matplotlib.image.AxesImage`).
    """
    return signed_field_image(ax, vorticity_2d(u), solid=solid, limit=limit)


def signed_field_image(
    ax: Any, data: Any, *, solid: Any = None, limit: float | None = None
) -> Any:
    """Draw a signed scalar field ``(X, Y)`` on ``ax`` (a vorticity, one component
    of a force): a symmetric diverging colour map over ``[-limit, limit]``, axes
    in cells, solid cells grey with a black outline.

    Args:
        ax: Matplotlib axes.
        data: The field, ``(X, Y)`` with x the first axis.
        solid: Optional boolean mask ``(X, Y)`` of solid cells.
        limit: Colour range; ``None`` takes the 99th percentile of |data| over
            the cells that are not solid.

    Returns:
        The image (a :class:`matplotlib.image.AxesImage`).
    """
    data = np.asarray(data, dtype=np.float64)
    mask = _solid_mask(solid, data.shape)
    if limit is None:
        fluid = np.abs(data if mask is None else data[~mask])
        fluid = fluid[np.isfinite(fluid)]
        limit = float(np.percentile(fluid, 99)) if fluid.size else 0.0
        limit = limit or 1.0
    return _field_image(ax, data, mask, cmap="RdBu_r", vmin=-limit, vmax=limit)


def vorticity_figure(
    u: Any, *, title: str = "vorticity", solid: Any = None, limit: float | None = None
) -> Figure:
    """Figure of the z-vorticity in lattice units (1 / time step); see
    :func:`vorticity_image`. Multiply by ``D / U`` (cells, cells per time step) for
    the non-dimensional vorticity.

    >>> import numpy as np
    >>> solid = np.zeros((8, 6), bool)
    >>> solid[3:5, 2:4] = True
    >>> fig = vorticity_figure(np.zeros((2, 8, 6)), solid=solid)
    >>> fig.axes[1].get_ylabel()
    'vorticity ω_z (1/time step)'
    """
    fig = _figure(plane(u).shape[1:])
    ax = fig.add_subplot()
    im = vorticity_image(ax, u, solid=solid, limit=limit)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=VORTICITY_LABEL, shrink=0.8)
    return fig


def streamlines_figure(u: Any, *, title: str = "streamlines") -> Figure:
    """Streamlines over the velocity magnitude (e.g. the cavity's vortices)."""
    uv = plane(u)
    nx, ny = uv.shape[1:]
    fig = _figure((nx, ny))
    ax = _image(
        fig, np.hypot(uv[0], uv[1]), title=title, label=VELOCITY_LABEL, cmap="Greys"
    )
    x = np.arange(nx, dtype=np.float64)
    y = np.arange(ny, dtype=np.float64)
    if nx >= 2 and ny >= 2:
        ax.streamplot(
            x, y, uv[0].T, uv[1].T, density=1.5, color="tab:blue", linewidth=0.7
        )
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim(-0.5, ny - 0.5)
    return fig


def deformation_figure(
    t: Any,
    d: Any,
    d_theory: float,
    rate_theory: float | None,
    *,
    title: str = "Taylor deformation",
) -> Figure:
    """D(t) of a capsule against small-deformation theory.

    Args:
        t: Time steps of the samples.
        d: Taylor deformation at those steps.
        d_theory: Steady value of the theory (a horizontal line).
        rate_theory: Relaxation rate of the theory per step, if known: the curve
            ``d_theory (1 - exp(-rate t))`` is drawn as well.
        title: Figure title.
    """
    t = np.asarray(t, np.float64)
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(t, np.asarray(d, np.float64), color="tab:blue", label="simulation")
    ax.axhline(
        d_theory, color="black", linestyle=":", label="small-deformation theory, D_inf"
    )
    if rate_theory is not None:
        tt = np.linspace(0.0, float(t.max(initial=1.0)), 200)
        ax.plot(
            tt,
            d_theory * (1.0 - np.exp(-rate_theory * tt)),
            color="black",
            linestyle="--",
            label="linear theory, D_inf (1 - exp(-s t G_s / mu r))",
        )
    ax.set_xlabel("time step")
    ax.set_ylabel("Taylor deformation D = (L - B)/(L + B)")
    ax.set_title(title)
    fig.legend(loc="outside lower center", fontsize="small")  # clear of the data
    return fig


def capsule_snapshot_figure(
    u: Any, nodes: Any, faces: Any, *, title: str = "capsule"
) -> Figure:
    """The x-z section through a membrane: u_x and the membrane's outline.

    Args:
        u: Velocity ``(3, X, Y, Z)`` on nodes at integer positions.
        nodes: Membrane nodes ``(N, 3)`` in the same coordinates.
        faces: Triangles ``(F, 3)``.
        title: Figure title.
    """
    u = np.asarray(u, np.float64)
    x = np.asarray(nodes, np.float64)
    centre = x.mean(axis=0)
    j = int(np.clip(round(centre[1]), 0, u.shape[2] - 1))
    fig = _figure((u.shape[1], u.shape[3]))
    section = u[0, :, j, :]
    lim = float(np.max(np.abs(section), initial=0.0)) or 1.0
    ax = _image(
        fig,
        section,
        title=title,
        label="u_x (cells/time step)",
        cmap="RdBu_r",
        vmin=-lim,
        vmax=lim,
    )
    ax.set_ylabel("z (cells)")
    # edges that cross the plane y = centre[1], as segments of the outline
    tri = x[np.asarray(faces)]
    side = tri[..., 1] - centre[1]
    for a, b in ((0, 1), (1, 2), (2, 0)):
        cross = side[:, a] * side[:, b] < 0
        s = side[cross, a] / (side[cross, a] - side[cross, b])
        p = tri[cross, a] + s[:, None] * (tri[cross, b] - tri[cross, a])
        ax.plot(p[:, 0], p[:, 2], ".", color="black", markersize=2)
    ax.plot([], [], ".", color="black", label="membrane (section)")
    ax.legend(loc="upper right")
    return fig


def fill_figure(phi: Any, *, title: str = "fill level") -> Figure:
    """The fill level of a free-surface flow in a plane (0 gas, 1 liquid)."""
    phi = np.asarray(phi, np.float64)
    fig = _figure(phi.shape)
    _image(fig, phi, title=title, label="fill level phi", cmap="Blues", vmin=0, vmax=1)
    return fig


def oscillation_figure(
    t: Any,
    a: Any,
    a0: float,
    frequency: float,
    damping: float,
    *,
    title: str = "capillary wave",
) -> Figure:
    """A wave's amplitude over time against the normal mode of linear theory."""
    t = np.asarray(t, np.float64)
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(t, np.asarray(a, np.float64), color="tab:blue", label="simulation")
    tt = np.linspace(0.0, float(t.max(initial=1.0)), 400)
    ax.plot(
        tt,
        a0 * np.exp(-damping * tt) * np.cos(frequency * tt),
        color="black",
        linestyle="--",
        label="linear theory (Lamb's normal mode)",
    )
    ax.set_xlabel("time step")
    ax.set_ylabel("amplitude of the surface mode (cells)")
    ax.set_title(title)
    ax.legend(loc="upper right")
    return fig


def vertical_label(dims: int) -> str:
    """The vertical (gravity) axis of a free-surface grid: its last axis, ``y``
    in 2-D and ``z`` in 3-D.

    >>> vertical_label(2), vertical_label(3)
    ('y (cells, up)', 'z (cells, up)')
    """
    return f"{'y' if dims == 2 else 'z'} (cells, up)"


def fill_slices_figure(
    slices: Any,
    times: Any,
    *,
    panels: int = 6,
    title: str = "fill level",
    dims: int = 3,
) -> Figure:
    """Snapshots of a vertical fill-level slice at evenly spaced sample times.

    Args:
        slices: ``(samples, X, Z)`` fill levels, vertical axis last.
        times: Time of every sample (drawn in the panel titles, in ``t U / D``).
        panels: Number of snapshots.
        title: Figure title.
    """
    slices = np.asarray(slices, np.float64)
    times = np.asarray(times, np.float64)
    pick = np.unique(np.linspace(0, len(slices) - 1, panels).round().astype(int))
    cols = min(3, len(pick))
    rows = -(-len(pick) // cols)
    nx, nz = slices.shape[1:]
    fig = Figure(figsize=(3.6 * cols, 3.6 * rows * nz / nx + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(pick) :]:
        ax.set_visible(False)
    im = None
    for ax, k in zip(axes.flat, pick, strict=False):
        im = ax.imshow(
            slices[k].T,
            origin="lower",
            cmap="Blues",
            vmin=0,
            vmax=1,
            interpolation="nearest",
        )
        ax.set_title(f"t U / D = {times[k]:.2f}")
        ax.set_xlabel("x (cells)")
        ax.set_ylabel(vertical_label(dims))
    fig.colorbar(im, ax=axes, label="fill level phi", shrink=0.8)
    fig.suptitle(title)
    return fig


def ceiling_line(ax: Any, height: float) -> None:
    """The impact box's ceiling, ``height`` above the pool in drop diameters, as
    the crown height's reference line: the crown radius is unmeasured from there."""
    ax.axhline(
        height,
        color="0.4",
        linestyle=":",
        label="the box's ceiling (crown radius unmeasured from there)",
    )


def crown_figure(
    t: Any,
    radius: Any,
    height: Any,
    cavity: Any,
    exponent: float | None,
    prefactor: float | None,
    *,
    ceiling: float | None = None,
    title: str = "crown",
) -> Figure:
    """Crown radius and height and cavity depth over time, with the power-law fit.

    All lengths in drop diameters, time in ``t U / D`` after contact. The fit is
    drawn unless its exponent is missing (``None``/NaN: too few crown samples);
    ``ceiling`` (the box's ceiling above the pool) as a reference line.
    """
    t = np.asarray(t, np.float64)
    after = t >= 0
    t, radius, height, cavity = (
        np.asarray(a, np.float64)[after] for a in (t, radius, height, cavity)
    )
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(t, np.asarray(radius, np.float64), color="tab:blue", label="crown radius")
    ax.plot(t, np.asarray(height, np.float64), color="tab:orange", label="crown height")
    ax.plot(t, np.asarray(cavity, np.float64), color="tab:green", label="cavity depth")
    if exponent is not None and prefactor is not None and np.isfinite(exponent):
        tt = np.linspace(max(t.min(), 1e-3), t.max(), 200)
        tt = tt[tt > 0]
        ax.plot(
            tt,
            prefactor * tt**exponent,
            color="black",
            linestyle="--",
            label=f"fit r = {prefactor:.2f} (t U / D)^{exponent:.2f}",
        )
    if ceiling is not None:
        ceiling_line(ax, ceiling)
    ax.set_xlabel("time after contact, t U / D")
    ax.set_ylabel("length / drop diameter D")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=2)  # under the axes: hides no data
    return fig


def surface_figure(top: Any, *, title: str = "liquid surface") -> Figure:
    """The liquid surface height: a rendered surface in 3-D, a profile in 2-D.

    Args:
        top: Surface height per column, ``(X,)`` or ``(X, Y)``, in the unit
            given by the caller (drop diameters).
        title: Figure title.
    """
    top = np.asarray(top, np.float64)
    if top.ndim == 1:
        fig = Figure(figsize=(6.5, 3.5), layout="constrained")
        ax = fig.add_subplot()
        ax.plot(np.arange(top.size), top, color="tab:blue")  # one line: no legend
        ax.set_xlabel("x (cells)")
        ax.set_ylabel("surface height / D")
    else:
        fig = Figure(figsize=(6.5, 5.0), layout="constrained")
        ax = fig.add_subplot(projection="3d")
        x, y = np.meshgrid(
            np.arange(top.shape[0]), np.arange(top.shape[1]), indexing="ij"
        )
        surf = ax.plot_surface(
            x,
            y,
            top,
            cmap="viridis",
            linewidth=0,
            antialiased=True,
            rstride=1,
            cstride=1,
        )
        ax.set_xlabel("x (cells)")
        ax.set_ylabel("y (cells)")
        ax.set_zlabel("height / D")
        fig.colorbar(surf, ax=ax, label="surface height / D", shrink=0.6)
    ax.set_title(title)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Save a figure (format from the suffix, e.g. ``.png``) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
