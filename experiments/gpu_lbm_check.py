"""GPU checks of the fused step that the CPU cannot make: run on a GPU machine.

``python -m experiments.gpu_lbm_check --out DIR`` runs, each part time-limited
and written to ``DIR/gpu_lbm_check.json`` as it finishes:

1. agreement: the fused GPU step against the XLA step on the same GPU (D3Q19 with
   walls, a moving lid, equilibrium cells, a force and TRT; FP16S and posit16):
   one step from the same state within rounding (:func:`within_rounding`),
   equal mass after the run to within the storage precision; in place
   (esoteric pull) against two buffers bit for bit;
2. large grid: D3Q19 FP32/FP16S in place on ``--large`` cells per side (1500 on
   an H200: 38 B per cell, about 128 GB) initialised and advanced 10 steps, its
   rate and whether it stays healthy;
3. coupled: the capsule case at r = 5 (a 50^3 box) and the D = 16 raindrop
   through the command line, their MLUPs from the run summary.

The exit status is non-zero when a check fails (a part that could not run
counts as failed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CODES_PER_STEP", "main", "within_rounding"]

#: Most codes of the storage format a stored population may differ, per step,
#: between the fused and the XLA step (multiply-adds may contract differently).
CODES_PER_STEP = 2


def _code_gaps(storage: Any, a: Any, b: Any) -> np.ndarray:
    """Distances between two arrays of stored codes, in codes of the storage
    format (its representable values in order)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        a = a.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[a.itemsize])
        b = b.view(a.dtype)
    signed = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.int8}[a.itemsize]
    ia, ib = a.view(signed).astype(np.int64), b.view(signed).astype(np.int64)
    if not storage.format.name.startswith("posit"):
        # sign-magnitude codes onto one line (+0 and -0 coincide); posit codes
        # are two's complement integers, already in order
        top = np.int64(1) << (8 * a.itemsize - 1)
        ia = np.where(ia < 0, -(ia + top), ia)
        ib = np.where(ib < 0, -(ib + top), ib)
    return np.abs(ia - ib)


def within_rounding(sim: Any, a: Any, b: Any, steps: int) -> tuple[bool, int]:
    """Whether two stored states of ``sim`` agree to within rounding after
    ``steps`` steps, and their largest distance in codes.

    A population passes when its codes lie at most :data:`CODES_PER_STEP` per
    step apart, or its decoded values differ by at most that many ulps of the
    compute dtype at the size of the unshifted population (DDF-shifted values
    near zero carry the rounding error of terms of size ``w_i``).
    """
    storage = sim.storage
    codes = _code_gaps(storage, a, b)
    va = np.asarray(storage.decode(a), np.float64)
    vb = np.asarray(storage.decode(b), np.float64)
    w = sim.lattice.w.reshape((1, -1) + (1,) * (va.ndim - 2))
    size = np.abs(va + w) if storage.shift else np.abs(va)
    eps = float(np.finfo(storage.compute_dtype).eps)
    close = np.abs(va - vb) <= CODES_PER_STEP * steps * eps * np.maximum(size, w)
    ok = bool(np.all((codes <= CODES_PER_STEP * steps) | close))
    return ok, int(codes.max()) if codes.size else 0


def _agreement(shape: tuple[int, ...], steps: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import lbm_jax

    ct = np.zeros(shape, np.int32)
    ct[:, 0] = lbm_jax.CellType.SOLID
    ct[:, -1] = lbm_jax.CellType.WALL
    ct[0, 2:6] = lbm_jax.CellType.EQUILIBRIUM
    out = {}
    for storage in ("fp16s", "posit16"):
        config = dict(
            tau=0.7,
            storage=storage,
            cell_type=ct,
            wall_velocity=[0.05, 0.0, 0.0],
            force=[1e-6, 0.0, 0.0],
            collision="trt",
        )
        sims = {
            "xla": lbm_jax.Simulation("D3Q19", shape, backend="xla", **config),
            "gpu": lbm_jax.Simulation("D3Q19", shape, backend="gpu", **config),
            "gpu_inplace": lbm_jax.Simulation(
                "D3Q19", shape, backend="gpu", streaming="inplace", **config
            ),
        }
        u0 = np.array([0.02, 0.01, -0.01])
        states = {k: s.advance(s.init(u=u0), steps) for k, s in sims.items()}
        mass = {
            k: float(np.sum(np.asarray(lbm_jax.density(sims[k], s), np.float64)))
            for k, s in states.items()
        }
        # one more step by both from the same state: within rounding
        last = {
            k: sims[k].advance(jax.tree.map(jnp.copy, states["xla"]), 1)
            for k in ("xla", "gpu")
        }
        close, codes = within_rounding(sims["xla"], last["xla"].f, last["gpu"].f, 1)
        inplace_differ = int(
            np.count_nonzero(
                np.asarray(states["gpu"].f) != np.asarray(states["gpu_inplace"].f)
            )
        )
        eps = 10 * steps * float(sims["xla"].storage.format.epsilon)
        out[storage] = {
            "last_step_codes_max": codes,
            "inplace_bits_differ": inplace_differ,
            "mass": mass,
            "ok": close
            and inplace_differ == 0
            and abs(mass["gpu"] - mass["xla"]) <= eps * abs(mass["xla"]),
        }
    return out


def _large(n: int, steps: int) -> dict[str, Any]:
    import jax

    import lbm_jax

    t0 = time.perf_counter()
    sim = lbm_jax.Simulation(
        "D3Q19", (n, n, n), tau=0.6, storage="fp16s", streaming="inplace"
    )
    state = jax.block_until_ready(sim.init(u=[0.02, 0.0, 0.0]))
    t_init = time.perf_counter() - t0
    state = jax.block_until_ready(sim.advance(state, 2))  # compile
    t1 = time.perf_counter()
    state = jax.block_until_ready(sim.advance(state, steps))
    seconds = time.perf_counter() - t1
    return {
        "n": n,
        "step_backend": sim.backend,
        "bytes": int(state.f.nbytes),
        "init_seconds": t_init,
        "mlups": n**3 * steps / seconds / 1e6,
        "healthy": bool(sim.healthy(state)),
        "ok": bool(sim.healthy(state)) and sim.backend == "gpu",
    }


def _case(args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "lbm_jax", "run", *args, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    summary = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    stats = summary.get("stats", summary)
    return {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "stdout": proc.stdout[-2000:],
        "stderr": proc.stderr[-2000:],
        "mlups": stats.get("mlups"),
        "step_backend": summary.get("step_backend"),
        "ok": proc.returncode == 0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 when one fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--large", type=int, default=1500, help="large-grid side")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU try)")
    parser.add_argument(
        "--parts",
        default="agreement,large,capsule,raindrop",
        help="comma-separated parts to run (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    shape = (8, 6, 20) if args.small else (64, 48, 40)
    parts = {
        "agreement": lambda: _agreement(shape, 3 if args.small else 21),
        "large": lambda: _large(args.large, 2 if args.small else 10),
        # the 50^3 capsule (r = 5, 4-point delta) of the earlier GPU figure,
        # 904 MLUPs on the XLA step
        "capsule": lambda: _case(
            [
                "capsule",
                *("--radius", "5", "--delta", "4"),
                *(["--steps", "20"] if args.small else []),
            ],
            out / "capsule",
        ),
        "raindrop": lambda: _case(
            ["raindrop", "--n", "16", *(["--steps", "5"] if args.small else [])],
            out / "raindrop",
        ),
    }
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in parts]
    if unknown or not chosen:
        parser.error(f"--parts must name some of {list(parts)}, got {args.parts!r}")
    for name in chosen:
        part = parts[name]
        t0 = time.perf_counter()
        try:
            results[name] = part()
        except Exception as err:  # a part that cannot run is a failed check
            traceback.print_exc()
            results[name] = {"error": repr(err)[:2000], "ok": False}
        results[name]["seconds"] = time.perf_counter() - t0
        print(name, json.dumps(results[name], default=str)[:1500], flush=True)
        (out / "gpu_lbm_check.json").write_text(
            json.dumps(results, indent=1, default=str)
        )
    agreement = results.pop("agreement", {})
    verdicts = [v.get("ok", False) for v in results.values()]
    if agreement:
        verdicts.append("error" not in agreement)
        verdicts += [v["ok"] for v in agreement.values() if isinstance(v, dict)]
    ok = all(verdicts)
    print("gpu_lbm_check:", "pass" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
