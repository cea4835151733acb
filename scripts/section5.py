"""Song & Zhong Section 5 on small CPU decoders: addition with and without carry, token randomization,
and the NanoGPT row of Table 1 (tfmatcomp.analyses.training_format, tfmatcomp.report.geometry).

Writes OUT/section5.json (every table), OUT/section5.md (the tables docs/geometry.md quotes), the
runs (OUT/addition_*, OUT/random_*, OUT/nanogpt: checkpoints that `tfmatcomp geometry` reads) and
the NanoGPT geometry page (OUT/nanogpt.html). One torch thread by default.

    python scripts/section5.py --out runs/section5                  # all three (about 15 min, 1 thread)
    python scripts/section5.py --out runs/section5 --only addition --addition-steps 3000
    python scripts/section5.py --out runs/carry-10k --only addition --addition-settings carry --addition-steps 10000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

from tfmatcomp.analyses.training_format import addition_experiment, randomization_experiment
from tfmatcomp.geometry.reference import PAPER_TABLE1
from tfmatcomp.report.geometry import nanogpt_experiment

EXPERIMENTS = ("addition", "randomization", "nanogpt")


def _md(df: pd.DataFrame) -> str:
    """A markdown table (floats to 3 significant digits), without the optional tabulate."""
    def cell(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + " --- |" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (must not hold these runs yet)")
    ap.add_argument("--only", choices=EXPERIMENTS, action="append",
                    help="run only these experiments (repeatable; default all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--addition-digits", type=int, default=6, help="L: operands of L//2..L digits")
    ap.add_argument("--addition-steps", type=int, default=3000)
    ap.add_argument("--addition-settings", default="no_carry,carry",
                    help="comma-separated: no_carry, carry (default both)")
    ap.add_argument("--random-steps", type=int, default=800)
    ap.add_argument("--nanogpt-steps", type=int, default=1200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = args.only or list(EXPERIMENTS)
    results: dict = {"threads": args.threads, "torch": torch.__version__, "seed": args.seed}
    md: list[str] = []
    if "addition" in todo:
        t0 = time.perf_counter()
        r = addition_experiment(max_digits=args.addition_digits, n_steps=args.addition_steps,
                                settings=args.addition_settings.split(","), seed=args.seed,
                                out_dir=out)
        acc = r["accuracy"].pivot(index="digits", columns="setting", values="accuracy").reset_index()
        layer_means = r["positional"].groupby("setting").mean(numeric_only=True).reset_index()
        results["addition"] = {"accuracy": r["accuracy"].to_dict("records"),
                               "positional": r["positional"].to_dict("records"),
                               "train_seconds": r["seconds"], "seconds": time.perf_counter() - t0}
        md += ["## Addition: exact-match accuracy by operand length", "", _md(acc), "",
               "## Addition: positional basis, mean over layers", "", _md(layer_means), "",
               "### per layer", "", _md(r["positional"]), ""]
        print(_md(acc), "\n", _md(layer_means), flush=True)
    if "randomization" in todo:
        t0 = time.perf_counter()
        r = randomization_experiment(n_steps=args.random_steps, seed=args.seed, out_dir=out)
        df = r["positional"]
        means = df.groupby(["train", "inference"], sort=False).mean(numeric_only=True).reset_index()
        cols = ["train", "inference", "rank_estimate", "stable_rank", "relative_norm", "adjacent_cos",
                "adjacent_cos_first_half", "adjacent_cos_second_half", "low_freq_energy"]
        results["randomization"] = {"positional": df.to_dict("records"),
                                    "train_seconds": r["seconds"], "seconds": time.perf_counter() - t0}
        md += ["## Token randomization: positional basis, mean over layers", "",
               _md(means[cols]), "", "### per layer", "", _md(df), ""]
        print(_md(means[cols]), flush=True)
    if "nanogpt" in todo:
        r = nanogpt_experiment(n_steps=args.nanogpt_steps, seed=args.seed, out_dir=out,
                               report=out / "nanogpt.html")
        paper = PAPER_TABLE1[("NanoGPT", "Shakespeare")]
        rows = [r["row"], {"model": "NanoGPT (paper)", "corpus": "Shakespeare",
                           **{k: "n/a" if v is None else f"{v[0]:g} ({v[1]:g})"
                              for k, v in paper.items()}}]
        results["nanogpt"] = {"row": r["row"], "summary": r["summary"].to_dict("records"),
                              "metrics": r["metrics"].to_dict("records"),
                              "train_seconds": r["seconds"]}
        md += ["## NanoGPT row of Table 1", "", _md(pd.DataFrame(rows)), "", "### per layer", "",
               _md(r["summary"]), ""]
        print(_md(pd.DataFrame(rows)), flush=True)
    (out / "section5.json").write_text(json.dumps(results, indent=1, default=float))
    (out / "section5.md").write_text("\n".join(md))
    print(f"written {out / 'section5.json'} and {out / 'section5.md'}")


if __name__ == "__main__":
    main()
