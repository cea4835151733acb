"""Song & Zhong's published numbers (Song & Zhong 2023), in one place, for the report to show beside ours.

* :data:`PAPER_TABLE1`: Table 1, mean (std) across layers, per model and corpus;
* :data:`PAPER_SCREENOT_RANKS`, :data:`PAPER_STABLE_RANKS`: Tables 3 and 4, per layer (0..12), for
  BERT and GPT-2 on OpenWebText.

Example:
    >>> PAPER_TABLE1[("GPT-2", "OpenWebText")]["rank_estimate"]
    (11.38, 1.86)
    >>> len(PAPER_SCREENOT_RANKS["BERT"])
    13
"""

from __future__ import annotations

__all__ = ["PAPER_TABLE1", "PAPER_SCREENOT_RANKS", "PAPER_STABLE_RANKS", "TABLE1_COLUMNS",
           "paper_rows"]

#: Table 1's columns, in our summary-table names (mean over layers, std in parentheses).
TABLE1_COLUMNS = ("rank_estimate", "relative_norm", "inter_similarity", "intra_similarity",
                  "incoherence_max")

_NA = None
#: ``{(model, corpus): {column: (mean, std) or None}}`` from Table 1 (6.4K contexts, first token dropped).
PAPER_TABLE1: dict[tuple[str, str], dict[str, tuple[float, float] | None]] = {
    ("NanoGPT", "Shakespeare"): dict(rank_estimate=(7.86, 1.96), relative_norm=(0.66, 0.28),
                                     inter_similarity=_NA, intra_similarity=_NA, incoherence_max=_NA),
    ("GPT-2", "OpenWebText"): dict(rank_estimate=(11.38, 1.86), relative_norm=(0.31, 0.19),
                                   inter_similarity=(0.10, 0.01), intra_similarity=(0.44, 0.04),
                                   incoherence_max=(0.051, 0.05)),
    ("GPT-2", "WikiText"): dict(rank_estimate=(11.69, 1.64), relative_norm=(0.31, 0.19),
                                inter_similarity=(0.11, 0.01), intra_similarity=(0.41, 0.03),
                                incoherence_max=(0.039, 0.04)),
    ("BERT", "OpenWebText"): dict(rank_estimate=(12.54, 2.73), relative_norm=(0.24, 0.07),
                                  inter_similarity=(0.13, 0.04), intra_similarity=(0.26, 0.04),
                                  incoherence_max=(0.046, 0.05)),
    ("BERT", "WikiText"): dict(rank_estimate=(12.62, 2.70), relative_norm=(0.24, 0.06),
                               inter_similarity=(0.17, 0.03), intra_similarity=(0.31, 0.04),
                               incoherence_max=(0.043, 0.04)),
    ("BLOOM", "OpenWebText"): dict(rank_estimate=(10.23, 1.31), relative_norm=(0.16, 0.09),
                                   inter_similarity=(0.21, 0.12), intra_similarity=(0.48, 0.06),
                                   incoherence_max=(0.158, 0.23)),
    ("BLOOM", "WikiText"): dict(rank_estimate=(10.00, 1.47), relative_norm=(0.16, 0.08),
                                inter_similarity=(0.15, 0.14), intra_similarity=(0.32, 0.09),
                                incoherence_max=(0.148, 0.23)),
    ("Llama 2", "OpenWebText"): dict(rank_estimate=(9.38, 1.15), relative_norm=(0.14, 0.03),
                                     inter_similarity=(0.12, 0.13), intra_similarity=(1.00, 0.01),
                                     incoherence_max=(0.190, 0.24)),
    ("Llama 2", "WikiText"): dict(rank_estimate=(8.69, 0.91), relative_norm=(0.14, 0.03),
                                  inter_similarity=(0.33, 0.20), intra_similarity=(1.00, 0.01),
                                  incoherence_max=(0.316, 0.27)),
    ("Llama 2", "GitHub"): dict(rank_estimate=(8.69, 1.67), relative_norm=(0.20, 0.05),
                                inter_similarity=(0.22, 0.08), intra_similarity=(1.00, 0.01),
                                incoherence_max=(0.189, 0.20)),
}

#: Table 3: ScreeNOT rank estimate of pos per layer (0..12), OpenWebText.
PAPER_SCREENOT_RANKS: dict[str, tuple[int, ...]] = {
    "BERT": (15, 16, 18, 16, 11, 11, 9, 9, 11, 11, 11, 11, 13),
    "GPT-2": (15, 13, 14, 12, 13, 11, 10, 10, 10, 10, 9, 9, 12),
}

#: Table 4: stable rank of pos per layer (0..12), OpenWebText.
PAPER_STABLE_RANKS: dict[str, tuple[float, ...]] = {
    "BERT": (9.19, 7.63, 5.25, 4.73, 4.10, 3.53, 3.16, 2.84, 2.46, 2.30, 2.18, 2.22, 2.15),
    "GPT-2": (2.05, 1.92, 1.91, 1.89, 1.88, 1.88, 1.88, 1.90, 1.91, 1.96, 2.02, 2.24, 1.49),
}


def paper_rows(models: tuple[str, ...] = ("BERT", "GPT-2")) -> list[dict[str, object]]:
    """Table 1's rows for ``models`` as ``{"model", "corpus", column: "mean (std)"}`` dicts.

    Example:
        >>> paper_rows(("BERT",))[0]["rank_estimate"]
        '12.54 (2.73)'
    """
    rows = []
    for (model, corpus), values in PAPER_TABLE1.items():
        if model in models:
            row: dict[str, object] = {"model": f"{model} (paper)", "corpus": corpus}
            for col in TABLE1_COLUMNS:
                v = values[col]
                row[col] = "n/a" if v is None else f"{v[0]:g} ({v[1]:g})"
            rows.append(row)
    return rows
