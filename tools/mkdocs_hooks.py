"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark plots kept under benchmarks/results/
join the site as img/<name>.png, so docs/benchmarks.md shows the committed plots without a
second copy of them in docs/."""

import pathlib

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLOTS = ("bench.png", "sweep.png", "sweep_many_channel.png", "budget.png")
PLOT_DIR = ROOT / "benchmarks" / "results" / "cpu"


def on_files(files, config):
  for name in PLOTS:
    files.append(File.generated(config, f"img/{name}", abs_src_path=str(PLOT_DIR / name)))
  return files
