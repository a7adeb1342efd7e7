"""The case study's toy task: associative recall, seeded and reproducible."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_positive_int

__all__ = ["make_associative_recall"]


def make_associative_recall(
    n: int,
    *,
    n_pairs: int = 6,
    n_keys: int = 16,
    n_values: int = 16,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Associative recall: :math:`k_1 v_1 \dots k_P v_P\, q \mapsto v_i` where
    :math:`k_i = q`.

    Each sequence lists ``n_pairs`` distinct keys, each followed by its value,
    and ends with a query: one of those keys, chosen uniformly. The target is
    the value that followed the query key. Keys are the tokens
    ``0 .. n_keys-1`` and values the tokens ``n_keys .. n_keys+n_values-1``,
    so a model needs a vocabulary of ``n_keys + n_values``. A model can only
    solve it by *looking back* at the right position, which depends on the
    content of the sequence: the task needs attention. A guess that ignores
    the order can only bet on the values present: the most frequent one is
    right with probability (its count) / :math:`P`, which is :math:`1/P` only
    when no value repeats (with the defaults, a value repeats in about two
    thirds of the sequences, and this order-blind guess is right about 29 %
    of the time, against :math:`1/P = 1/6`).

    Shapes: returns ``tokens`` ``(n, 2 * n_pairs + 1)`` and ``targets``
    ``(n,)``, both ``torch.long``.

    Parameters
    ----------
    n : int
        Number of sequences.
    n_pairs : int
        Key-value pairs per sequence (at most ``n_keys``).
    n_keys, n_values : int
        Sizes of the key and value alphabets.
    generator : torch.Generator, optional
        The source of randomness (a CPU generator); pass a seeded one for
        reproducible data.
    device : torch.device or str, optional
        Where to put the result; the data is always drawn on the CPU, so it
        is the same on every device.

    Returns
    -------
    tokens : Tensor ``(n, 2 * n_pairs + 1)``
    targets : Tensor ``(n,)``

    Raises
    ------
    ValueError
        If ``n_pairs > n_keys`` (the keys of a sequence must be distinct).
    """
    n = check_positive_int(n, "n")
    n_pairs = check_positive_int(n_pairs, "n_pairs")
    n_keys = check_positive_int(n_keys, "n_keys")
    n_values = check_positive_int(n_values, "n_values")
    if n_pairs > n_keys:
        raise ValueError(
            f"n_pairs={n_pairs} distinct keys need n_keys >= n_pairs, "
            f"got n_keys={n_keys}"
        )
    # A random permutation per row (argsort of uniforms) gives distinct keys.
    keys = torch.rand(n, n_keys, generator=generator).argsort(dim=-1)[
        :, :n_pairs
    ]  # (n, P)
    values = n_keys + torch.randint(
        n_values, (n, n_pairs), generator=generator
    )  # (n, P)
    which = torch.randint(n_pairs, (n,), generator=generator)  # (n,)
    rows = torch.arange(n)
    query, targets = keys[rows, which], values[rows, which]
    pairs = torch.stack([keys, values], dim=-1).reshape(
        n, 2 * n_pairs
    )  # k1 v1 k2 v2 ...
    tokens = torch.cat([pairs, query[:, None]], dim=-1)  # (n, 2P + 1)
    return tokens.to(device), targets.to(device)
