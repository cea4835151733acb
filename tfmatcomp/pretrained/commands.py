"""``tfmatcomp models list | pull | export``: the pretrained runs from the command line.

Each function prints what it did and returns the command's exit status; the CLI only parses the
arguments and calls them.

- ``list``: every run of the registry, its size, pre/post-shift steps and where its files are now.
- ``pull NAME [--steps S ...]``: make the run (or those checkpoints and its logs) local, verified.
- ``export NAME DIR``: the folder to upload to the run's Hub repository: the run's files, a model
  card (``README.md``) and the run's registry entry (``registry.json``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from tfmatcomp import pretrained
from tfmatcomp.pretrained.registry import REGISTRY_FILE, RunEntry, mib, run_entry
from tfmatcomp.pretrained.sources import copy_run, models_dir_of

__all__ = ["list_runs", "pull_run", "export_run", "model_card", "registry_entry"]


def list_runs(models_dir: str | os.PathLike | None = None, out: TextIO | None = None) -> int:
    """Print every run: size, pre/post-shift steps, where its files are, its Hub repository."""
    out = out or sys.stdout
    print(f"{'run':<12} {'size':>10} {'pre':>7} {'post':>7}  where", file=out)
    for name, s in pretrained.available(models_dir).items():
        print(f"{name:<12} {mib(s.size):>10} {s.pre_shift_step:>7} {s.post_shift_step:>7}  "
              f"{s.where_text()}  ({s.repo_id}@{s.revision})", file=out)
    return 0


def pull_run(name: str, steps: list[int] | None = None,
             models_dir: str | os.PathLike | None = None, out: TextIO | None = None) -> int:
    """Fetch and verify the run ``name`` (or its logs and the checkpoints of ``steps``)."""
    out = out or sys.stdout
    run = run_entry(name)
    before = pretrained.available(models_dir)[name]
    root = pretrained.pull(name, steps, models_dir)
    after = pretrained.available(models_dir)[name]
    what = "every step" if steps is None else f"steps {sorted(set(steps))}"
    print(f"{name}: {what} here and verified against the registry, in {root} "
          f"(was: {before.where_text()}; now: {after.where_text()}; {mib(run.size)} in all)",
          file=out)
    return 0


def registry_entry(run: RunEntry) -> dict[str, Any]:
    """The run's entry as ``registry.json`` writes it."""
    return {"repo_id": run.repo_id, "revision": run.revision, "pretrained": run.info,
            "files": {f.path: {"size": f.size, "sha256": f.sha256, "bundled": f.bundled}
                      for f in run.files.values()}}


def _drop_text(info: dict[str, Any]) -> str:
    drop = info.get("detected_drop") or {}
    if not drop.get("has_drop"):
        return "No sudden drop was detected in its evaluation loss."
    return (f"Its masked-entry loss (`{drop['column']}`) sat on a plateau near "
            f"{drop['plateau_level']:.3g}, then fell {drop['drop_factor']:.1f}x to "
            f"{drop['final_level']:.3g} between steps {drop['drop_start']:,.0f} and "
            f"{drop['drop_end']:,.0f} (tfmatcomp.analyses.dynamics.detect_drop on metrics.jsonl).")


def model_card(run: RunEntry) -> str:
    """The run's model card: a YAML header, its figures, how it was trained, its files."""
    info = run.info
    rows = "\n".join(f"| `{f.path}` | {f.size:,} | `{f.sha256}` |" for f in run.files.values())
    return f"""---
library_name: tfmatcomp
license: mit
tags:
- matrix-completion
- interpretability
- abrupt-learning
---

# {run.repo_id}

The pretrained run `{run.name}` of [tfmatcomp](https://pypi.org/project/tfmatcomp/): a BERT-style
encoder trained on low-rank matrix completion (preset `{info.get('preset', run.name)}`,
seed {info.get('seed')}), with {len(run.steps)} checkpoints (steps {', '.join(f'{s:,}' for s in run.steps)}).

- Pre-shift checkpoint (on the plateau): step {run.pre_shift_step:,}.
- Post-shift checkpoint: step {run.post_shift_step:,}.
- {_drop_text(info)}

```python
import tfmatcomp as tm
model = tm.load_pretrained("{run.name}", step="post")  # every file checked against its SHA-256
```

## How it was trained

{info.get('how', '(not recorded)')}

torch {info.get('torch', '?')}, {info.get('torch_threads', '?')} thread(s).

## Files ({mib(run.size)}, revision `{run.revision}`)

| file | bytes | SHA-256 |
| --- | ---: | --- |
{rows}
"""


def export_run(name: str, out_dir: str | os.PathLike,
               models_dir: str | os.PathLike | None = None, out: TextIO | None = None) -> int:
    """Write the folder to upload to the run's Hub repository into ``out_dir`` (new or empty)."""
    out = out or sys.stdout
    run = run_entry(name)
    target = Path(out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"DIR: {str(target)!r} exists and is not an empty folder; refused "
                         "(the export writes a whole repository there)")
    root = pretrained.pull(name, None, models_dir_of(models_dir))
    copy_run(root, list(run.files.values()), target)
    (target / "README.md").write_text(model_card(run), encoding="utf-8")
    entry = {"format_version": 1, "runs": {name: registry_entry(run)}}
    (target / REGISTRY_FILE).write_text(json.dumps(entry, indent=1) + "\n", encoding="utf-8")
    print(f"{name}: {len(run.files)} files ({mib(run.size)}), README.md and {REGISTRY_FILE} "
          f"written to {target}; upload it to the Hub repository {run.repo_id} and tag that "
          f"commit {run.revision}", file=out)
    return 0
