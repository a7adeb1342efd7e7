"""softmaxbook.attention.latent: Multi-head Latent Attention, naive and absorbed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo

import softmaxbook as sb

B, H, LQ, S, DN, DR, DC, DV = 2, 3, 4, 6, 5, 2, 7, 4


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (B, H, LQ, DN),
        (B, H, LQ, DR),
        (B, S, DC),
        (B, S, DR),
        (H, DN, DC),
        (H, DV, DC),
    ]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def _explicit(qn, qr, c, kr, wk, wv, keep=None, scale=None):
    """Per-head keys and values written out, then NumPy attention head by head."""
    qn, qr, c, kr, wk, wv = (t.detach().numpy() for t in (qn, qr, c, kr, wk, wv))
    tau = scale if scale is not None else 1 / np.sqrt(DN + DR)
    out = np.zeros((B, H, LQ, DV))
    weights = np.zeros((B, H, LQ, S))
    for b in range(B):
        for h in range(H):
            k = np.concatenate([c[b] @ wk[h].T, kr[b]], axis=1)  # (S, DN + DR)
            v = c[b] @ wv[h].T  # (S, DV)
            q = np.concatenate([qn[b, h], qr[b, h]], axis=1)  # (LQ, DN + DR)
            for i in range(LQ):
                ok = np.ones(S, bool) if keep is None else keep[b, h, i]
                if not ok.any():
                    continue
                p = sb.reference.softmax(np.where(ok, tau * (k @ q[i]), -np.inf))
                weights[b, h, i] = p
                out[b, h, i] = p @ v
    return out, weights


@pytest.mark.parametrize("seed", range(5))
def test_naive_and_absorbed_agree_to_float64_rounding(seed):
    args = _inputs(seed)
    o_n, w_n = sb.latent_attention(*args, absorb=False, return_weights=True)
    o_a, w_a = sb.latent_attention(*args, absorb=True, return_weights=True)
    assert (w_n - w_a).abs().max() <= 1e-13
    assert ((o_n - o_a).abs().max() / o_n.abs().max()) <= 1e-13


@pytest.mark.parametrize("absorb", [False, True])
def test_agrees_with_explicit_per_head_attention(absorb):
    args = _inputs(1)
    out, w = sb.latent_attention(*args, absorb=absorb, return_weights=True)
    ref_out, ref_w = _explicit(*args)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-12, atol=1e-13)


def test_agrees_with_sdpa_on_concatenated_heads():
    qn, qr, c, kr, wk, wv = _inputs(2)
    k = torch.cat(
        [torch.einsum("bsc,hdc->bhsd", c, wk), kr[:, None].expand(B, H, S, DR)], -1
    )
    v = torch.einsum("bsc,hdc->bhsd", c, wv)
    q = torch.cat([qn, qr], -1)
    ref = sb.scaled_dot_product_attention(q, k, v, is_causal="bottom_right")
    got = sb.latent_attention(qn, qr, c, kr, wk, wv, is_causal="bottom_right")
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("absorb", [False, True])
def test_boolean_mask_and_empty_rows(absorb):
    args = _inputs(3)
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(B, H, LQ, S, generator=g) > 0.5
    keep[0, 0, 0] = False  # a row with nothing to attend
    keep[1, 2, 3] = True
    out, w = sb.latent_attention(*args, mask=keep, absorb=absorb, return_weights=True)
    ref_out, ref_w = _explicit(*args, keep=keep.numpy())
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-12, atol=1e-13)
    assert torch.all(out[0, 0, 0] == 0) and torch.all(w[0, 0, 0] == 0)
    assert not torch.isnan(out).any()


def test_causal_alignments():
    args = _inputs(4)
    i = torch.arange(LQ)[:, None]
    j = torch.arange(S)[None, :]
    for align, keep in (("top_left", j <= i), ("bottom_right", j <= i + S - LQ)):
        got = sb.latent_attention(*args, is_causal=align)
        ref = sb.latent_attention(*args, mask=keep)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    torch.testing.assert_close(
        sb.latent_attention(*args, is_causal=True),
        sb.latent_attention(*args, is_causal="top_left"),
    )


def test_scale_multiplies_every_score():
    args = _inputs(5)
    _, w = sb.latent_attention(*args, scale=0.3, return_weights=True)
    _, ref = _explicit(*args, scale=0.3)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-12, atol=1e-14)


def test_float32_naive_and_absorbed_close():
    args = _inputs(6, torch.float32)
    a = sb.latent_attention(*args, absorb=False)
    b = sb.latent_attention(*args, absorb=True)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert a.dtype == torch.float32


@pytest.mark.parametrize("absorb", [False, True])
def test_gradcheck_float64(absorb):
    small = [t[..., :2, :] if t.dim() == 4 else t for t in _inputs(7)]
    small = [t.clone().requires_grad_() for t in small]
    keep = torch.ones(B, H, 2, S, dtype=torch.bool)
    keep[0, 1, 0, 2:] = False

    def f(*xs):
        return sb.latent_attention(*xs, mask=keep, absorb=absorb)

    assert torch.autograd.gradcheck(f, small)


def test_compiles_fullgraph_with_the_eager_result():
    args = _inputs(8)
    keep = torch.ones(B, 1, LQ, S, dtype=torch.bool)
    keep[1, 0, 2, :3] = False

    def f(*xs):
        return sb.latent_attention(*xs, mask=keep, is_causal="bottom_right")

    eager_in = [t.clone().requires_grad_() for t in args]
    comp_in = [t.clone().requires_grad_() for t in args]
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_e, out_c = f(*eager_in), compiled(*comp_in)
    torch.testing.assert_close(out_c, out_e, rtol=1e-12, atol=1e-13)
    grad = torch.randn_like(out_e)
    out_e.backward(grad)
    out_c.backward(grad)
    for a, b in zip(eager_in, comp_in, strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-13)


def test_bad_input_errors():
    args = _inputs(9)
    with pytest.raises(TypeError, match="c_kv"):
        sb.latent_attention(args[0], args[1], "x", *args[3:])
    with pytest.raises(TypeError, match="k_rope"):
        sb.latent_attention(*args[:3], args[3].long(), *args[4:])
    with pytest.raises(TypeError, match=r"w_uv.*dtype"):
        sb.latent_attention(*args[:5], args[5].float())
    with pytest.raises(ValueError, match="w_uk"):
        sb.latent_attention(*args[:4], args[4][:, :-1], args[5])
    with pytest.raises(ValueError, match="w_uv"):
        sb.latent_attention(*args[:5], args[5][:, :, :-1])
    with pytest.raises(ValueError, match="k_rope"):
        sb.latent_attention(*args[:3], args[3][:, :-1], *args[4:])
    with pytest.raises(ValueError, match="q_rope"):
        sb.latent_attention(args[0], args[1][:, :1], *args[2:])
    with pytest.raises(ValueError, match="c_kv"):
        sb.latent_attention(*args[:2], args[2][0], *args[3:])
    with pytest.raises(TypeError, match="mask"):
        sb.latent_attention(*args, mask=torch.ones(S))
    with pytest.raises(ValueError, match="mask"):
        sb.latent_attention(*args, mask=torch.ones(S + 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="scale"):
        sb.latent_attention(*args, scale="big")
    with pytest.raises(ValueError, match="scale"):
        sb.latent_attention(*args, scale=float("inf"))
    with pytest.raises(TypeError, match="absorb"):
        sb.latent_attention(*args, absorb=1)
    with pytest.raises(ValueError, match="is_causal"):
        sb.latent_attention(*args, is_causal="left")
