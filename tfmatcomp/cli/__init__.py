"""Command line: train the papers' BERT on matrix completion, report on a run, and more.

Commands: ``train``, ``presets``, ``report``, ``demo``, ``geometry``, ``sweep``, ``dynamics``,
``models`` (``tfmatcomp COMMAND --help`` for each). One meaning per flag in every command: ``--run-dir`` is a
run directory (``train``, ``sweep``, ``demo``), ``-o/--output`` a file to write (its folder must
exist), ``--seed`` a training seed, ``--sample-seed`` the seed of the matrices a command draws.

Each command group is one module of this package (``train``, ``report``, ``geometry``, ``sweep``,
``dynamics``, ``models``); :mod:`~tfmatcomp.cli.args` holds the registry and the arguments they share, and
:mod:`~tfmatcomp.cli.names` the names offered, so that ``--help`` imports neither torch nor
TransformerLens.
"""

from __future__ import annotations

import argparse
import sys

from tfmatcomp.cli.args import _COMMANDS, BOUNDS, bounds_of, check_bounds, int_list  # noqa: F401

# each command module registers its commands on import; this order is the order of ``--help``
from tfmatcomp.cli import train  # noqa: E402,F401  (train, presets)
from tfmatcomp.cli import report  # noqa: E402,F401  (report, demo)
from tfmatcomp.cli import geometry  # noqa: E402,F401
from tfmatcomp.cli import sweep  # noqa: E402,F401
from tfmatcomp.cli import dynamics  # noqa: E402,F401
from tfmatcomp.cli import models  # noqa: E402,F401


DESCRIPTION = """\
tfmatcomp: hook-based interpretability for a BERT trained on low-rank matrix completion,
whose loss plateaus while it copies its input and then drops suddenly when it learns to
complete the matrix (Gopalani, Lubana, Hu).

One meaning per flag in every command: --run-dir is a run directory (train, sweep,
demo), -o/--output a file to write (its folder must exist), --seed a training seed,
--sample-seed the seed of the matrices a command draws."""

EXAMPLES = """\
examples:
  tfmatcomp demo                                   train the tiny preset, write report.html
  tfmatcomp demo --bundled                         report on the run shipped in the package
  tfmatcomp demo --seed 3 --run-dir runs/seed3     train seed 3 and report on it
  tfmatcomp presets                                the presets and what each is for
  tfmatcomp train --preset tiny --run-dir runs/tiny --steps 2000
  tfmatcomp train --run-dir runs/tiny --steps 4000 --resume
  tfmatcomp train --run-dir runs/group --seeds 0-7 several seeds as one batched program
  tfmatcomp report runs/tiny -o report.html --sections training,ablation
  tfmatcomp sweep --run-dir runs/width --grid d_model=32,64,128 --seeds 0-1
  tfmatcomp dynamics runs/tiny --measures L_mask,copying -o runs/tiny-dynamics.csv
  tfmatcomp geometry MODEL_DIR TEXT_OR_DIR -o geometry.html
  tfmatcomp models list                            the pretrained runs: size, where they are

docs: docs/quickstart.md; every command: tfmatcomp COMMAND --help"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfmatcomp", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    debug_help = "show the full traceback of an error instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    from tfmatcomp import __version__

    parser.add_argument("--version", action="version", version=f"tfmatcomp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    for name, (setup, fn) in _COMMANDS.items():
        doc = " ".join((fn.__doc__ or "").split())
        p = sub.add_parser(name, help=doc.split(". ")[0].rstrip(".") if doc else None,
                           description=doc or None)
        setup(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p.set_defaults(_run=fn, _bounds=bounds_of(name, p))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. A user error (a bad value, an unusable path or device, a checkpoint that
    cannot be loaded) prints one line and returns 2; any other error prints one line naming its
    type and returns 1; ``--debug`` shows the traceback instead."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_bounds(args)  # every number in its range, before any work
        if getattr(args, "device", None) is not None:
            from tfmatcomp.validation import check_device

            check_device("--device", args.device)
        return args._run(args)
    except (ValueError, OSError) as e:  # user errors: one line naming the argument or file
        if args.debug:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"tfmatcomp {args.command}: error: {message}", file=sys.stderr)
        return 2
    except Exception as e:  # anything else: still one line; --debug shows the traceback
        if args.debug:
            raise
        message = " ".join(str(e).split())
        print(f"tfmatcomp {args.command}: error: {type(e).__name__}"
              f"{': ' + message if message else ''} (an unexpected error: run again with --debug "
              "for the traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
