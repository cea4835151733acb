"""Draw metrics-log curves of one or more runs into a small PNG for the docs (matplotlib; the
library's own figures are plotly HTML, too large to commit).

    python scripts/curves_png.py docs/figures/x.png RUN1 RUN2 --labels a,b --columns eval_L_mask
    python scripts/curves_png.py docs/figures/y.png RUN --columns eval_CE_obs,eval_CE_mask --linear
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import tfmatcomp as tm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("runs", nargs="+", help="run directories (metrics.jsonl)")
    ap.add_argument("--labels", help="comma-separated, one per run (default: the directory names)")
    ap.add_argument("--columns", default="eval_L_mask", help="comma-separated metrics columns")
    ap.add_argument("--title", default="")
    ap.add_argument("--linear", action="store_true", help="linear y axis (default: log)")
    ap.add_argument("--smooth", type=int, default=5, help="rolling-median window (1: none)")
    ap.add_argument("--max-step", type=int, help="draw the logs up to this step only")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else [r.rstrip("/").split("/")[-1] for r in args.runs]
    columns = args.columns.split(",")
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for run, label in zip(args.runs, labels):
        m = tm.read_metrics(run)
        if args.max_step is not None:
            m = m[m["step"] <= args.max_step]
        for col in columns:
            y = m[col].rolling(args.smooth, center=True, min_periods=1).median()
            name = label if len(columns) == 1 else (f"{label} {col}" if len(args.runs) > 1 else col)
            ax.plot(m["step"], y, label=name, lw=1.3)
    if not args.linear:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(columns[0] if len(columns) == 1 else "")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
