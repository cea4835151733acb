"""Same seed, same weights: fingerprints of short training runs, to compare two versions of the code.

Each case trains briefly with ``torch.set_num_threads(1)`` and records the SHA-256 of its final
weights (every tensor's bytes, in name order) and of its metrics log without the wall-clock
column. Run it once against the code before a change and once after; every fingerprint must be
equal::

    PYTHONPATH=/path/to/old/checkout python scripts/check_same_weights.py --write before.json
    PYTHONPATH=. python scripts/check_same_weights.py --check before.json

The cases: (a) ``train("tiny", n_steps=60, seed=0)`` into a run directory (checkpoints every 20
steps), and (a') the same run stopped at step 30 and resumed; (b) ``train_many`` of seeds 0 and 1
for 40 steps; (c) a 4-layer ``d_model=256`` encoder on the fast step (``fast=True``, on the CPU)
for 3 steps; (d) the decoder preset ``gpt-tiny`` for 20 steps; (e) ``train_lm`` on a small
character-level decoder for 6 steps with a checkpoint at step 3. Only public functions are called,
so the script runs unchanged against either version. It takes well under a minute on one thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every tensor of ``model.state_dict()`` (name, dtype, shape and bytes), by name."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def metrics_digest(frame) -> str:
    """SHA-256 of the metrics rows (JSON, sorted keys), the wall-clock column left out."""
    rows = [{k: v for k, v in row.items() if k != "elapsed_s"} for row in frame.to_dict("records")]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def cases(work: Path) -> dict[str, dict[str, str]]:
    import tfmatcomp as tm
    try:
        from tfmatcomp.training import lm
    except ImportError:  # the code before issue 45 kept the character LM in song_zhong/
        from tfmatcomp.song_zhong import lm

    out: dict[str, dict[str, str]] = {}
    quiet = dict(progress=False)

    # (a) single seed, float32 step, checkpoints and log in a run directory
    a = tm.train("tiny", n_steps=60, seed=0, out_dir=work / "a", checkpoint_every=20,
                 checkpoint_steps=(), log_every=10, **quiet)
    out["a_train_tiny"] = {"weights": weights_digest(a.model), "metrics": metrics_digest(a.metrics)}
    # (a') the same run, stopped at step 30 and resumed
    tm.train("tiny", n_steps=30, seed=0, out_dir=work / "a2", checkpoint_every=20,
             checkpoint_steps=(30,), log_every=10, **quiet)
    a2 = tm.train("tiny", n_steps=60, seed=0, out_dir=work / "a2", checkpoint_every=20,
                  checkpoint_steps=(30,), log_every=10, resume=True, **quiet)
    out["a_resumed"] = {"weights": weights_digest(a2.model),
                        "metrics": metrics_digest(a2.metrics)}

    # (b) two seeds as one batched (vmap) program
    b = tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=work / "b", checkpoint_every=20,
                      checkpoint_steps=(), log_every=10, **quiet)
    for s, r in b:
        out[f"b_train_many_seed{s}"] = {"weights": weights_digest(r.model),
                                        "metrics": metrics_digest(r.metrics)}

    # (c) the fast CPU step on a model wide enough for it
    tiny = tm.get_preset("tiny")
    wide = dataclasses.replace(tiny.model, n_layers=4, n_heads=8, d_model=256, d_head=32,
                               d_mlp=1024)
    c = tm.train("tiny", model_cfg=wide, n_steps=3, batch_size=8, eval_batch_size=8, log_every=1,
                 fast=True, device="cpu", out_dir=work / "c", checkpoint_every=0,
                 checkpoint_steps=(), **quiet)
    out["c_fast_cpu"] = {"weights": weights_digest(c.model), "metrics": metrics_digest(c.metrics)}

    # (d) the decoder (GPT variant of the task)
    d = tm.train("gpt-tiny", n_steps=20, batch_size=32, log_every=10, out_dir=work / "d",
                 checkpoint_every=10, checkpoint_steps=(), **quiet)
    out["d_decoder"] = {"weights": weights_digest(d.model), "metrics": metrics_digest(d.metrics)}

    # (e) the character-level language model
    docs = lm.pydoc_documents(max_documents=3)
    tok = lm.CharTokenizer.from_documents(docs)
    stream = lm.encode_documents(docs, tok)
    cfg = tm.DecoderConfig(n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=32,
                           d_vocab=tok.vocab_size)
    e = lm.train_lm(cfg, lm.text_sampler(stream, 32), tokenizer=tok, n_steps=6, batch_size=8,
                    log_every=2, out_dir=work / "e", checkpoint_every=3)
    out["e_train_lm"] = {"weights": weights_digest(e.model), "metrics": metrics_digest(e.metrics)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="record the fingerprints in this JSON file")
    group.add_argument("--check", type=Path, help="compare with the fingerprints in this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import tfmatcomp

    with tempfile.TemporaryDirectory() as work:
        found = cases(Path(work))
    found = {"_code": tfmatcomp.__file__, "_torch": torch.__version__, **found}
    if args.write:
        args.write.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")
        print(f"wrote {len(found) - 2} fingerprints to {args.write} ({tfmatcomp.__file__})")
        return 0
    expected = json.loads(args.check.read_text())
    differ = [k for k in expected if not k.startswith("_") and expected[k] != found.get(k)]
    for k in sorted(k for k in expected if not k.startswith("_")):
        print(f"{'DIFFERS' if k in differ else 'same   '} {k}")
    if differ:
        print(f"{len(differ)} case(s) differ from {args.check} (recorded with {expected['_code']})")
        return 1
    print(f"all {len(expected) - 2} fingerprints equal those of {expected['_code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
