"""results/index.html: one self-contained page, checked in a real headless browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from experiments.__main__ import main
from experiments._report import new_figure, save_figure


def _with_figure(out_dir: Path, *, quick: bool = True, seed: int = 0) -> dict:
    fig, axes = new_figure()
    axes[0, 0].plot([0, 1, 2], [2, 0, 1], color="tab:red", lw=6)
    save_figure(fig, out_dir / "curve.png", caption="quick scale, test machine")
    (out_dir / "REPORT.md").write_text(
        "# Stand-in\n\n| a | b |\n|---|---:|\n| x | 1 |\n\n![curve](curve.png)\n"
    )
    return {"table": "| a |", "checks": {"ok": True}}


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    assert main(["reproduce", "--out", str(out)], pipelines={"demo": _with_figure}) == 0
    return out / "index.html"


def test_index_is_self_contained_with_every_table_and_figure(page):
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 1
    assert 'src="curve.png"' not in text  # nothing to fetch from disk
    assert "<table>" in text and "<h1>Stand-in</h1>" in text
    assert "Reproduction summary" in text and 'href="#demo"' in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium")
def test_index_renders_its_figure_in_a_headless_browser(page, tmp_path):
    shot = tmp_path / "page.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--screenshot={shot}",
            "--window-size=1280,2400",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = image.imread(shot)[..., :3]
    red = (pixels[..., 0] > 0.7) & (pixels[..., 1] < 0.35) & (pixels[..., 2] < 0.35)
    assert red.sum() > 500, "the figure's thick red line is not on the page"
    assert np.unique(pixels.reshape(-1, 3), axis=0).shape[0] > 50
