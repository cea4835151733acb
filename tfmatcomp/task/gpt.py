"""The GPT variant of matrix completion (the NeurIPS paper, Appendix G and Figure 11).

A decoder reads the masked matrix, a separator, then the whole matrix, entry by entry::

    position   0 ... P-1            P       P+1 ... 2P
    token      tokens of the batch   SEP     value tokens of X (row-major)
               (MASK at hidden entries)

with ``P = n_rows * n_cols`` and ``SEP`` the id just after the value vocabulary
(:func:`sep_token_id`: 2002 for the papers' tokenizer, so a decoder needs ``d_vocab`` 2003 and
``n_ctx >= 2P + 1``: 99 for 7x7, 33 for 4x4). The papers' code writes the same layout with its own
ids (MASK 0, separator 404). The entry ``k`` of the matrix is *predicted* at position ``P + k``
(the SEP position predicts the first entry) and *read* at position ``P + 1 + k``.

Training is next-token cross-entropy. :func:`value_token_loss` takes it on the generated part only
(the ``P`` value tokens, what this library trains on); the papers' code took it on every position
of the sequence, prompt included (:func:`tfmatcomp.models.decoder.next_token_loss`). Predictions at the
matrix entries are the arg-max over value ids, decoded to real values, so the encoder's losses
``L``, ``L_obs``, ``L_mask`` apply unchanged; :func:`gpt_losses` adds the cross-entropy and the
accuracies at observed and masked entries that the papers report for the GPT variant. These are
*teacher-forced* (the model sees the true earlier entries); :func:`generate` gives the papers'
greedy autoregressive completion.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.task.gpt import decode_sequence, encode_sequence
    >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(3, generator=torch.Generator().manual_seed(0))
    >>> seq = encode_sequence(batch)
    >>> seq.shape, int(seq[0, 16])
    (torch.Size([3, 33]), 2002)
    >>> back = decode_sequence(seq, 4, 4)
    >>> torch.equal(back.tokens, batch.tokens), torch.equal(back.values, batch.values)
    (True, True)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses
from tfmatcomp.task.tokenizer import ValueTokenizer

__all__ = ["sep_token_id", "gpt_vocab_size", "sequence_length", "n_entries", "encode_sequence",
           "decode_sequence", "value_logits", "value_token_loss", "predicted_values", "gpt_losses",
           "generate", "generation_metrics"]


def sep_token_id(tokenizer: ValueTokenizer | None = None) -> int:
    """The separator's id: the first id after the value vocabulary (2002 for the papers' tokenizer).

    Example:
        >>> sep_token_id()
        2002
    """
    return (tokenizer or ValueTokenizer()).vocab_size


def gpt_vocab_size(tokenizer: ValueTokenizer | None = None) -> int:
    """The decoder's ``d_vocab``: MASK, the value ids and SEP (2003 for the papers' tokenizer).

    Example:
        >>> gpt_vocab_size()
        2003
    """
    return sep_token_id(tokenizer) + 1


def sequence_length(n_positions: int) -> int:
    """Length ``2 P + 1`` of the sequence of a matrix with ``P`` entries (the decoder's ``n_ctx``).

    Example:
        >>> sequence_length(16), sequence_length(49)
        (33, 99)
    """
    return 2 * int(n_positions) + 1


def n_entries(seq_len: int) -> int:
    """The number of matrix entries ``P`` of a sequence of length ``2 P + 1``.

    Raises:
        ValueError: if ``seq_len`` is not odd and at least 3.

    Example:
        >>> n_entries(33)
        16
    """
    if seq_len < 3 or seq_len % 2 == 0:
        raise ValueError(f"tokens: a GPT sequence has length 2 P + 1 (P >= 1 entries), got length "
                         f"{seq_len}")
    return (seq_len - 1) // 2


def encode_sequence(batch: MatrixBatch) -> Int[Tensor, "batch seq"]:
    """The decoder's input: the batch's tokens (MASK at hidden entries), SEP, the value tokens.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> b = tm.MatrixCompletionTask(2, rank=1).sample(1, generator=torch.Generator().manual_seed(1))
        >>> seq = encode_sequence(b)[0]
        >>> seq[:4].tolist() == b.tokens[0].tolist(), seq[5:].tolist() == b.tokenizer.encode(b.values[0]).tolist()
        (True, True)
    """
    tok = batch.tokenizer
    sep = torch.full((batch.batch_size, 1), sep_token_id(tok), dtype=batch.tokens.dtype,
                     device=batch.device)
    return torch.cat([batch.tokens, sep, tok.encode(batch.values).to(batch.tokens)], dim=1)


def decode_sequence(tokens: Int[Tensor, "batch seq"], n_rows: int, n_cols: int | None = None,
                    tokenizer: ValueTokenizer | None = None) -> MatrixBatch:
    """The :class:`~tfmatcomp.MatrixBatch` a sequence of :func:`encode_sequence` holds (its inverse).

    Observed entries are where the prompt is not MASK; the values are the generated part decoded.

    Raises:
        ValueError: the length is not ``2 n_rows n_cols + 1``, the separator is missing, or an
            observed prompt token differs from its value token.
    """
    tok = tokenizer or ValueTokenizer()
    n_cols = n_rows if n_cols is None else n_cols
    P = n_rows * n_cols
    if tokens.ndim != 2 or tokens.shape[1] != sequence_length(P):
        raise ValueError(f"tokens: expected [batch, {sequence_length(P)}] for {n_rows}x{n_cols} "
                         f"matrices, got shape {tuple(tokens.shape)}")
    if not bool((tokens[:, P] == sep_token_id(tok)).all()):
        raise ValueError(f"tokens: position {P} must hold the separator {sep_token_id(tok)}")
    prompt, gen = tokens[:, :P], tokens[:, P + 1:]
    observed = prompt != tok.mask_token_id
    if not bool((prompt[observed] == gen[observed]).all()):
        raise ValueError("tokens: an observed prompt token differs from the entry's value token")
    return MatrixBatch(tokens=prompt.clone(), values=tok.decode(gen), observed=observed,
                       n_rows=n_rows, n_cols=n_cols, tokenizer=tok)


def value_logits(logits: Float[Tensor, "batch seq d_vocab"]) -> Float[Tensor, "batch P d_vocab"]:
    """The logits that predict the ``P`` entries: positions ``P .. 2P - 1``.

    Example:
        >>> value_logits(torch.zeros(2, 33, 5)).shape
        torch.Size([2, 16, 5])
    """
    P = n_entries(logits.shape[1])
    return logits[:, P:2 * P]


def _entry_targets(tokens: Int[Tensor, "batch seq"]) -> Int[Tensor, "batch P"]:
    return tokens[:, n_entries(tokens.shape[1]) + 1:]


def value_token_loss(logits: Float[Tensor, "batch seq d_vocab"], tokens: Int[Tensor, "batch seq"],
                     where: Tensor | None = None) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy over the generated entries (those where ``where`` is True).

    Example:
        >>> seq = torch.tensor([[0, 2002, 5]])
        >>> round(value_token_loss(torch.zeros(1, 3, 2003), seq).item(), 4)   # log(2003)
        7.6024
    """
    ce = F.cross_entropy(value_logits(logits).flatten(0, 1).float(),
                         _entry_targets(tokens).flatten(), reduction="none")
    if where is not None:
        ce = ce[where.flatten()]
    return ce.mean()


def predicted_values(logits: Float[Tensor, "batch seq d_vocab"],
                     tokenizer: ValueTokenizer | None = None) -> Float[Tensor, "batch P"]:
    """The real value predicted at each entry: arg-max over the value ids (MASK and SEP excluded),
    decoded.

    Example:
        >>> logits = torch.zeros(1, 3, 2003); logits[0, 1, 1045] = 1.0
        >>> round(predicted_values(logits).item(), 2)
        0.44
    """
    tok = tokenizer or ValueTokenizer()
    ids = value_logits(logits)[..., 1:tok.vocab_size].argmax(-1) + 1
    return tok.decode(ids)


def gpt_losses(logits: Float[Tensor, "batch seq d_vocab"], batch: MatrixBatch,
               tokens: Int[Tensor, "batch seq"] | None = None) -> dict[str, Tensor]:
    """The encoder's losses on the decoded predictions, plus cross-entropy and accuracies.

    Returns ``L``, ``L_obs``, ``L_mask``, ``mean_abs_pred_mask`` (MSE of the arg-max values, as
    :func:`tfmatcomp.losses`), ``CE``, ``CE_obs``, ``CE_mask`` (value-token cross-entropy) and
    ``acc``, ``acc_obs``, ``acc_mask`` (fraction of entries whose arg-max token is exact), all
    teacher-forced.

    Example:
        >>> import tfmatcomp as tm
        >>> b = tm.MatrixCompletionTask(4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> sorted(gpt_losses(torch.zeros(2, 33, 2003), b))
        ['CE', 'CE_mask', 'CE_obs', 'L', 'L_mask', 'L_obs', 'acc', 'acc_mask', 'acc_obs', 'mean_abs_pred_mask']
    """
    tokens = encode_sequence(batch) if tokens is None else tokens
    out = losses(predicted_values(logits, batch.tokenizer).to(batch.values), batch)
    ids = value_logits(logits)[..., 1:batch.tokenizer.vocab_size].argmax(-1) + 1
    hit = (ids == _entry_targets(tokens)).float()
    for suffix, where in (("", None), ("_obs", batch.observed), ("_mask", batch.masked)):
        out[f"CE{suffix}"] = value_token_loss(logits, tokens, where)
        out[f"acc{suffix}"] = hit.mean() if where is None else hit[where].mean()
    return out


@torch.no_grad()
def generate(model, batch: MatrixBatch) -> Float[Tensor, "batch P"]:
    """The papers' greedy completion: from the prompt and SEP, the model writes the ``P`` entries one
    by one, each fed back as the next input (arg-max over value ids).

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> b = tm.MatrixCompletionTask(2, rank=1).sample(3, generator=torch.Generator().manual_seed(0))
        >>> generate(m, b).shape
        torch.Size([3, 4])
    """
    tok, P = batch.tokenizer, batch.tokens.shape[1]
    seq = encode_sequence(batch.to(model.device))[:, :P + 1]
    for _ in range(P):
        logits = model(seq)[:, -1, 1:tok.vocab_size]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True) + 1], dim=1)
    return tok.decode(seq[:, P + 1:])


@torch.no_grad()
def generation_metrics(model, batch: MatrixBatch) -> dict[str, float]:
    """``gen_L``, ``gen_L_obs``, ``gen_L_mask`` (MSE) and ``gen_acc_obs``, ``gen_acc_mask`` (exact
    tokens) of the greedy completion :func:`generate`: the papers' GPT-variant metrics.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> b = tm.MatrixCompletionTask(2, rank=1).sample(3, generator=torch.Generator().manual_seed(0))
        >>> sorted(generation_metrics(m, b))
        ['gen_L', 'gen_L_mask', 'gen_L_obs', 'gen_acc_mask', 'gen_acc_obs']
    """
    values = generate(model, batch).to(batch.values)
    out = {f"gen_{k}": float(v) for k, v in losses(values, batch).items() if k.startswith("L")}
    hit = (batch.tokenizer.encode(values) == batch.tokenizer.encode(batch.values)).float()
    out["gen_acc_obs"] = float(hit[batch.observed].mean())
    out["gen_acc_mask"] = float(hit[batch.masked].mean())
    return out
