"""``tfmatcomp geometry``: Song & Zhong's geometry of a local model on a text."""

from __future__ import annotations

import argparse

from tfmatcomp.cli.args import command, output_file, progress_arg, progress_of, written
from tfmatcomp.cli.names import GEOMETRY_SECTIONS


def _geometry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="local transformers model directory (bert or gpt2, with its "
                   "tokenizer), or a tfmatcomp HookedDecoder checkpoint or run directory whose "
                   "metadata holds its tokenizer (tfmatcomp.training.lm.train_lm); nothing is "
                   "downloaded")
    p.add_argument("text", help="text file (documents separated by blank lines) or directory (one "
                   "document per file); documents are the cluster labels")
    p.add_argument("-o", "--output", default="geometry.html",
                   help="HTML file to write (default geometry.html; its folder must exist)")
    p.add_argument("--contexts", type=int, default=256, help="C, contexts of the first pass (256)")
    p.add_argument("--positions", type=int, default=128, help="T, tokens per context (128)")
    p.add_argument("--second-pass", type=int, default=32, help="contexts of the second pass (32)")
    p.add_argument("--batch-size", type=int, default=16, help="contexts per forward pass (16)")
    p.add_argument("--layer", type=int, help="layer of the Gram / QK sections (default: middle)")
    p.add_argument("--head", type=int, default=0, help="head of the QK figure (0-based)")
    p.add_argument("--drop-first", type=int, default=1, help="leading tokens dropped (1: the "
                   "paper's first-token artifact)")
    p.add_argument("--sample-seed", type=int, default=0,
                   help="seed of the text windows drawn as contexts (default 0)")
    p.add_argument("--sections", help="comma-separated subset of "
                   f"{', '.join(GEOMETRY_SECTIONS)} (default: all)")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    progress_arg(p)


@command("geometry", _geometry_args)
def _geometry(args: argparse.Namespace) -> int:
    """Song & Zhong's geometry of a local BERT / GPT-2 / HookedDecoder on a text, as one HTML page."""
    from tfmatcomp.report.geometry import run_geometry

    output_file("-o/--output", args.output)
    report = run_geometry(args.model_dir, args.text, args.output, n_contexts=args.contexts,
                          n_positions=args.positions, n_second=args.second_pass,
                          batch_size=args.batch_size, layer=args.layer, head=args.head,
                          drop_first=args.drop_first, seed=args.sample_seed, device=args.device,
                          sections=args.sections.split(",") if args.sections else None,
                          progress=progress_of(args) is not False)
    return written(report, "geometry report")


