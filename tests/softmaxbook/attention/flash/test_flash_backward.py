"""flash_attention's backward pass: the gradients' error, gradcheck, what the
backward saves, the key blocks shared by workers, flash_attention_backward and
vmap of the gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb
from random_inputs import qkv as _qkv

# torch's SDPA takes enable_gqa from torch 2.5; the oldest torch this library supports
# is 2.2 (make test-oldest), where only the comparisons with torch are skipped: the
# comparisons with repeated heads run on every version.
TORCH_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
needs_torch_gqa = pytest.mark.skipif(
    not TORCH_HAS_GQA, reason="torch's SDPA has enable_gqa from torch 2.5"
)


# ---------------------------------------------------------------- the backward pass


def _grads(fn, q, k, v, grad_out, **kw):
    """(dq, dk, dv) of ``sum(fn(q, k, v) * grad_out)``, in the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **kw)
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


def _grad_errors(q, k, v, grad_out, block_size=(16, 32), **kw):
    """The forward's accuracy rule applied to the gradients: max error of ours and of
    torch's SDPA in the same dtype, both against torch's SDPA in float64."""
    exact = _grads(
        F.scaled_dot_product_attention,
        q.double(),
        k.double(),
        v.double(),
        grad_out,
        **kw,
    )
    ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=block_size, **kw)
    theirs = _grads(F.scaled_dot_product_attention, q, k, v, grad_out, **kw)
    return [
        ((a.double() - e).abs().max().item(), (b.double() - e).abs().max().item())
        for a, b, e in zip(ours, theirs, exact, strict=True)
    ]


@pytest.mark.parametrize("L,S", [(1, 1), (7, 13), (33, 5), (64, 64), (129, 257)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_error_at_most_twice_torch_float32(L, S, is_causal):
    q, k, v = _qkv(L, S)
    grad_out = torch.randn(
        q.shape[:-1] + (16,), generator=torch.Generator().manual_seed(1)
    )
    for ours, theirs in _grad_errors(q, k, v, grad_out, is_causal=is_causal):
        assert ours <= 2 * theirs + 1e-6, (ours, theirs)


def test_gradients_benchmark_shape_meet_the_rule():
    q, k, v = _qkv(512, 512, D=64, batch=(1, 4))
    grad_out = torch.randn_like(q)
    for ours, theirs in _grad_errors(q, k, v, grad_out, block_size=(128, 256)):
        assert ours <= 2 * theirs, (ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_accumulate_in_float32(dtype):
    q, k, v = (t.to(dtype) for t in _qkv(40, 56))
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(
        dtype
    )
    ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=(16, 32))
    assert all(g.dtype == dtype for g in ours)
    for ours_err, theirs_err in _grad_errors(q, k, v, grad_out):
        assert ours_err <= 2 * theirs_err + 1e-6, (ours_err, theirs_err)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"is_causal": True},
        {"is_causal": "bottom_right"},
        {"scale": 0.7, "block_size": (2, 3)},
    ],
)
def test_gradcheck_float64(kw):
    q, k, v = (
        t.requires_grad_() for t in _qkv(5, 7, D=4, batch=(2,), dtype=torch.float64)
    )
    kw = {"block_size": (2, 3), **kw}
    assert torch.autograd.gradcheck(
        lambda a, b, c: sb.flash_attention(a, b, c, **kw), (q, k, v)
    )


def test_gradcheck_through_the_logsumexp_and_a_mask_with_an_empty_row():
    q, k, v = (
        t.requires_grad_() for t in _qkv(5, 7, D=4, batch=(2,), dtype=torch.float64)
    )
    mask = torch.tensor(
        [[True, False, True, True, False, False, True]] * 4 + [[False] * 7]
    )

    def both(a, b, c):
        out, lse = sb.flash_attention(
            a, b, c, mask=mask, block_size=(2, 3), return_lse=True
        )
        return out, lse.masked_fill(torch.isneginf(lse), 0.0)  # the empty row's lse

    assert torch.autograd.gradcheck(both, (q, k, v))


def test_fully_masked_rows_get_zero_gradients_without_nan():
    q, k, v = (t.requires_grad_() for t in _qkv(6, 9, dtype=torch.float64))
    mask = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, :, 2] = False  # query 2 sees nothing
    mask[1, :, :, 4] = False  # key 4 is seen by no query of batch 1
    out = sb.flash_attention(q, k, v, mask=mask, block_size=(4, 4))
    out.backward(torch.randn_like(out))
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    assert torch.equal(k.grad[1, :, 4], torch.zeros_like(k.grad[1, :, 4]))
    assert torch.equal(v.grad[1, :, 4], torch.zeros_like(v.grad[1, :, 4]))


def test_the_backward_saves_no_weights():
    # Saved for the backward pass: q, k, v, the output and the logsumexp, nothing of
    # size L x S. Autograd through the tile loop would save every tile.
    q, k, v = (t.requires_grad_() for t in _qkv(300, 400, D=8, batch=(1, 2)))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sb.flash_attention(q, k, v, is_causal=True, block_size=(64, 64))
    inputs = sum(t.numel() for t in (q, k, v, out)) + out.shape[:-1].numel()  # + lse
    assert max(saved) < 300 * 400 and sum(saved) <= inputs, saved


def test_few_heads_split_the_keys_between_workers():
    # One head and two threads: the workers share the key blocks and sum their dq.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = _qkv(64, 200, batch=(1,), dtype=torch.float64)
        grad_out = torch.randn(1, 64, 16, dtype=torch.float64)
        ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=(16, 32))
    finally:
        torch.set_num_threads(threads)
    exact = _grads(F.scaled_dot_product_attention, q, k, v, grad_out)
    for a, b in zip(ours, exact, strict=True):
        torch.testing.assert_close(a, b)


def test_flash_attention_backward_is_what_autograd_runs():
    q, k, v = _qkv(20, 30, Dv=8, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    grad_out = torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(2, 3, 20, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, is_causal="bottom_right", return_lse=True)
    expected = torch.autograd.grad(
        (out * grad_out).sum() + (lse * grad_lse).sum(), leaves
    )
    got = sb.flash_attention_backward(
        q,
        k,
        v,
        out.detach(),
        lse.detach(),
        grad_out,
        is_causal="bottom_right",
        grad_lse=grad_lse,
        block_size=(8, 8),
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_flash_attention_backward_of_one_key_block_is_its_share():
    # With the merged lse and output, each key block's call gives its own dk, dv and
    # its share of dq: ring attention's backward relies on this.
    q, k, v = _qkv(10, 24, dtype=torch.float64)
    grad_out = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    full = sb.flash_attention_backward(q, k, v, out, lse, grad_out)
    parts = [
        sb.flash_attention_backward(
            q, k[..., a:b, :], v[..., a:b, :], out, lse, grad_out
        )
        for a, b in [(0, 5), (5, 24)]
    ]
    torch.testing.assert_close(parts[0][0] + parts[1][0], full[0])
    torch.testing.assert_close(torch.cat([parts[0][1], parts[1][1]], -2), full[1])
    torch.testing.assert_close(torch.cat([parts[0][2], parts[1][2]], -2), full[2])


def test_flash_attention_backward_bad_input():
    q, k, v = _qkv(4, 5)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(
        ValueError, match=r"grad_output must have shape \(2, 3, 4, 16\)"
    ):
        sb.flash_attention_backward(q, k, v, out, lse, out[..., :3, :])
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 3, 4\)"):
        sb.flash_attention_backward(q, k, v, out, lse[..., 0], out)
    with pytest.raises(TypeError, match="out must be a floating-point tensor"):
        sb.flash_attention_backward(q, k, v, out.long(), lse, out)


def test_vmap_over_the_function_and_its_gradient():
    q, k, v = _qkv(6, 8, batch=(4, 2), dtype=torch.float64)
    batched = torch.func.vmap(lambda a, b, c: sb.flash_attention(a, b, c, block_size=4))
    torch.testing.assert_close(batched(q, k, v), sb.flash_attention(q, k, v))
    shared_k = torch.func.vmap(
        lambda a: sb.flash_attention(a, k[0], v[0], is_causal=True), in_dims=0
    )
    torch.testing.assert_close(
        shared_k(q), sb.flash_attention(q, k[0], v[0], is_causal=True)
    )

    def loss(a):
        return sb.flash_attention(a, k[0], v[0]).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss))(q)
    expected = torch.stack([torch.autograd.functional.jacobian(loss, qi) for qi in q])
    torch.testing.assert_close(per_sample, expected)
