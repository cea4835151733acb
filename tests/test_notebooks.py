"""Every notebook in examples/ runs top to bottom, and its HTML export shows each figure as a plot.

* Notebooks are found by globbing ``examples/*.ipynb`` and executed with nbclient in a ``python3``
  kernel of this interpreter (``sys.executable``), with this checkout first on ``PYTHONPATH``;
  ``TFMATCOMP_NOTEBOOK_CELL_TIMEOUT`` (seconds, default 900: a guard against a hang, far above a
  cell's run time even on a machine slowed 50x) bounds each cell. Any error fails.
* The executed notebook is exported with nbconvert's ``HTMLExporter`` (what ``jupyter nbconvert
  --to html`` does). Every figure output must carry plotly's mimetype (JupyterLab, VS Code) *and*
  ``text/html``; the HTML must hold one plotly div drawn by one ``Plotly.newPlot`` call per figure,
  plotly.js inline before the first of them, and no ``<script src>`` beyond those nbconvert's own
  template writes (so no CDN plotly.js or MathJax). A figure emitted only as plotly's mimetype fails
  (checked below on a hand-made notebook, without a kernel).
* Committed notebooks carry no outputs.
"""

from __future__ import annotations

import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="dev extra: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="dev extra: pip install -e '.[dev]'")
nbconvert = pytest.importorskip("nbconvert", reason="dev extra: pip install -e '.[dev]'")
pytest.importorskip("ipykernel", reason="dev extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
CELL_TIMEOUT = int(os.environ.get("TFMATCOMP_NOTEBOOK_CELL_TIMEOUT", "900"))
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: Figures a notebook must show at least (notebooks not listed: at least none).
MIN_FIGURES = {"first_hour.ipynb": 4, "real_encoders.ipynb": 4}


def _figure_outputs(nb) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
            if PLOTLY_MIME in out.get("data", {})]


class _Tags(HTMLParser):
    """The ids of plotly's figure divs and the ``src`` of every script element of a page."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.plotly_divs: list[str] = []
        self.script_srcs: set[str] = set()
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and "plotly-graph-div" in (a.get("class") or "").split():
            self.plotly_divs.append(a.get("id") or "")
        elif tag == "script" and a.get("src") is not None:
            self.script_srcs.add(a["src"] or "")


def _html(nb) -> str:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    return body


def check_figures_shown(nb, html: str) -> int:
    """Assert that each figure of the executed notebook ``nb`` is a plot in its HTML export
    ``html``; return the number of figures."""
    from plotly.offline import get_plotlyjs_version

    figures = _figure_outputs(nb)
    for out in figures:
        assert "text/html" in out["data"], (
            "a figure is output only as plotly's mimetype, which static HTML cannot show: "
            "importing tfmatcomp in a kernel should have switched plotly's renderer (docs/notebooks.md)")
    tags = _Tags(html)
    drawn = re.findall(r"Plotly\.newPlot\(\s*\"([^\"]+)\"", html)
    assert len(drawn) == len(figures), f"{len(figures)} figures, {len(drawn)} Plotly.newPlot calls"
    assert sorted(tags.plotly_divs) == sorted(drawn), "each plotly div is drawn by one newPlot call"
    template_srcs = _Tags(_html(nbformat.v4.new_notebook())).script_srcs
    extra = tags.script_srcs - template_srcs
    assert not extra, f"outputs load scripts over the network: {sorted(extra)}"
    assert not re.search(r"import\s*[\"']https?://", html), "an output imports a module by URL"
    if figures:
        header = f"plotly.js v{get_plotlyjs_version()}"
        assert html.count(header) == 1, "plotly.js must be inline exactly once"
        assert html.index(header) < html.index("Plotly.newPlot("), "plotly.js must load first"
    return len(figures)


def test_the_documented_notebook_exists():
    assert "first_hour.ipynb" in {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{path.name}: clear the outputs before committing "
                "(jupyter nbconvert --clear-output --inplace)")


def _client(nb, tmp_path: Path):
    """An nbclient client for ``nb`` in a ``python3`` kernel of this interpreter, and its env."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    kernels = tmp_path / "kernels"
    write_kernel_spec(str(kernels / "python3"))          # argv[0] is sys.executable
    km = KernelManager(kernel_name="python3",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    assert km.kernel_spec.argv[0] == sys.executable
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")              # tests run in parallel workers
    env.pop("PYTEST_CURRENT_TEST", None)                 # the kernel is a notebook, not a test
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    return client, env


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_its_html_shows_every_figure(path: Path, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    assert "notebook_mode" not in "".join(c.source for c in nb.cells), (
        "figures must show without a setup call")
    client, env = _client(nb, tmp_path)
    client.execute(env=env)                              # raises CellExecutionError on an error
    html = _html(nb)
    n = check_figures_shown(nb, html)
    assert n >= MIN_FIGURES.get(path.name, 0), f"{path.name}: {n} figures shown"
    stderr = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("name") == "stderr"]
    assert not any("IProgress" in o.get("text", "") for o in stderr), "tqdm warned in the notebook"


def test_a_figure_cell_run_twice_still_shows_every_figure(tmp_path: Path):
    """Rerunning the cell of the first figure replaces its output, and plotly.js was in it: the
    rerun must bring plotly.js again, or every figure of the exported page would vanish."""
    cells = [nbformat.v4.new_code_cell(src) for src in (
        "import plotly.graph_objects as go\nimport tfmatcomp as tm",
        "go.Figure(go.Bar(y=[1, 2]))",
        "tm.plotting.loss_curve_figure(tm.read_metrics(tm.pretrained.run_dir('tiny')))",
        "go.Figure(go.Scatter(y=[3, 1, 2]))")]
    nb = nbformat.v4.new_notebook(cells=cells)
    client, env = _client(nb, tmp_path)
    with client.setup_kernel(env=env):
        for index in (0, 1, 2, 1, 3):                   # the first figure's cell runs twice
            client.execute_cell(nb.cells[index], index)
    assert [len(_figure_outputs(nbformat.v4.new_notebook(cells=[c]))) for c in nb.cells] == [0, 1, 1, 1]
    assert check_figures_shown(nb, _html(nb)) == 3


def _figure(data: dict) -> dict:
    return nbformat.v4.new_output("display_data", data=data)


def test_a_figure_only_in_plotlys_mimetype_fails_the_check():
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(y=[1, 2]))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("fig", outputs=[
        _figure({PLOTLY_MIME: fig.to_plotly_json(), "text/plain": "Figure()"})])])
    with pytest.raises(AssertionError, match="only as plotly's mimetype"):
        check_figures_shown(nb, _html(nb))


def test_notebook_mode_output_passes_and_cdn_plotly_fails_the_check():
    import plotly.graph_objects as go
    import plotly.io as pio

    from tfmatcomp.plotting.notebook import offline_figure_html, plotlyjs_html

    fig = go.Figure(go.Bar(y=[1, 2]))
    setup = nbformat.v4.new_code_cell("tm.plotting.notebook_mode()", outputs=[
        _figure({"text/html": plotlyjs_html(), "text/plain": "<HTML>"})])
    shown = nbformat.v4.new_code_cell("fig", outputs=[
        _figure({PLOTLY_MIME: fig.to_plotly_json(), "text/html": offline_figure_html(fig)})])
    nb = nbformat.v4.new_notebook(cells=[setup, shown])
    assert check_figures_shown(nb, _html(nb)) == 1
    cdn = nbformat.v4.new_code_cell("fig", outputs=[_figure({
        PLOTLY_MIME: fig.to_plotly_json(),
        "text/html": pio.to_html(fig, include_plotlyjs="cdn", full_html=False)})])
    nb = nbformat.v4.new_notebook(cells=[cdn])
    with pytest.raises(AssertionError, match="over the network"):
        check_figures_shown(nb, _html(nb))
