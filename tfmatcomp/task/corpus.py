"""Text into contexts: documents (cluster labels) cut into ``C`` windows of ``T`` tokens.

Song & Zhong samples ``C`` sequences of ``T`` consecutive tokens from a corpus and colours the context
basis by the document each sequence came from (Fig. 2: 4 documents, 32 sequences each). Here a
*document* is one file of a directory (read recursively, sorted by path) or, for a single file, one
block of text between blank lines. Each document is tokenized once and cut into non-overlapping
windows of ``T`` tokens (a leading ``[CLS]``-like token counts in ``T`` when ``prefix_ids`` is
given); windows are then drawn round-robin over documents in a seeded random order, so documents
contribute as evenly as their length allows.

Example:
    >>> docs = read_documents_from_text("one two three four\\n\\nfive six seven eight")
    >>> [d.name for d in docs]
    ['doc 0', 'doc 1']
    >>> contexts = cut_contexts(docs, lambda s: list(range(len(s.split()))), n_contexts=2, n_positions=2)
    >>> contexts.tokens.tolist(), contexts.labels.tolist()
    ([[0, 1], [2, 3]], [0, 1])
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from tfmatcomp.validation import check_positive_int, check_seed, read_bounded

__all__ = ["Document", "Contexts", "read_documents", "read_documents_from_text", "cut_contexts"]

#: Suffixes read from a directory (anything else, e.g. binaries, is skipped).
#: Most bytes of text one corpus reads (all its files together); a larger corpus is refused
#: before the file that would pass the limit is read.
MAX_CORPUS_BYTES = 1 << 30

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".c", ".h", ".js", ".html", ".tex", ".json", ".csv", "")


@dataclass(frozen=True)
class Document:
    """One document: its label name and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class Contexts:
    """``C`` windows of ``T`` tokens with the document each came from.

    Attributes:
        tokens: ``[C, T]`` token ids.
        labels: ``[C]`` document index of each context (into ``names``).
        names: document names, one per label.
        starts: ``[C]`` token offset of each window in its document.
    """

    tokens: Int[Tensor, "ctx pos"]
    labels: Int[Tensor, "ctx"]
    names: tuple[str, ...]
    starts: Int[Tensor, "ctx"]

    @property
    def n_contexts(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_positions(self) -> int:
        return self.tokens.shape[1]

    def batches(self, batch_size: int) -> list[Tensor]:
        """The token windows in batches of ``batch_size`` (for the streaming decomposition)."""
        check_positive_int("batch_size", batch_size)
        return list(self.tokens.split(batch_size))


def read_documents_from_text(text: str) -> list[Document]:
    """Blocks of ``text`` separated by blank lines, as documents ``doc 0``, ``doc 1``, ..."""
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text)]
    return [Document(f"doc {i}", b) for i, b in enumerate(b for b in blocks if b)]


def read_documents(path: str | os.PathLike) -> list[Document]:
    """Documents from a directory (one per text file, recursively, by sorted path) or a file.

    Only regular files are read (a fifo or device in a directory is skipped, given as the path it
    is refused), at most :data:`MAX_CORPUS_BYTES` in all; a larger corpus is refused naming the
    file that passes the limit. Files of a directory that are not UTF-8 are skipped.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("alpha beta"); _ = (d / "b.txt").write_text("gamma")
        >>> [doc.name for doc in read_documents(d)]
        ['a.txt', 'b.txt']
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES
                       and not any(part.startswith(".") for part in f.relative_to(p).parts))
        docs, budget = [], MAX_CORPUS_BYTES
        for f in files:  # regular files only: is_file() is False for fifos, devices, sockets
            data = read_bounded("text", f, budget, binary=True)
            budget -= len(data)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if text.strip():
                docs.append(Document(f.relative_to(p).as_posix(), text))
        if not docs:
            raise ValueError(f"text: the directory {str(p)!r} holds no readable UTF-8 text file")
        return docs
    if p.is_file():
        docs = read_documents_from_text(read_bounded("text", p, MAX_CORPUS_BYTES))
        if not docs:
            raise ValueError(f"text: {str(p)!r} is empty")
        return docs
    raise ValueError(f"text: {str(p)!r} is neither a file nor a directory")


def cut_contexts(
    documents: Sequence[Document],
    encode: Callable[[str], list[int]],
    *,
    n_contexts: int,
    n_positions: int,
    prefix_ids: Sequence[int] = (),
    seed: int = 0,
) -> Contexts:
    """Tokenize every document and draw ``n_contexts`` windows of ``n_positions`` tokens.

    Args:
        documents: from :func:`read_documents`.
        encode: text -> token ids, without special tokens.
        n_contexts: ``C``; fewer are returned when the documents do not hold that many windows
            (an error when they hold none).
        n_positions: ``T``, including ``prefix_ids``.
        prefix_ids: tokens put before every window (e.g. BERT's ``[CLS]``).
        seed: the order in which windows are drawn.
    """
    check_positive_int("n_contexts", n_contexts)
    check_positive_int("n_positions", n_positions)
    check_seed("seed", seed)
    body = n_positions - len(prefix_ids)
    if body < 1:
        raise ValueError(f"n_positions: must exceed the {len(prefix_ids)} prefix token(s), got "
                         f"{n_positions}")
    gen = torch.Generator().manual_seed(seed)
    per_doc: list[list[tuple[int, list[int]]]] = []
    for doc in documents:
        ids = list(encode(doc.text))
        windows = [(s, ids[s:s + body]) for s in range(0, len(ids) - body + 1, body)]
        order = torch.randperm(len(windows), generator=gen).tolist() if windows else []
        per_doc.append([windows[i] for i in order])
    if not any(per_doc):
        longest = max((len(encode(d.text)) for d in documents), default=0)
        raise ValueError(f"n_positions: {n_positions} tokens per context, but the longest document "
                         f"has {longest} tokens; use a smaller --positions or more text")
    picked: list[tuple[int, int, list[int]]] = []
    depth = 0
    while len(picked) < n_contexts and any(depth < len(w) for w in per_doc):
        for label, windows in enumerate(per_doc):
            if depth < len(windows) and len(picked) < n_contexts:
                start, ids = windows[depth]
                picked.append((label, start, ids))
        depth += 1
    picked.sort(key=lambda x: (x[0], x[1]))  # grouped by document: clusters show as blocks
    used = sorted({label for label, _, _ in picked})
    remap = {old: new for new, old in enumerate(used)}
    tokens = torch.tensor([list(prefix_ids) + ids for _, _, ids in picked], dtype=torch.long)
    labels = torch.tensor([remap[label] for label, _, _ in picked], dtype=torch.long)
    starts = torch.tensor([start for _, start, _ in picked], dtype=torch.long)
    return Contexts(tokens=tokens, labels=labels, names=tuple(documents[i].name for i in used),
                    starts=starts)
