"""The runs of the accuracy study: settings per scale, one run, sweeps, comparison.

Part of :mod:`experiments.lbm_accuracy` (its checks are in
:mod:`experiments._accuracy_checks`, its tables and report in
:mod:`experiments._accuracy_report`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import lbm_jax
import lbm_jax.cases
from experiments import _framework
from experiments._lbm_figures import metric
from experiments._report import progress

__all__ = [
    "RUNS_ALL",
    "SHEDDING_METRICS",
    "SIXTEEN_BIT",
    "REPLAY_STORAGE",
    "Settings",
    "compare_runs",
    "cylinder_sweep",
    "find_run",
    "reference_label",
    "replay_in_reference",
    "run_one",
    "run_status",
    "run_studies",
    "settings_for",
    "storage_label",
    "sweep",
]

#: Short names of the 16-bit storage policies, in the registry's order.
SIXTEEN_BIT: tuple[str, ...] = tuple(
    policy.short_name
    for policy in map(lbm_jax.get_storage, lbm_jax.list_storages())
    if policy.bytes_per_value == 2
)

#: (storage, shift) pairs of a complete comparison, in table order.
RUNS_ALL: tuple[tuple[str, bool], ...] = (
    ("fp64", True),
    ("fp32", True),
    *((s, shift) for s in SIXTEEN_BIT for shift in (False, True)),
)

_FEW = (("fp64", True), ("fp32", True), ("fp16", False), ("fp16s", True))

#: Phase-insensitive statistics of each vortex-shedding case, compared with the
#: reference run in place of the velocity field (see the module docstring).
SHEDDING_METRICS: dict[str, tuple[str, ...]] = {
    "cylinder": ("strouhal", "cd_max", "cl_max"),
    "cylinder_unconfined": ("strouhal", "cd_mean", "cl_amplitude"),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and policies of one scale of the accuracy study.

    A ``steps`` of ``None`` lets the case choose its default number of steps.
    """

    poiseuille_n: int
    poiseuille_steps: int | None
    widths: tuple[int, ...]
    width_runs: tuple[tuple[str, bool], ...]
    taylor_green_n: int
    taylor_green_steps: int | None
    cavity_n: int
    cavity_re: tuple[int, ...]
    cavity_steps: int | None
    cavity_runs: tuple[tuple[str, bool], ...]
    cylinder_n: int | None
    cylinder_steps: int | None
    cylinder_runs: tuple[tuple[str, bool], ...]
    cylinder_options: tuple[tuple[str, float], ...] = ()
    unconfined_n: int | None = None
    unconfined_runs: tuple[tuple[str, bool], ...] = ()
    unconfined_options: tuple[tuple[str, float], ...] = ()
    runs: tuple[tuple[str, bool], ...] = RUNS_ALL


_SETTINGS = {
    "tiny": Settings(
        poiseuille_n=8,
        poiseuille_steps=3000,
        widths=(4, 8),
        width_runs=(("fp32", True),),
        taylor_green_n=16,
        taylor_green_steps=None,
        cavity_n=16,
        cavity_re=(100,),
        cavity_steps=2000,
        cavity_runs=(("fp32", True), ("fp16s", True)),
        cylinder_n=None,
        cylinder_steps=None,
        cylinder_runs=(),
        runs=_FEW,
    ),
    # the main job: the reference formats and FP16 unshifted against shifted,
    # the cavity in FP32 and FP16S (one compiled step per run, 3-10 s on a 2-core
    # CPU: the number of runs sets its time); the cylinders and the other 16-bit
    # formats are the standard scale's
    "quick": Settings(
        poiseuille_n=16,
        poiseuille_steps=None,
        widths=(8, 16),
        width_runs=(("fp32", True),),
        taylor_green_n=32,
        taylor_green_steps=None,
        cavity_n=32,
        cavity_re=(100,),
        cavity_steps=8000,
        cavity_runs=(("fp32", True), ("fp16s", True)),
        cylinder_n=None,
        cylinder_steps=None,
        cylinder_runs=(),
        runs=_FEW,
    ),
    "standard": Settings(
        poiseuille_n=16,
        poiseuille_steps=None,
        widths=(8, 16, 32),
        width_runs=(("fp32", True), ("fp16", False), ("fp16s", True), ("fp16c", True)),
        taylor_green_n=32,
        taylor_green_steps=None,
        cavity_n=32,
        cavity_re=(100,),
        cavity_steps=8000,
        cavity_runs=(
            ("fp64", True),
            ("fp32", True),
            ("fp16", False),
            ("fp16s", True),
            ("fp16c", True),
        ),
        cylinder_n=10,
        cylinder_steps=None,
        cylinder_runs=(("fp32", True), ("fp16s", True), ("fp16c", True)),
        # D = 10 cells needs u_ref = 0.1 to keep tau = 0.53 at Re 100 (stable).
        cylinder_options=(("u_ref", 0.1),),
        unconfined_n=10,
        unconfined_runs=(("fp32", True), ("fp16s", True)),
        unconfined_options=(("u_ref", 0.1), ("run_times", 150.0)),
    ),
    "full": Settings(
        poiseuille_n=64,
        poiseuille_steps=None,
        widths=(8, 16, 32, 64, 128),
        width_runs=(("fp64", True), ("fp32", True), ("fp16", False))
        + tuple((s, True) for s in SIXTEEN_BIT),
        taylor_green_n=128,
        taylor_green_steps=None,
        cavity_n=128,
        cavity_re=(100, 400, 1000),
        cavity_steps=None,
        cavity_runs=RUNS_ALL,
        cylinder_n=None,
        cylinder_steps=None,
        cylinder_runs=RUNS_ALL,
        unconfined_runs=(
            ("fp64", True),
            ("fp32", True),
            ("fp16", False),
            ("fp16s", True),
            ("fp16c", True),
        ),
        unconfined_options=(),
    ),
}


def settings_for(scale: str) -> Settings:
    """Return the study settings of ``scale`` (one of ``_framework.SCALES``)."""
    return _framework.settings_for(_SETTINGS, scale)


def storage_label(storage: str, shift: bool) -> str:
    """A run's label: the policy's name, marked ``S`` (shifted) or ``-`` for 16 bit."""
    policy = lbm_jax.get_storage(storage)
    if policy.bytes_per_value > 2:  # full-precision storage: shifting is moot
        return policy.name
    return f"{policy.name} {'S' if shift else '-'}"


def run_one(
    case: str, storage: str, shift: bool, store: Path | None = None, **kwargs: Any
) -> dict[str, Any]:
    """One run_case call; FP64 runs get x64 enabled, instability becomes a record.

    With ``store`` (the pipeline's work directory) a finished run is kept there,
    keyed by its case, storage, options and :func:`lbm_jax.code_version`, and a
    later call with the same key (a re-run after an interruption) reuses it.
    """
    options = {k: v for k, v in kwargs.items() if v is not None}
    record: dict[str, Any] = {
        "case": case,
        "storage": lbm_jax.get_storage(storage).name,
        "shift": shift,
        "label": storage_label(storage, shift),
        **{k: v for k, v in options.items() if k != "out_dir"},
    }
    entry = None if store is None else store / _run_key(record)
    if entry is not None and (entry / "record.json").is_file():
        return _reuse(entry, options.get("out_dir"))
    try:
        with jax.enable_x64(lbm_jax.get_storage(storage).needs_x64):
            result = lbm_jax.cases.run_case(
                case, storage=storage, shift=shift, **options
            )
    except lbm_jax.InstabilityError as err:
        record.update(
            stable=False,
            error=str(err),
            unstable_step=err.step,
            summary={},
            fields=None,
            replay=replay_in_reference(case, storage, shift, options, err),
        )
    else:
        record.update(stable=True, summary=dict(result.summary), fields=result.fields)
        if "out_dir" in options:
            record["history"] = _history(Path(options["out_dir"]))
    if entry is not None:
        _keep(entry, record, options.get("out_dir"))
    return {**record, "reused": False}


#: The format an unstable 16-bit run is replayed in (see replay_in_reference).
REPLAY_STORAGE = ("fp32", True)


def replay_in_reference(
    case: str,
    storage: str,
    shift: bool,
    options: dict[str, Any],
    err: lbm_jax.InstabilityError,
) -> dict[str, Any] | None:
    """Whose instability it is: the format's or the flow's.

    The unstable run is replayed (deterministically) to its last healthy check,
    converted to FP32 there (:meth:`lbm_jax.Simulation.convert`) and run on to the
    end. If FP32 fails too from that state, the flow outran the resolution and
    the 16-bit format only took another path into it; if FP32 runs through, the
    format broke the run. ``None`` for runs in FP32 or a wider format, for
    cases whose model has no ``convert`` (the immersed boundary) and for an
    error whose last healthy step is not inside the run.

    Returns:
        ``{"storage", "from_step", "stable", "unstable_step"}`` of the replay.
    """
    ref_storage, ref_shift = REPLAY_STORAGE
    if lbm_jax.get_storage(storage).bytes_per_value >= 4:
        return None
    kw = {k: v for k, v in options.items() if k != "out_dir"}
    setup = lbm_jax.cases.prepare_case(case, storage=storage, shift=shift, **kw)
    model, state = setup.build()
    start = err.last_good_step
    if not hasattr(model, "convert") or not 0 <= start < setup.steps:
        return None
    ref, _ = lbm_jax.cases.prepare_case(
        case, storage=ref_storage, shift=ref_shift, **kw
    ).build()
    # run() takes a Simulation's step method as the simulation itself
    state = lbm_jax.run(model.step, state, start).state
    copy = ref.convert(state, model)
    out = {"storage": lbm_jax.get_storage(ref_storage).name, "from_step": start}
    try:
        lbm_jax.run(ref.step, copy, setup.steps - start, healthy=ref.healthy)
    except lbm_jax.InstabilityError as again:
        return {**out, "stable": False, "unstable_step": again.step}
    return {**out, "stable": True, "unstable_step": None}


def run_status(record: dict[str, Any]) -> str:
    """A run's status for a table: ``stable``, or ``UNSTABLE`` with the step whose
    health check failed and, for a replayed 16-bit run, what FP32 did from its
    last healthy state (:func:`replay_in_reference`)."""
    if record["stable"]:
        return "stable"
    step = record.get("unstable_step")
    status = "UNSTABLE" if step is None else f"UNSTABLE at step {step}"
    replay = record.get("replay")
    if replay:
        then = (
            "runs to the end (the format's instability)"
            if replay["stable"]
            else f"fails at step {replay['unstable_step']} too (the flow's)"
        )
        status += f"; {replay['storage']} from step {replay['from_step']} {then}"
    return status


def _run_key(record: dict[str, Any]) -> str:
    """A run's identity in the work directory: its arguments and the code version."""
    identity = {**record, "code_version": lbm_jax.code_version()}
    text = json.dumps(_framework.to_jsonable(identity), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _keep(entry: Path, record: dict[str, Any], out_dir: Path | None) -> None:
    """Store a finished run (atomically: built aside, then renamed into place)."""
    tmp = entry.with_name(entry.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fields = record.get("fields") or {}
    np.savez(tmp / "fields.npz", **fields)
    if out_dir is not None and Path(out_dir).is_dir():
        shutil.copytree(out_dir, tmp / "out")
    meta = {k: v for k, v in record.items() if k not in ("fields", "history")}
    _framework.write_json(tmp / "record.json", meta)
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)


def _reuse(entry: Path, out_dir: Path | None) -> dict[str, Any]:
    """A run kept by :func:`_keep`, with its outputs copied back to ``out_dir``."""
    record = json.loads((entry / "record.json").read_text())
    with np.load(entry / "fields.npz") as data:
        fields = {k: data[k] for k in data.files}
    record["fields"] = fields if record["stable"] else None
    if out_dir is not None and (entry / "out").is_dir():
        shutil.copytree(entry / "out", out_dir, dirs_exist_ok=True)
        record["history"] = _history(Path(out_dir))
    return {**record, "reused": True}


def _slug(label: str) -> str:
    return label.replace("/", "_").replace(" ", "_").replace("-", "noshift")


def _rel_l2(u: np.ndarray, ref: np.ndarray) -> float:
    u = np.asarray(u, np.float64)
    ref = np.asarray(ref, np.float64)
    norm = float(np.sqrt(np.sum(ref * ref)))
    return float(np.sqrt(np.sum((u - ref) ** 2))) / norm if norm > 0 else math.inf


def _compare_fields(records: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    """Add ``err_vs_fp64`` (relative L2 of velocity) and density drift to records."""
    ref_fields = reference.get("fields")
    for r in records:
        if not r["stable"] or ref_fields is None:
            r["err_vs_fp64"] = math.inf if not r["stable"] else math.nan
            r["max_drho_vs_fp64"] = math.inf if not r["stable"] else math.nan
            continue
        r["err_vs_fp64"] = _rel_l2(r["fields"]["u"], ref_fields["u"])
        drho = np.asarray(r["fields"]["rho"], np.float64) - ref_fields["rho"]
        r["max_drho_vs_fp64"] = float(np.max(np.abs(drho)))


def _compare_shedding(
    records: list[dict[str, Any]], reference: dict[str, Any], keys: Sequence[str]
) -> None:
    """Add ``<key>_vs_ref``: the relative difference of each shedding statistic to
    the reference run (``inf`` for an unstable run, NaN without a reference)."""
    for r in records:
        for key in keys:
            ref = metric(reference, key) if reference else math.nan
            value = metric(r, key)
            usable = math.isfinite(ref) and ref != 0.0
            r[f"{key}_vs_ref"] = value / ref - 1.0 if usable else math.nan


def compare_runs(case: str, records: list[dict[str, Any]]) -> None:
    """Compare every run of ``case`` with the reference run, in place.

    The reference is the FP64/FP64 run, or the FP32/FP32 one without an FP64 run;
    every record gains ``reference`` (its label, ``None`` without one). Shedding
    cases (:data:`SHEDDING_METRICS`) gain ``<key>_vs_ref`` for each statistic; the
    others ``err_vs_fp64`` (relative L2 of the velocity) and ``max_drho_vs_fp64``.
    """
    reference = next((r for r in records if r["storage"] == "FP64/FP64"), None)
    if reference is None:
        reference = next((r for r in records if r["storage"] == "FP32/FP32"), {})
    for r in records:
        r["reference"] = reference.get("label")
    if case in SHEDDING_METRICS:
        _compare_shedding(records, reference, SHEDDING_METRICS[case])
    else:
        _compare_fields(records, reference)


def reference_label(records: Sequence[dict[str, Any]]) -> str:
    """The label of the run the records were compared with (for table headers)."""
    return next((r["reference"] for r in records if r.get("reference")), "n/a")


def sweep(
    case: str,
    runs: Sequence[tuple[str, bool]],
    desc: str,
    *,
    run_root: Path | None = None,
    store: Path | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Run one case for each ``(storage, shift)`` and compare with the reference.

    Every run goes through :func:`run_one` (writing to ``run_root/<label>`` when
    given, kept in ``store``); the records are then compared by
    :func:`compare_runs`.
    """
    records = []
    for s, shift in progress(runs, desc=desc, total=len(runs)):
        out = None if run_root is None else run_root / _slug(storage_label(s, shift))
        records.append(run_one(case, s, shift, store, out_dir=out, **kwargs))
    compare_runs(case, records)
    return records


def find_run(records: list[dict[str, Any]], storage: str, shift: bool) -> dict | None:
    """The record of ``(storage, shift)`` (any shift for FP64), or ``None``."""
    name = lbm_jax.get_storage(storage).name
    for r in records:
        if r["storage"] == name and (r["shift"] == shift or storage in ("fp64",)):
            return r
    return None


def _history(run_dir: Path) -> dict[str, np.ndarray]:
    """Time series a case wrote to ``fields.npz`` besides ``rho`` and ``u``."""
    path = run_dir / "fields.npz"
    if not path.is_file():
        return {}
    with np.load(path) as data:
        return {k: data[k] for k in data.files if k not in ("rho", "u")}


def cylinder_sweep(
    case: str,
    runs: Sequence[tuple[str, bool]],
    n: int | None,
    steps: int | None,
    options: Sequence[tuple[str, float]],
    runs_dir: Path,
    store: Path | None = None,
) -> list[dict[str, Any]]:
    """:func:`sweep` of a vortex-shedding case (nothing when no run is planned)."""
    if not runs:
        return []
    return sweep(
        case,
        runs,
        case,
        n=n,
        steps=steps,
        run_root=runs_dir / case,
        store=store,
        **dict(options),
    )


def run_studies(
    st: Settings, runs_dir: Path, work_dir: Path | None
) -> dict[str, list[dict[str, Any]]]:
    """Every sweep of the study, compared with its reference runs.

    Args:
        st: the scale's settings.
        runs_dir: where the runs that write files (Taylor-Green, the cylinders)
            write them.
        work_dir: where finished simulations are kept (see :func:`run_one`).

    Returns:
        Run records by study: ``poiseuille``, ``poiseuille_width``,
        ``taylor_green``, ``cavity``, ``cylinder``, ``cylinder_unconfined``.
    """
    sweep_stored = functools.partial(sweep, store=work_dir)
    poiseuille = sweep_stored(
        "poiseuille",
        st.runs,
        "poiseuille",
        n=st.poiseuille_n,
        steps=st.poiseuille_steps,
    )
    widths = []
    for n in st.widths:
        if n == st.poiseuille_n:  # already run above
            labels = {storage_label(*r) for r in st.width_runs}
            widths += [r for r in poiseuille if r["label"] in labels]
            continue
        widths += sweep_stored(
            "poiseuille",
            st.width_runs,
            f"poiseuille N={n}",
            n=n,
            steps=st.poiseuille_steps,
        )
    taylor_green = sweep_stored(
        "taylor_green",
        st.runs,
        "taylor_green",
        n=st.taylor_green_n,
        steps=st.taylor_green_steps,
        run_root=runs_dir / "taylor_green",
    )
    cavity = []
    for re in st.cavity_re:
        cavity += sweep_stored(
            "cavity",
            st.cavity_runs,
            f"cavity Re={re}",
            n=st.cavity_n,
            re=re,
            steps=st.cavity_steps,
        )
    shedding = {
        case: cylinder_sweep(case, runs, n, steps, options, runs_dir, work_dir)
        for case, runs, n, steps, options in (
            (
                "cylinder",
                st.cylinder_runs,
                st.cylinder_n,
                st.cylinder_steps,
                st.cylinder_options,
            ),
            (
                "cylinder_unconfined",
                st.unconfined_runs,
                st.unconfined_n,
                None,
                st.unconfined_options,
            ),
        )
    }
    return {
        "poiseuille": poiseuille,
        "poiseuille_width": widths,
        "taylor_green": taylor_green,
        "cavity": cavity,
        **shedding,
    }
