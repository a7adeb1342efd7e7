r"""Multi-head Latent Attention (MLA): attention against a cached low-rank latent.

DeepSeek-V2 (DeepSeek-AI, 2024) caches, per token, one latent vector
:math:`c^{KV}_j \in \mathbb{R}^{d_c}` shared by all heads and one rotary key
:math:`k^{R}_j \in \mathbb{R}^{d_R}` shared by all heads. Head :math:`h`
reads its keys and values off the latent through up-projections
:math:`W^{UK}_h \in \mathbb{R}^{d_n \times d_c}` and
:math:`W^{UV}_h \in \mathbb{R}^{d_v \times d_c}`, and its score adds a
no-RoPE part and a RoPE part:

.. math::

    z_{hij} = \mathrm{scale} \cdot \big( q^{N}_{hi} \cdot W^{UK}_h c^{KV}_j
              + q^{R}_{hi} \cdot k^{R}_j \big), \qquad
    o_{hi} = \sum_j \mathrm{softmax}_j(z_{hi\cdot})\, W^{UV}_h c^{KV}_j .

Both products are associative, so the up-projections can move to the query
and to the output (the *absorbed* form):
:math:`q^{N}_{hi} \cdot W^{UK}_h c^{KV}_j = (W^{UK\top}_h q^{N}_{hi}) \cdot c^{KV}_j`
and :math:`\sum_j p_{hij} W^{UV}_h c^{KV}_j = W^{UV}_h \sum_j p_{hij} c^{KV}_j`.
The scores, the softmax and the output are the same; only the order of the
multiplications (their cost and their rounding) changes. DeepSeek-V3's
reference inference code (``inference/model.py``, class ``MLA``) has both,
``attn_impl = "naive"`` and ``"absorb"``; :func:`latent_attention` follows its
math and its weight layout (``wkv_b`` viewed as ``(H, d_n + d_v, d_c)``, the
first ``d_n`` rows of each head :math:`W^{UK}_h`, the last ``d_v`` rows
:math:`W^{UV}_h`).
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .._numerics import causal_offset
from .._validate import check_causal, check_float, check_mask, zero_empty_rows

__all__ = ["latent_attention"]

_SHAPES = {
    "q_nope": "(B, H, Lq, d_nope)",
    "q_rope": "(B, H, Lq, d_rope)",
    "c_kv": "(B, S, d_c)",
    "k_rope": "(B, S, d_rope)",
    "w_uk": "(H, d_nope, d_c)",
    "w_uv": "(H, d_v, d_c)",
}


def _check(
    q_nope: object,
    q_rope: object,
    c_kv: object,
    k_rope: object,
    w_uk: object,
    w_uv: object,
) -> tuple[Tensor, ...]:
    """The six tensors, checked: floating, one dtype, one device, sizes that match."""
    args = {"q_nope": q_nope, "q_rope": q_rope, "c_kv": c_kv, "k_rope": k_rope}
    args |= {"w_uk": w_uk, "w_uv": w_uv}
    tensors = {name: check_float(t, name) for name, t in args.items()}
    for name, t in tensors.items():
        ndim = _SHAPES[name].count(",") + 1
        if t.dim() != ndim:
            raise ValueError(
                f"{name} must have shape {_SHAPES[name]}, got {tuple(t.shape)}"
            )
    first = tensors["q_nope"]
    for name, t in tensors.items():
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but q_nope has {first.dtype}; "
                "give all six tensors one dtype"
            )
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but q_nope is on {first.device}")
    qn, qr, c, kr, wk, wv = tensors.values()
    b, h, lq, d_nope = qn.shape
    s, d_c = c.shape[1], c.shape[2]
    d_rope = qr.shape[-1]
    sizes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
        "q_rope": (tuple(qr.shape), (b, h, lq, d_rope)),
        "c_kv": (tuple(c.shape), (b, s, d_c)),
        "k_rope": (tuple(kr.shape), (b, s, d_rope)),
        "w_uk": (tuple(wk.shape), (h, d_nope, d_c)),
        "w_uv": (tuple(wv.shape), (h, wv.shape[1], d_c)),
    }
    for key, (got, want) in sizes.items():
        if got != want:
            raise ValueError(
                f"{key} must have shape {_SHAPES[key]} = {want} to match "
                f"q_nope {tuple(qn.shape)} and c_kv {tuple(c.shape)}, got {got}"
            )
    return qn, qr, c, kr, wk, wv


def latent_attention(
    q_nope: Tensor,
    q_rope: Tensor,
    c_kv: Tensor,
    k_rope: Tensor,
    w_uk: Tensor,
    w_uv: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    absorb: bool = True,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Multi-head Latent Attention against a latent cache, naive or absorbed.

    .. math::

        z_{hij} = \mathrm{scale} \cdot \big(q^{N}_{hi} \cdot W^{UK}_h c_j
                  + q^{R}_{hi} \cdot k^{R}_j\big), \quad
        o_{hi} = W^{UV}_h \textstyle\sum_j \mathrm{softmax}_j(z_{hi\cdot})\, c_j .

    With ``absorb=False`` (DeepSeek's ``"naive"``) each head's keys
    :math:`W^{UK}_h c_j` and values :math:`W^{UV}_h c_j` are built from the
    latent, and attention runs on them. With ``absorb=True`` (``"absorb"``)
    the query is moved into the latent space,
    :math:`\tilde q_{hi} = W^{UK\top}_h q^{N}_{hi} \in \mathbb{R}^{d_c}`, the
    scores are
    :math:`\mathrm{scale} \cdot (\tilde q_{hi} \cdot c_j + q^R_{hi} \cdot k^R_j)`,
    the weights average the latents, and :math:`W^{UV}_h` maps the average
    out. The two are the same function; they differ by rounding only.

    The rotary parts ``q_rope`` and ``k_rope`` are taken as already rotated;
    ``k_rope`` is one key per position, shared by every head. The result is
    each head's output before the output projection :math:`W^O`.

    Parameters
    ----------
    q_nope : Tensor
        ``(B, H, Lq, d_nope)``, the queries' no-RoPE part.
    q_rope : Tensor
        ``(B, H, Lq, d_rope)``, the queries' rotated part.
    c_kv : Tensor
        ``(B, S, d_c)``, the cached latents (after DeepSeek's ``kv_norm``).
    k_rope : Tensor
        ``(B, S, d_rope)``, the cached rotated keys, shared by the heads.
    w_uk : Tensor
        ``(H, d_nope, d_c)``, the key up-projections :math:`W^{UK}_h`.
    w_uv : Tensor
        ``(H, d_v, d_c)``, the value up-projections :math:`W^{UV}_h`.
        DeepSeek's ``wkv_b.weight.view(H, d_nope + d_v, d_c)`` gives
        ``w_uk = w[:, :d_nope]`` and ``w_uv = w[:, d_nope:]``.
    mask : Tensor, optional
        Boolean, True = may attend, broadcastable to ``(B, H, Lq, S)``.
    is_causal : bool or str
        ``True`` or ``"top_left"`` (query ``i`` sees keys ``j <= i``), or
        ``"bottom_right"`` (the last query sees every key: decoding after a
        cache of ``S - Lq`` tokens); combined with ``mask`` by "and".
    scale : float, optional
        The factor on the scores; default ``1 / sqrt(d_nope + d_rope)``, DeepSeek's
        ``qk_head_dim ** -0.5`` (before any YaRN factor, which the caller
        multiplies in).
    absorb : bool
        Absorbed (default) or naive order of the products.
    return_weights : bool
        Also return the softmax weights ``(B, H, Lq, S)``.

    Returns
    -------
    Tensor or (Tensor, Tensor)
        The heads' outputs ``(B, H, Lq, d_v)``, and the weights if asked.
        A query row with no key left has weights and output 0.

    Raises
    ------
    TypeError
        If a tensor is missing, not floating point, or of another dtype than
        ``q_nope``; if ``mask`` is not boolean, ``scale`` not a real number,
        ``is_causal`` not a bool or alignment name, or ``absorb`` /
        ``return_weights`` not a bool.
    ValueError
        If a shape does not match the others, a tensor is on another device,
        ``mask`` does not broadcast, or ``scale`` is not finite.

    Examples
    --------
    >>> import torch
    >>> import softmaxbook as sb
    >>> g = torch.Generator().manual_seed(0)
    >>> def r(*s):
    ...     return torch.randn(*s, generator=g, dtype=torch.float64)
    >>> args = r(1, 2, 1, 4), r(1, 2, 1, 2), r(1, 5, 3), r(1, 5, 2)
    >>> w = r(2, 4, 3), r(2, 4, 3)
    >>> naive = sb.latent_attention(*args, *w, absorb=False)
    >>> torch.allclose(naive, sb.latent_attention(*args, *w, absorb=True))
    True
    """
    qn, qr, c, kr, wk, wv = _check(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv)
    for name, flag in (("absorb", absorb), ("return_weights", return_weights)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    align = check_causal(is_causal)
    if scale is None:
        tau = 1.0 / math.sqrt(qn.shape[-1] + qr.shape[-1])
    else:
        if isinstance(scale, bool) or not isinstance(scale, Real):
            raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
        tau = float(scale)
        if not math.isfinite(tau):
            raise ValueError(f"scale must be finite, got {scale}")

    rope = torch.einsum("bhlr,bsr->bhls", qr, kr)
    if absorb:  # the query in the latent space: (B, H, Lq, d_c)
        q_lat = torch.einsum("bhld,hdc->bhlc", qn, wk)
        nope = torch.einsum("bhlc,bsc->bhls", q_lat, c)
    else:  # per-head keys (B, H, S, d_nope)
        k_nope = torch.einsum("bsc,hdc->bhsd", c, wk)
        nope = torch.einsum("bhld,bhsd->bhls", qn, k_nope)
    scores = (nope + rope) * tau

    keep = None
    if mask is not None:
        keep = check_mask(mask, scores)
    if align is not None:
        lq, s = scores.shape[-2], scores.shape[-1]
        i = torch.arange(lq, device=scores.device)[:, None]
        j = torch.arange(s, device=scores.device)[None, :]
        causal = j <= i + causal_offset(align, lq, s)
        keep = causal if keep is None else keep & causal
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = zero_empty_rows(lambda x: torch.softmax(x, -1), scores, -1)

    if absorb:  # average the latents, then map them out: (B, H, Lq, d_v)
        out = torch.einsum(
            "bhlc,hdc->bhld", torch.einsum("bhls,bsc->bhlc", weights, c), wv
        )
    else:
        v = torch.einsum("bsc,hdc->bhsd", c, wv)
        out = torch.einsum("bhls,bhsd->bhld", weights, v)
    return (out, weights) if return_weights else out
