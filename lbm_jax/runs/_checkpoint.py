"""Periodic checkpoints of a run: atomic files, the last few kept, bit-exact resume.

A :class:`Checkpoint` tells :func:`lbm_jax.run` to save the whole run every
``every`` steps into ``directory``: the state pytree (a fluid state and any coupled
arrays), the samples taken so far, the driver's step counter and the caller's
``metadata`` (e.g. the case options and :func:`code_version`). Each file is
written atomically (temporary file, ``fsync``, rename), and only the newest
``keep`` files stay. With ``resume=True`` a run starts from the newest readable
checkpoint in ``directory``: an unreadable newest file (truncated, damaged, or
in another checkpoint format) is skipped, with a warning, in favour of the
previous one, and a checkpoint whose metadata differs from the caller's is
refused. Since checkpoints hold the raw bits of every array, a resumed run
continues exactly as an uninterrupted one would; a run asked for fewer steps
than its checkpoints already hold is refused (:class:`ResumeError`).

>>> import tempfile, lbm_jax
>>> sim = lbm_jax.Simulation("D2Q9", (16, 8), tau=0.8)
>>> policy = lbm_jax.Checkpoint(tempfile.mkdtemp(), every=20, metadata={"tau": 0.8})
>>> lbm_jax.run(sim, sim.init(), 50, checkpoint=policy).stats.steps
50
>>> [p.name for p in policy.files()]
['step_0000000040.npz', 'step_0000000050.npz']
>>> again = lbm_jax.run(sim, sim.init(), 50, checkpoint=policy)  # done already
>>> again.stats.steps, again.stats.resumed_from, int(again.state.t)
(0, 50, 50)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lbm_jax.core._validation import check_int
from lbm_jax.io._files import load_state, read_metadata, save_state

__all__ = ["Checkpoint", "ResumeError", "check_same", "code_version"]

_PATTERN = "step_*.npz"


class ResumeError(ValueError):
    """A run cannot resume: its checkpoints belong to another run or are unreadable."""


@functools.cache
def code_version() -> str:
    """The installed package version and a fingerprint of the solver's source.

    ``"<version>+<12 hex digits>"``: the digits hash every file of
    ``source_files`` (the Python sources of ``lbm_jax`` and ``mpjax`` and
    the native steps' C++ sources), so results and checkpoints of two different
    code versions never pass for each other, even between releases.
    """
    try:
        version = importlib.metadata.version("mpjax")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for source in source_files():
        digest.update(source.relative_to(root).as_posix().encode())
        digest.update(source.read_bytes())
    return f"{version}+{digest.hexdigest()[:12]}"


def source_files() -> list[Path]:
    """The files whose content decides the results: every ``.py`` file of
    ``lbm_jax`` and ``mpjax`` and the C++ sources the native steps compile."""
    root = Path(__file__).resolve().parents[2]
    files = [f for p in ("lbm_jax", "mpjax") for f in (root / p).rglob("*.py")]
    native = root / "lbm_jax" / "step" / "_native"
    files += [f for pattern in ("*.cc", "*.h") for f in native.glob(pattern)]
    return sorted(files)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where and how often :func:`lbm_jax.run` saves, and whether it resumes.

    Attributes:
        directory: Folder of the checkpoint files (``step_<t>.npz``), created on
            the first save.
        every: Steps between two checkpoints (counted from the start of the run);
            the run also saves when it ends.
        metadata: JSON-serialisable description of the run (options, code
            version). A resumed checkpoint must carry the same metadata.
        keep: Number of newest checkpoint files kept (at least 1).
        resume: Start from the newest readable checkpoint in ``directory``, if any.

    Raises:
        ValueError, TypeError: Bad ``every``/``keep`` or metadata that JSON cannot
            hold.
    """

    directory: str | os.PathLike[str]
    every: int
    metadata: Mapping[str, Any] | None = None
    keep: int = 2
    resume: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        object.__setattr__(self, "every", check_int(self.every, "every", 1))
        object.__setattr__(self, "keep", check_int(self.keep, "keep", 1))
        if not isinstance(self.resume, bool):
            raise TypeError(f"resume must be a bool, got {self.resume!r}.")
        try:
            normal = json.loads(json.dumps(dict(self.metadata or {})))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"Checkpoint metadata must be JSON-serialisable: {err}."
            ) from None
        object.__setattr__(self, "metadata", normal)

    def files(self) -> list[Path]:
        """The checkpoint files in ``directory``, oldest first."""
        return sorted(Path(self.directory).glob(_PATTERN))

    def save(self, step: int, tree: Any, record: Mapping[str, Any]) -> Path:
        """Write ``tree`` (with the driver's ``record``) and drop the oldest files."""
        path = Path(self.directory) / f"step_{step:010d}.npz"
        save_state(path, tree, metadata={"run": dict(record), "user": self.metadata})
        for old in self.files()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def newest_record(self) -> dict[str, Any] | None:
        """The driver's record of the newest checkpoint whose metadata reads, or
        ``None`` (nothing loaded, nothing checked)."""
        for path in reversed(self.files()):
            try:
                return dict(read_metadata(path)["run"])
            except (KeyError, TypeError, ValueError):  # unreadable, any kind
                continue
        return None

    def restore(
        self,
        template: Callable[[Mapping[str, Any]], Any],
        expect: Mapping[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]] | None:
        """The newest readable checkpoint ``(tree, record)``, or ``None`` if none.

        Args:
            template: ``template(record) -> pytree`` like the saved tree (its
                shapes may depend on the record, e.g. the number of samples).
            expect: Entries the driver's record must hold (e.g. the sampling
                interval), checked before anything is loaded.

        A checkpoint that cannot be read for any reason (truncated, damaged,
        another checkpoint format, arrays that do not fit ``template``) is
        skipped with a ``RuntimeWarning`` in favour of the previous one.

        Raises:
            ResumeError: If a checkpoint's metadata differs from ``metadata`` or
                ``expect``, or if every checkpoint file is unreadable.
        """
        files = self.files()
        for path in reversed(files):
            try:
                meta = read_metadata(path)
                source = f"Checkpoint {str(path)!r}"
                check_same(source, meta.get("user", {}), self.metadata)
                record = meta["run"]
                check_same(source, {k: record.get(k) for k in expect or {}}, expect)
                tree, _ = load_state(path, like=template(record))
            except ResumeError:
                raise
            except (ValueError, KeyError, TypeError) as err:  # unreadable, any kind
                warnings.warn(
                    f"Skipping checkpoint {path.name}: {err}. Trying an older one.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            return tree, record
        if files:
            raise ResumeError(
                f"None of the {len(files)} checkpoint(s) in {str(self.directory)!r} "
                "is readable; remove them to start afresh."
            )
        return None


def check_same(source: str, stored: Any, given: Any) -> None:
    """Raise :class:`ResumeError` listing where ``stored`` and ``given`` differ.

    Args:
        source: What holds ``stored`` (quoted in the message).
        stored: The recorded description (JSON types).
        given: The description of the run that wants to resume.
    """
    differences = _differences(stored, given)
    if differences:
        raise ResumeError(
            f"{source} belongs to another run: "
            + "; ".join(differences)
            + ". Resume with the options it was written with, or use a new "
            "directory."
        )


def _differences(stored: Any, given: Any, prefix: str = "") -> list[str]:
    if isinstance(stored, dict) and isinstance(given, dict):
        out = []
        for key in sorted(set(stored) | set(given)):
            name = f"{prefix}{key}"
            if key not in stored or key not in given:
                out.append(
                    f"{name} is {stored.get(key, '<missing>')!r} in the checkpoint "
                    f"but {given.get(key, '<missing>')!r} now"
                )
            else:
                out.extend(_differences(stored[key], given[key], f"{name}."))
        return out
    if stored != given:
        return [f"{prefix.rstrip('.')} was {stored!r}, now {given!r}"]
    return []
