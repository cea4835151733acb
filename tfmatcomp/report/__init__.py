"""One self-contained HTML report of every analysis on a run's pre- and post-shift checkpoints.

``tfmatcomp report RUN -o report.html`` (or :func:`build_report`) walks the papers' story on a
training run: the loss curve and its sudden drop (every seed's, for a multi-seed run), the copying
check, ablations, transplants, permutations, patching, the per-head scan, attention maps over
training, embeddings, probes, the nuclear-norm baseline, out-of-distribution inputs and the
position / context decomposition. Each section says what it shows and gives the papers' value
(4 layers x 8 heads, 7x7 rank-2) beside ours. Every number comes from the library's analysis
functions; this package only arranges them:

* :mod:`.run`: which run, which seed, the drop, the pre- / post-shift checkpoints;
* :mod:`.sections`: the sections and their prose;
* :mod:`.render`: the HTML page;
* :mod:`.build`: :func:`build_report`, which runs the sections and writes the page.

``tfmatcomp demo`` trains several seeds of the tiny preset at once (or, with ``--bundled``, uses the
run shipped in the package) and writes the report.

Example:
    >>> import tfmatcomp as tm
    >>> report = tm.report.build_report("tiny", "/tmp/tiny-report.html", n_samples=32,
    ...                                 progress=False, sections=["training"])
    >>> report.failed
    []
"""


from tfmatcomp._lazy import submodules_on_first_use
from tfmatcomp.report.build import Report, build_report
from tfmatcomp.report.run import RunContext, SeedGroup, choose_steps, load_context, resolve_run
from tfmatcomp.report.sections import SECTIONS, Section

__all__ = ["build_report", "Report", "Section", "RunContext", "SeedGroup", "SECTIONS",
           "resolve_run", "load_context", "choose_steps"]


__getattr__ = submodules_on_first_use(__name__)
