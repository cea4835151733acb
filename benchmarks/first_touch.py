"""How long a user waits before the first model is in hand: ``import tfmatcomp`` and the first
``tfmatcomp.load_pretrained("tiny")``, against the floor they sit on (``import
transformer_lens.hook_points``, which tfmatcomp needs, plus reading the checkpoint's bytes), each in
a fresh interpreter, medians of several runs.

    python benchmarks/first_touch.py            # the goal: within 1.3x of the floor
    python benchmarks/first_touch.py --runs 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

OURS = """
import json, time
t0 = time.perf_counter()
import tfmatcomp as tm
t1 = time.perf_counter()
model = tm.load_pretrained("tiny", step="post")
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1}))
"""

FLOOR = """
import json, time
t0 = time.perf_counter()
import transformer_lens.hook_points
t1 = time.perf_counter()
from pathlib import Path
for f in sorted(Path(CHECKPOINT).iterdir()):
    f.read_bytes()
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1}))
"""


def _run(code: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _floor_code() -> str:
    """FLOOR reading the files of the checkpoint that ``load_pretrained("tiny", step="post")``
    loads (located here, outside the timed interpreter)."""
    from tfmatcomp import pretrained
    from tfmatcomp.runs.layout import checkpoint_path

    ckpt = checkpoint_path(pretrained.run_dir("tiny"), pretrained.resolve_step("tiny", "post"))
    return FLOOR.replace("CHECKPOINT", repr(str(ckpt)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    floor = _floor_code()
    rows = {"tfmatcomp": [], "floor": []}
    for _ in range(args.runs):  # interleaved, so that load drift hits both alike
        rows["tfmatcomp"].append(_run(OURS))
        rows["floor"].append(_run(floor))
    med = {k: {part: statistics.median(r[part] for r in v) for part in ("import", "load")}
           for k, v in rows.items()}
    print(f"{'':12s} {'import s':>9s} {'load s':>9s} {'total s':>9s}")
    for k, m in med.items():
        print(f"{k:12s} {m['import']:9.3f} {m['load']:9.3f} {m['import'] + m['load']:9.3f}")
    ours = med["tfmatcomp"]["import"] + med["tfmatcomp"]["load"]
    floor = med["floor"]["import"] + med["floor"]["load"]
    print(f"tfmatcomp / floor = {ours / floor:.2f} (goal <= 1.3)")


if __name__ == "__main__":
    main()
