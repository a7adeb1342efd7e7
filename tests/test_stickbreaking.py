"""softmaxbook.stickbreaking: the stick-breaking weights of Tan et al. (2025).

Against the product formula and the authors' log-space reference, the recency
it builds in, the sum it leaves below one, and how masked keys leave the stick
alone. The normalizer contract is checked in test_normalizer_contract.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import softmaxbook as sb
from random_inputs import scores


def product_formula(x):
    """A_j = b_j prod_{k > j} (1 - b_k) along the last dimension, as written."""
    b = torch.sigmoid(x)
    n = x.shape[-1]
    out = torch.empty_like(x)
    for j in range(n):
        out[..., j] = b[..., j] * torch.prod(1 - b[..., j + 1 :], dim=-1)
    return out


def authors_reference(logits, mask):
    """stickbreaking_attention/sb_ref.py: queries in rows, keys in columns.

    ``mask`` is True where a key is *hidden*; ``cum_weight`` sums over the
    keys strictly after j (the reference builds it as a triangular matrix).
    """
    n = logits.shape[-1]
    cum_weight = torch.tril(torch.ones(n, n, dtype=logits.dtype), -1)
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("ij,jk->ik", log_beta, cum_weight)
    return (log_z + re_cum_log_beta).exp()


def test_matches_the_product_formula():
    x = scores((5, 8))
    torch.testing.assert_close(sb.stick_breaking(x), product_formula(x))
    torch.testing.assert_close(sb.stick_breaking(x, dim=0), product_formula(x.T).T)


def test_matches_the_authors_reference_under_a_causal_mask():
    L = 6
    logits = scores((L, L))
    hidden = ~sb.causal_mask(L)
    ours = sb.stick_breaking(logits.masked_fill(hidden, float("-inf")))
    torch.testing.assert_close(ours, authors_reference(logits, hidden))


def test_weights_sum_to_one_minus_the_unbroken_stick():
    x = scores((7, 10))
    p = sb.stick_breaking(x)
    rest = torch.prod(1 - torch.sigmoid(x), -1)
    torch.testing.assert_close(p.sum(-1), 1 - rest)
    assert (p.sum(-1) < 1).all()
    quiet = torch.full((1, 20), -8.0, dtype=torch.float64)
    assert float(sb.stick_breaking(quiet).sum()) < 20 * torch.sigmoid(
        torch.tensor(-8.0)
    )


def test_equal_scores_favour_the_most_recent_key():
    row = torch.tensor([3.0, 0.0, 3.0, -4.0], dtype=torch.float64)
    p = sb.stick_breaking(row)
    assert p[2] > 0.9 and p[0] < 0.05  # softmax would split them evenly
    soft = torch.softmax(row, -1)
    torch.testing.assert_close(soft[0], soft[2])


def test_a_removed_key_leaves_the_stick_untouched():
    x = scores((3, 6))
    removed = x.clone()
    removed[:, 4] = float("-inf")
    kept = torch.cat([x[:, :4], x[:, 5:]], -1)
    p = sb.stick_breaking(removed)
    assert (p[:, 4] == 0).all()
    torch.testing.assert_close(
        torch.cat([p[:, :4], p[:, 5:]], -1), sb.stick_breaking(kept)
    )
