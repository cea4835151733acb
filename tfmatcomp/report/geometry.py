"""``tfmatcomp geometry MODEL_DIR TEXT -o geometry.html``: Song & Zhong's whole picture of a local model.

:func:`run_geometry` loads a local BERT or GPT-2 (:func:`~tfmatcomp.geometry.models.load_geometry_model`),
cuts the text into ``C`` contexts of ``T`` tokens labelled by document
(:mod:`~tfmatcomp.task.corpus`), streams the decomposition of every layer with a progress bar
(:func:`~tfmatcomp.decomposition.accumulate`; memory ``O(L (T + C) d + L d^2)``), takes a second pass
on a few contexts for ``cvec`` / ``resid``, and writes one self-contained HTML page with the report's
renderer. As the paper (Appendix A.3) the first token is dropped (``drop_first=1``): it acts as a
null token that draws most attention and distorts the geometry.

Example:
    >>> from tfmatcomp.report.geometry import SECTIONS
    >>> list(SECTIONS)
    ['table1', 'pca', 'gram', 'clusters', 'qk', 'theory', 'induction']
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from tfmatcomp.analyses.training_format import pydoc_data, small_gpt_config
from tfmatcomp.decomposition import Decomposition
from tfmatcomp.geometry import reference as paper
from tfmatcomp.geometry.clusters import compactness_table, label_similarity_matrix
from tfmatcomp.geometry.induction import induction_study
from tfmatcomp.geometry.models import GeometryModel, load_geometry_model
from tfmatcomp.geometry.qk import rotated_wqk
from tfmatcomp.geometry.similarity import incoherence
from tfmatcomp.geometry.summary import summary_table
from tfmatcomp.geometry.theory import (factorization_errors, matched_inputs, positional_projection,
                                       theorem1_table)
from tfmatcomp.plotting.decomposition import gram_figure, pos_pca_figure, qk_figure, spectrum_figure
from tfmatcomp.plotting.geometry import (induction_figure, label_similarity_figure,
                                         layer_measurements_figure, rotated_wqk_figure,
                                         theorem1_figure, theorem2_figure)
from tfmatcomp.report.build import compute_sections
from tfmatcomp.report.render import page, template
from tfmatcomp.report.sections import Section
from tfmatcomp.training.lm import text_sampler, train_lm
from tfmatcomp.task.corpus import Contexts, Document, cut_contexts, read_documents
from tfmatcomp.validation import check_int_in_range, check_positive_int, check_seed, writable_output

__all__ = ["GeometryContext", "GeometryReport", "run_geometry", "table1_row", "nanogpt_experiment",
           "SECTIONS"]


@dataclass
class GeometryContext:
    """Everything the sections read: the model, the contexts, and both passes' decompositions."""

    model: GeometryModel
    contexts: Contexts
    stream: dict[str, Decomposition]
    attention_inputs: dict[str, Decomposition]
    residuals: dict[str, Decomposition]
    second_labels: torch.Tensor
    layer: int
    head: int
    model_dir: str
    text: str
    drop_first: int
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    seed: int = 0


@dataclass
class GeometryReport:
    """What :func:`run_geometry` wrote: the page, its sections and the Table-1 summary."""

    path: Path
    sections: list[Section]
    summary: pd.DataFrame
    forward_seconds: float

    @property
    def failed(self) -> list[str]:
        return [s.key for s in self.sections if s.error]


def table1_row(table: pd.DataFrame, label: str, corpus: str) -> dict[str, Any]:
    """Table 1's row for a per-layer summary: each column's mean (std) over layers, as text.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({c: [1.0, 3.0] for c in paper.TABLE1_COLUMNS})
        >>> table1_row(t, "ours", "text")["rank_estimate"]
        '2 (1)'
    """
    row: dict[str, Any] = {"model": label, "corpus": corpus}
    for col in paper.TABLE1_COLUMNS:
        v = table[col].dropna()
        row[col] = f"{v.mean():.3g} ({v.std(ddof=0):.2g})" if len(v) else "n/a"
    return row


def _table1(g: GeometryContext, s: Section) -> None:
    table = g.summary
    ours = table1_row(table, f"{g.model.family} (ours)", Path(g.text).name)
    small_decoder = g.model.causal and g.model.family != "gpt2"  # e.g. a character-level GPT
    rows = paper.paper_rows(("NanoGPT", "BERT", "GPT-2") if small_decoder else ("BERT", "GPT-2"))
    s.items += [pd.DataFrame([ours] + rows), table,
                layer_measurements_figure(table, {
                    "BERT": {"rank_estimate": paper.PAPER_SCREENOT_RANKS["BERT"],
                             "stable_rank": paper.PAPER_STABLE_RANKS["BERT"],
                             **{c: [paper.PAPER_TABLE1[("BERT", "OpenWebText")][c][0]]
                                for c in ("relative_norm", "incoherence_max", "intra_similarity")}},
                    "GPT-2": {"rank_estimate": paper.PAPER_SCREENOT_RANKS["GPT-2"],
                              "stable_rank": paper.PAPER_STABLE_RANKS["GPT-2"],
                              **{c: [paper.PAPER_TABLE1[("GPT-2", "OpenWebText")][c][0]]
                                 for c in ("relative_norm", "incoherence_max", "intra_similarity")}}})]
    s.text = ("Table 1 of Song and Zhong per layer of the residual stream (layer 0 = embeddings): "
              "ScreeNOT rank estimate and stable rank of the positional basis, its relative norm "
              "||P||_op / ||M||_op, the mean |cos| between context means of different documents "
              "(inter) and of the same document (intra), and the incoherence max |cos(pos_t, ctx_c)|. "
              "The first table gives the mean (std) over layers beside the paper's BERT and GPT-2 "
              "rows (6.4K contexts of 512 tokens from OpenWebText / WikiText"
              + ("; and its character-level NanoGPT on Shakespeare" if small_decoder else "")
              + "); ours use "
              f"{g.contexts.n_contexts} contexts of {g.contexts.n_positions} tokens from "
              f"{len(g.contexts.names)} document(s), first {g.drop_first} token(s) dropped.")


def _pca(g: GeometryContext, s: Section) -> None:
    stream = {k: g.residuals[k] for k in g.model.stream_keys}
    s.items.append(pos_pca_figure(stream))
    s.text = ("Fig. 1: each layer's positional basis pos_t (blue, darker = later) and random cvec "
              "samples (red) on the top-2 principal directions of pos. The paper finds a smooth, "
              "low-dimensional curve (spiral or U shape) in most layers, weaker in the last.")


def _gram(g: GeometryContext, s: Section) -> None:
    key = g.model.stream_keys[g.layer]
    s.items += [gram_figure(g.stream[key], g.contexts.labels), spectrum_figure(g.residuals[key])]
    s.text = (f"Figs. 2-3 at layer {g.layer} ({key}): the normalized Gram matrix of [pos; ctx] with "
              "contexts sorted by document (smooth pos-pos block, near-zero pos-ctx blocks, "
              "document blocks in ctx-ctx), the singular values of pos, cvec and resid (each per "
              "row), and the 2-D DCT of the positional Gram matrix (energy in low frequencies "
              "for a smooth basis; the paper notes BERT is the exception).")


def _clusters(g: GeometryContext, s: Section) -> None:
    keys = g.model.stream_keys
    picks = sorted({0, g.layer, len(keys) - 1})
    mats = {f"layer {i}": label_similarity_matrix(g.stream[keys[i]].ctx, g.contexts.labels)
            for i in picks}
    comp = compactness_table({k: g.residuals[k] for k in keys}, g.second_labels)
    comp.insert(0, "layer", range(len(comp)))
    s.items += [label_similarity_figure(mats, g.contexts.names), comp]
    s.text = ("Section 3 and Appendix C: mean cosine between the context means of each pair of "
              "documents (a bright diagonal = contexts cluster by document), and cluster compactness "
              "Tr(Sigma_B Sigma_W^-1) of the second-pass token vectors labelled by document, with "
              "the positional effect removed (cvec) and raw (h - mu). The paper: cvec is at least "
              "slightly more compact than raw embeddings.")


def _qk(g: GeometryContext, s: Section) -> None:
    key = g.model.attention_input_keys[g.layer]
    dec = g.attention_inputs[key]
    qk = g.model.qk(g.contexts.tokens[:1], g.layer, dec)
    W_Q, W_K, _, _ = g.model.qk_weights(g.layer)
    rot = [rotated_wqk(W_Q[h], W_K[h], dec.pos) for h in range(g.model.n_heads)]
    K = max(1, min(20, dec.pos.shape[0] // 2))
    fractions = pd.DataFrame({"head": range(len(rot)), "diag_abs_mean": [
        float(r.diagonal.abs().mean()) for r in rot], f"top_left_{K}_fraction": [
        r.top_left_fraction(K) for r in rot]})
    s.items += [qk_figure(qk, head=g.head), rotated_wqk_figure(rot, layer=g.layer), fractions]
    s.text = (f"Fig. 4-5 at block {g.layer}, head {g.head} (0-based). {g.model.site} The four "
              "components pos-pos, pos-cvec, cvec-pos, cvec-cvec (mu and the biases with pos) sum "
              "to the scores exactly" + (" (causal mask applied)" if g.model.causal else "") +
              ". Then W = W_Q W_K^T / sqrt(d_head) per head: its diagonal, and its off-diagonal part "
              "rotated into the right singular vectors of P and denoised; mass in the top-left "
              f"block (share of the first {K} directions in the table) means the head reads the "
              "positional subspace (the paper: K about 20 for many GPT-2 heads).")


def _theory(g: GeometryContext, s: Section) -> None:
    keys = g.model.stream_keys
    picks = sorted({0, g.layer, len(keys) - 1})
    tables = {f"layer {i}": theorem1_table(g.stream[keys[i]].pos) for i in picks}
    rows = []
    for l, key in enumerate(g.model.attention_input_keys):
        res = g.residuals[key]
        n_ctx = min(4, res.cvec.shape[0])
        t = res.pos.expand(n_ctx, *res.pos.shape).reshape(-1, res.d_model)
        c = res.cvec[:n_ctx].reshape(-1, res.d_model)
        rank = g.summary["rank_estimate"].iloc[l]  # ScreeNOT rank of pos at h^(l)
        K = max(1, min(int(rank) if rank == rank and rank > 0 else 20, *res.pos.shape))
        x, u = matched_inputs(t, c, positional_projection(res.pos, K))
        W_Q, W_K, _, _ = g.model.qk_weights(l)  # W = (W_Q / sqrt(d_head)) W_K^T, kept factored
        errs = factorization_errors(x, u, [(W_Q[h] / math.sqrt(W_Q.shape[-1]), W_K[h])
                                           for h in range(g.model.n_heads)])
        rows.append({"layer": l, "K": K, "relative": sum(e["relative"] for e in errs) / len(errs),
                     "error_mean": sum(e["error_mean"] for e in errs) / len(errs),
                     "incoherence_max": incoherence(res.pos, g.attention_inputs[key].ctx).max})
    t2 = pd.DataFrame(rows)
    t1 = pd.concat([df.assign(layer=name) for name, df in tables.items()], ignore_index=True)
    s.items += [theorem1_figure(tables), t1, theorem2_figure(t2), t2]
    s.text = ("Theorem 1: the positional Gram matrix G = P P^T is close to its projection on the "
              "first k DCT frequencies, within 6/(8k)^m times its m-th finite difference (smoothness). "
              "The figure shows the measured error (1/T)||G - Pi G Pi||_op and the m = 1 bound per k. "
              "Theorem 2: with W_QK split by the positional subspace (top-K right singular vectors "
              "of P at each attention input), the kernel factorizes into pos / cvec parts up to an "
              "error driven by incoherence; the table gives the mean error of the attention logit "
              "relative to the logit, beside the incoherence, averaged over heads.")


def _induction(g: GeometryContext, s: Section) -> None:
    inputs = {l: g.attention_inputs[k] for l, k in enumerate(g.model.attention_input_keys)}
    prefix = g.contexts.tokens[0, :g.drop_first].tolist()  # as the contexts start (BERT: [CLS])
    limit = _max_positions(g.model)  # the paper's period 8, shorter when 3 copies would not fit
    period = 8 if limit is None else max(2, min(8, (limit - len(prefix)) // 3))
    study = induction_study(g.model, inputs, prefix=prefix, n_tokens=period,
                            generator=torch.Generator().manual_seed(g.seed))
    s.items.append(induction_figure(study.table))
    for kind in ("self_token", "neighbor", "copy"):
        layer, head = study.best(kind)
        s.items.append(qk_figure(study.components[layer], head=head,
                                 title=f"{kind}: layer {layer}, head {head}"))
    s.items.append(study.table.drop(columns=[c for c in study.table if c.startswith("spread_")]))
    s.text = (f"Section 4.1: {period} random tokens repeated 3 times (4 sequences; the paper: 8), "
              "the four QK components "
              "of every head with pos and mu from the first pass. Scores: mean attention, over "
              "queries in the repeats, to the previous identical token (self-token), to the previous "
              "3 tokens (neighbour) and to the token after the previous occurrence (copy: the "
              "induction head). Below, the four components of the best head of each type; the "
              "paper finds cvec-cvec dominant for self-token heads and pos-pos for neighbour heads "
              "(the table's 'dominant' is the component with the largest spread over keys).")


SECTIONS: dict[str, tuple[str, Callable[[GeometryContext, Section], None]]] = {
    "table1": ("Table 1 per layer, beside the paper", _table1),
    "pca": ("Positional basis and cvecs (Fig. 1)", _pca),
    "gram": ("Gram matrix, spectra and DCT (Figs. 2-3)", _gram),
    "clusters": ("Context clusters by document (Section 3)", _clusters),
    "qk": ("QK decomposition and rotated W_QK (Figs. 4-5)", _qk),
    "theory": ("The theorems measured (Sections 2.3, 4.3)", _theory),
    "induction": ("Induction heads on repeated random tokens (Section 4.1)", _induction),
}


def _max_positions(gm: GeometryModel) -> int | None:
    """The most positions the model takes (None when it does not say)."""
    return getattr(getattr(gm.module, "cfg", None), "n_ctx", None) or getattr(
        getattr(gm.module, "config", None), "n_positions", None)


def _second_pass_rows(n_contexts: int, n_second: int) -> torch.Tensor:
    """Evenly spaced contexts (contexts are grouped by document, so every document is sampled)."""
    n = min(n_second, n_contexts)
    return torch.linspace(0, n_contexts - 1, n).round().long().unique()


def run_geometry(
    model_dir: str | os.PathLike,
    text: str | os.PathLike | Sequence[Document],
    out: str | os.PathLike = "geometry.html",
    *,
    n_contexts: int = 256,
    n_positions: int = 128,
    n_second: int = 32,
    batch_size: int = 16,
    layer: int | None = None,
    head: int = 0,
    drop_first: int = 1,
    seed: int = 0,
    device: str | torch.device | None = None,
    sections: list[str] | None = None,
    progress: bool = True,
) -> GeometryReport:
    """Song & Zhong's measurements of a local model on a text, as one HTML page.

    Args:
        model_dir: a local transformers directory (``bert`` or ``gpt2`` model type, with tokenizer),
            or a tfmatcomp HookedDecoder checkpoint (directory, ``model.safetensors`` or run
            directory) whose metadata records its tokenizer (as :func:`~tfmatcomp.training.lm.train_lm`
            writes it).
        text: a text file (documents separated by blank lines), a directory (one document per
            file), or a list of :class:`~tfmatcomp.task.corpus.Document` objects.
        out: the HTML file to write.
        n_contexts: ``C``, contexts of the first pass (fewer if the text is short).
        n_positions: ``T``, tokens per context (at most the model's maximum).
        n_second: contexts of the second pass (cvec / resid: PCA, spectra, compactness, Theorem 2).
        batch_size: contexts per forward pass.
        layer: the layer of the Gram, QK and rotated-W_QK sections (default: the middle one).
        head: the head of the QK figure (0-based).
        drop_first: leading positions dropped (1: the paper's first-token artifact).
        seed: which windows are drawn.
        device: where to run the model.
        sections: keys of :data:`SECTIONS` (default all).
        progress: show progress bars.

    Example:
        >>> run_geometry("no/such/dir", "x.txt", "/tmp/g.html")
        Traceback (most recent call last):
        ...
        ValueError: model_dir: 'no/such/dir' has no config.json (a local transformers model directory or a tfmatcomp checkpoint is expected; nothing is downloaded)
    """
    for name, v in (("n_contexts", n_contexts), ("n_positions", n_positions),
                    ("n_second", n_second), ("batch_size", batch_size)):
        check_positive_int(name, v)
    check_seed("seed", seed)
    check_int_in_range("drop_first", drop_first, 0, 10**6)
    if n_positions < drop_first + 3:
        raise ValueError(f"n_positions (--positions): must be at least drop_first + 3 = "
                         f"{drop_first + 3} (the decomposition needs 3 positions after the "
                         f"{drop_first} dropped), got {n_positions}")
    keys = list(SECTIONS) if sections is None else list(sections)
    unknown = [k for k in keys if k not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown {unknown}; choose from {list(SECTIONS)}")
    gm, tokenizer = load_geometry_model(model_dir, device)
    max_pos = _max_positions(gm)
    if max_pos is not None and n_positions > max_pos:
        raise ValueError(f"n_positions: the model takes at most {max_pos} positions, got {n_positions}")
    check_int_in_range("head", head, 0, gm.n_heads - 1)
    layer = gm.n_layers // 2 if layer is None else check_int_in_range("layer", layer, 0, gm.n_layers - 1)
    with writable_output("out", out) as out_path:
        t0 = time.perf_counter()
        prefix = [tokenizer.cls_token_id] if gm.family == "bert" and tokenizer.cls_token_id is not None else []
        is_path = isinstance(text, (str, os.PathLike))
        documents = read_documents(text) if is_path else list(text)
        text_label = str(text) if is_path else f"{len(documents)} documents"
        contexts = cut_contexts(documents,
                                lambda s: tokenizer.encode(s, add_special_tokens=False),
                                n_contexts=n_contexts, n_positions=n_positions, prefix_ids=prefix,
                                seed=seed)
        batches = contexts.batches(batch_size)
        acc = gm.accumulate(batches, drop_first=drop_first, progress=progress, total=len(batches))
        forward_seconds = time.perf_counter() - t0
        rows = _second_pass_rows(contexts.n_contexts, n_second)
        residuals: dict[str, Decomposition] = {}
        for chunk in rows.split(batch_size):
            part = gm.residuals(acc, contexts.tokens[chunk])
            for k, dec in part.items():
                residuals.setdefault(k, []).append(dec)  # type: ignore[arg-type]
        residuals = {k: _cat(v) for k, v in residuals.items()}
        results = acc.results()
        stream = {k: results[k] for k in gm.stream_keys}
        g = GeometryContext(model=gm, contexts=contexts, stream=stream,
                            attention_inputs={k: results[k] for k in gm.attention_input_keys},
                            residuals=residuals, second_labels=contexts.labels[rows], layer=layer,
                            head=head, model_dir=str(model_dir), text=text_label,
                            drop_first=drop_first, seed=seed,
                            summary=summary_table(list(stream.values()), contexts.labels))

        done = compute_sections(g, keys, progress, SECTIONS)
        n_params = sum(p.numel() for p in gm.module.parameters())
        header = template("geometry_header.html.j2").render(
            model_dir=str(model_dir), family=gm.family, n_layers=gm.n_layers, n_heads=gm.n_heads,
            n_params=n_params, text=text_label, n_contexts=contexts.n_contexts,
            n_positions=contexts.n_positions, n_documents=len(contexts.names), n_second=len(rows),
            drop_first=drop_first, seconds=time.perf_counter() - t0)
        out_path.write_text(page("tfmatcomp geometry", header, done), encoding="utf-8")
    return GeometryReport(path=out_path, sections=done, summary=g.summary,
                          forward_seconds=forward_seconds)


def _cat(parts: list[Decomposition]) -> Decomposition:
    """Second-pass decompositions of consecutive chunks, as one."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    mask = None if first.mask is None else cat("mask")
    counts = None if first.ctx_counts is None else cat("ctx_counts")
    return replace(first, ctx=cat("ctx"), resid=cat("resid"), mask=mask, ctx_counts=counts,
                   n_contexts=sum(p.ctx.shape[0] for p in parts))


# ------------------------------------------------------------------ Table 1's NanoGPT row
def nanogpt_experiment(
    *,
    n_positions: int = 128,
    n_layers: int = 3,
    d_model: int = 96,
    n_heads: int = 4,
    n_steps: int = 1200,
    batch_size: int = 32,
    lr: float = 2e-3,
    seed: int = 0,
    n_contexts: int = 256,
    n_second: int = 32,
    max_documents: int | None = None,
    out_dir: str | os.PathLike | None = None,
    report: str | os.PathLike | None = None,
    sections: list[str] | None = None,
) -> dict[str, Any]:
    """Table 1's NanoGPT row: a character-level GPT trained on the pydoc corpus with
    :func:`~tfmatcomp.training.lm.train_lm`, then measured by
    :func:`run_geometry` on the same corpus (topics as cluster labels,
    first token dropped).

    Returns:
        ``{"row": Table 1's row (mean (std) over layers), "summary": the per-layer table,
        "metrics": the training log, "seconds": training seconds, "report": the page's path,
        "path": the checkpoint}``. The page goes to ``report`` (default a temporary file, or
        ``out_dir/nanogpt.html``); the run to ``out_dir/nanogpt`` (default a temporary directory).

    Example:
        >>> r = nanogpt_experiment(n_positions=16, n_layers=1, d_model=16, n_heads=2, n_steps=2,
        ...                        batch_size=4, n_contexts=8, n_second=4, max_documents=3,
        ...                        sections=["table1"])
        >>> r["row"]["model"]
        'char-gpt (ours)'
    """
    tok, stream, docs = pydoc_data(max_documents)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory()
        out_dir = tmp.name
    try:
        cfg = small_gpt_config(n_layers, d_model, n_heads, n_positions, tok.vocab_size)
        t0 = time.perf_counter()
        run = train_lm(cfg, text_sampler(stream, n_positions), tokenizer=tok, n_steps=n_steps,
                       batch_size=batch_size, lr=lr, seed=seed, log_every=max(1, n_steps // 10),
                       out_dir=Path(out_dir) / "nanogpt", metadata={"family": "char-gpt"})
        seconds = time.perf_counter() - t0
        page = Path(report) if report is not None else Path(out_dir) / "nanogpt.html"
        geo = run_geometry(run.path, docs, page, n_contexts=n_contexts, n_positions=n_positions,
                           n_second=n_second, sections=sections, progress=False)
        row = table1_row(geo.summary, "char-gpt (ours)", "pydoc topics")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return {"row": row, "summary": geo.summary, "metrics": run.metrics, "seconds": seconds,
            "report": page if tmp is None else None, "path": run.path if tmp is None else None}
