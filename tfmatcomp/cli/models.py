"""``tfmatcomp models``: list, pull and export the pretrained runs (the work is
:mod:`tfmatcomp.pretrained.commands`'; this module parses the arguments)."""

from __future__ import annotations

import argparse

from tfmatcomp.cli.args import command


def _models_args(p: argparse.ArgumentParser) -> None:
    p.description = ("The pretrained runs of the registry: the wheel bundles some, the others come "
                     "from TFMATCOMP_MODELS_DIR (a clone's tfmatcomp/pretrained) or the Hub "
                     "(HF_ENDPOINT, HF_HUB_OFFLINE, HF_HOME honoured); every file is checked "
                     "against its SHA-256 (docs/pretrained.md).")
    p.epilog = ("examples: tfmatcomp models list; tfmatcomp models pull paper-4l8h; "
                "tfmatcomp models pull paper-cpu --steps 9000 12000; "
                "tfmatcomp models export paper-4l8h out/paper-4l8h")
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,pull,export}",
                           help="list the runs, pull one, or export one for the Hub")
    listing = sub.add_parser("list", help="every run: its size, pre/post-shift steps and where its "
                             "files are (bundled, checkout, directory, cache or remote)")
    pull = sub.add_parser("pull", help="download a run from the Hub (or copy it from the package "
                          "or --models-dir) into the download cache, verified against the registry")
    pull.add_argument("name", help="the run (tfmatcomp models list)")
    pull.add_argument("--steps", type=int, nargs="+", metavar="STEP",
                      help="only these checkpoints (and the run's logs); default: every step")
    export = sub.add_parser("export", help="write the folder to upload to the run's Hub "
                            "repository: its files, a model card README.md, its registry entry")
    export.add_argument("name", help="the run (tfmatcomp models list)")
    export.add_argument("dir", help="a new or empty folder")
    for q in (listing, pull, export):
        q.add_argument("--models-dir", help="a folder holding <run>/... in the repository's layout, "
                       "tried after the package (default: $TFMATCOMP_MODELS_DIR)")


@command("models", _models_args)
def _models(args: argparse.Namespace) -> int:
    """List, pull or export the pretrained runs (bundled, in a directory, or on the Hub)."""
    from tfmatcomp.pretrained import commands

    if args.action == "list":
        return commands.list_runs(args.models_dir)
    if args.action == "pull":
        return commands.pull_run(args.name, args.steps, args.models_dir)
    return commands.export_run(args.name, args.dir, args.models_dir)
