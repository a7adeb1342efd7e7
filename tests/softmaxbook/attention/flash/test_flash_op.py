"""FlashAttention as one op: its autograd node and what it saves, the torch-fused
path against the tile loops, the path each call takes (the dispatch), dropout,
torch.func transforms, and every broadcast mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import softmaxbook as sb
from random_inputs import qkv as _qkv
from softmaxbook.attention.flash import _fused, _tiles

# torch's SDPA takes enable_gqa from torch 2.5; the oldest torch this library supports
# is 2.2 (make test-oldest), where only the comparisons with torch are skipped: the
# comparisons with repeated heads run on every version.
TORCH_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
needs_torch_gqa = pytest.mark.skipif(
    not TORCH_HAS_GQA, reason="torch's SDPA has enable_gqa from torch 2.5"
)


# ---------------------------------------------------------------- the autograd Function


def _leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("explicit", [False, True])
def test_the_output_grad_fn_is_the_flash_attention_node(explicit):
    q, k, v = _leaves((2, 3, 9, 4), (2, 3, 11, 4), (2, 3, 11, 4), dtype=torch.float32)
    out, lse = sb.FlashAttention.apply(
        q, k, v, True, explicit=explicit, return_lse=True
    )
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    assert isinstance(out.grad_fn, sb.FlashAttention.Function._backward_cls)
    assert lse.grad_fn is out.grad_fn  # one node, two outputs
    assert not out._is_view()  # no view or wrapper op between the node and out
    out = sb.flash_attention(q, k, v, is_causal=True, explicit=explicit)
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"


@pytest.mark.parametrize("explicit", [False, True])
def test_the_node_saves_exactly_q_k_v_out_and_the_logsumexp(explicit):
    q, k, v = _leaves((2, 3, 9, 4), (2, 3, 11, 4), (2, 3, 11, 5), dtype=torch.float32)
    out, lse = sb.FlashAttention.apply(q, k, v, explicit=explicit, return_lse=True)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    assert saved[0] is q and saved[1] is k and saved[2] is v  # the inputs themselves
    for got, want in zip(saved[3:], (out, lse), strict=True):  # the outputs' storage
        assert got.shape == want.shape and got.data_ptr() == want.data_ptr()
    assert lse.shape == (2, 3, 9) and lse.dtype == torch.float32
    scores = (q @ k.transpose(-2, -1)) / 2.0
    torch.testing.assert_close(lse, scores.logsumexp(-1))
    # A mask is saved as a sixth tensor, the sinks last; nothing of size L x S else.
    mask = torch.rand(9, 11, generator=torch.Generator().manual_seed(1)) > 0.3
    sinks = torch.zeros(3, requires_grad=True)
    out = sb.FlashAttention.apply(q, k, v, mask=mask, sinks=sinks, explicit=explicit)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 7 and saved[5] is mask and saved[6] is sinks
    # On the fused path (Dv = D) a boolean mask is saved as the float mask torch's
    # kernel adds.
    mask[:, 0] = True
    out = sb.FlashAttention.apply(q, k, v[..., :4], mask=mask, explicit=explicit)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 6
    if explicit:
        assert saved[5] is mask
    else:
        additive = torch.zeros(9, 11).masked_fill(~mask, float("-inf"))
        assert saved[5].dtype == torch.float32 and torch.equal(saved[5], additive)


def test_a_course_style_flashattention2_check():
    # The check of a course that implements FlashAttention-2 as an autograd Function
    # (q, k, v of shape (batch, n, d)): the node keeps exactly one tensor with one
    # value per query row, the logsumexp, and the gradients match autograd.
    B, Nq, Nk, D = 4, 128, 128, 64
    q, k, v = _leaves((B, Nq, D), (B, Nk, D), (B, Nk, D), dtype=torch.float32)
    do = torch.randn(B, Nq, D, generator=torch.Generator().manual_seed(2))
    for is_causal in (False, True):
        o = sb.FlashAttention.apply(q, k, v, is_causal)
        maybe_ls = [t for t in o.grad_fn.saved_tensors if t.shape == (B, Nq)]
        assert len(maybe_ls) == 1
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        if is_causal:
            scores = scores.masked_fill(~sb.causal_mask(Nq, Nk), float("-inf"))
        torch.testing.assert_close(o, torch.softmax(scores, -1) @ v)
        torch.testing.assert_close(maybe_ls[0], scores.logsumexp(-1))
        got = torch.autograd.grad(o, (q, k, v), do)
        want = torch.autograd.grad(torch.softmax(scores, -1) @ v, (q, k, v), do)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"is_causal": True},
        {"is_causal": "bottom_right"},
        {"mask": "bool"},
        {"mask": "float"},
        {"enable_gqa": True},
        {"sinks": True},
    ],
)
@pytest.mark.parametrize("explicit", [False, True])
def test_gradcheck_of_the_function_float64(options, explicit):
    q, k, v = _leaves((1, 4, 5, 3), (1, 2, 7, 3), (1, 2, 7, 3))
    if not options.get("enable_gqa"):
        k, v = (t.detach().repeat_interleave(2, 1).requires_grad_() for t in (k, v))
    inputs = [q, k, v]
    kw = dict(options)
    g = torch.Generator().manual_seed(3)
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(5, 7, generator=g) > 0.4
        kw["mask"][:, 0] = True
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(5, 7, generator=g, dtype=torch.float64)
        kw["mask"][1, 2:] = float("-inf")
    if kw.pop("sinks", False):
        inputs.append(torch.randn(4, generator=g, dtype=torch.float64))
        inputs[-1].requires_grad_()

    def f(q, k, v, *sinks):
        return sb.FlashAttention.apply(
            q, k, v, explicit=explicit, sinks=sinks[0] if sinks else None, **kw
        )

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}, {"gqa": True}],
)
@pytest.mark.parametrize("shape", [(2, 3, 37), (37,), (3, 37)])
def test_the_fused_path_equals_the_tile_loops(options, shape):
    # torch's CPU kernel (the fused path) and the library's tile loops give the same
    # output, logsumexp and gradients within float32 rounding.
    q, k, v = _leaves(
        (*shape[:-1], 37, 8), (*shape[:-1], 45, 8), (*shape[:-1], 45, 8),
        dtype=torch.float32,
    )  # fmt: skip
    kw = {k_: v_ for k_, v_ in options.items() if k_ != "gqa"}
    g = torch.Generator().manual_seed(4)
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(37, 45, generator=g) > 0.5
        kw["mask"][:, -1] = True
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(37, 45, generator=g)
    if options.get("gqa"):
        if len(shape) < 3:
            pytest.skip("grouped heads need a heads dimension")
        q = torch.randn(2, 6, 37, 8, generator=g).requires_grad_()
        kw["enable_gqa"] = True
    assert sb.explain_dispatch("flash_attention", q, k, v, **kw).path == "torch-fused"
    do = torch.randn(q.shape[:-1] + (8,), generator=g)
    results = []
    for explicit in (False, True):
        out, lse = sb.flash_attention(q, k, v, explicit=explicit, return_lse=True, **kw)
        results.append((out, lse, *torch.autograd.grad(out, (q, k, v), do)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_float_masks_and_torchs_keyword_names_give_torchs_result():
    q, k, v = _qkv(6, 9)
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(2, 1, 6, 9, generator=g)
    bias[0, 0, :, 4:] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    for kw in ({}, {"explicit": True}, {"block_size": (4, 4)}):
        got = sb.flash_attention(q, k, v, attn_mask=bias, **kw)
        torch.testing.assert_close(got, want)
    keep = torch.rand(6, 9, generator=g) > 0.3
    keep[:, 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(sb.flash_attention(q, k, v, attn_mask=keep), want)
    # A fully -inf row of a float mask gives zeros, forward and backward.
    bias[1, 0, 2] = float("-inf")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, mask=bias, return_lse=True)
    assert (out[1, :, 2] == 0).all() and torch.isneginf(lse[1, :, 2]).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
    assert (leaves[0].grad[1, :, 2] == 0).all()


@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"mask": True}])
def test_dropout_is_torchs(options):
    q, k, v = _qkv(6, 9)
    kw = dict(options)
    if kw.get("mask"):
        kw = {"attn_mask": torch.rand(6, 9, generator=torch.Generator()) > 0.3}
        kw["attn_mask"][:, 0] = True
    assert sb.explain_dispatch(
        "flash_attention", q, k, v, dropout_p=0.3, **kw
    ).path == ("explicit")
    torch.manual_seed(7)
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, **kw)
    torch.manual_seed(7)
    got = sb.flash_attention(q, k, v, dropout_p=0.3, **kw)
    torch.testing.assert_close(got, want)
    assert (got != sb.flash_attention(q, k, v, **kw)).any()  # something was dropped


def test_explain_dispatch_says_which_path_a_call_takes():
    q, k, v = _qkv(6, 9)

    def path(*tensors, **kw):
        return sb.explain_dispatch("flash_attention", *tensors, **kw).path

    assert path(q, k, v) == "torch-fused"
    assert path(q, k, v, is_causal=True) == "torch-fused"
    assert path(q, k, v, block_size=4) == "tiles"
    assert path(q, k, v, explicit=True) == "tiles"
    assert path(q.bfloat16(), k.bfloat16(), v.bfloat16()) == "tiles"
    assert path(q, k, v, sinks=torch.zeros(3)) == "tiles"
    assert path(q, k, v, is_causal="bottom_right") == "tiles"
    assert path(q, k[:1], v[:1]) == "tiles"  # a broadcast batch
    assert path(q, k, v[..., :5]) == "tiles"  # Dv != D
    empty = torch.ones(6, 9, dtype=torch.bool)
    empty[2] = False
    assert path(q, k, v, mask=empty) == "tiles"
    k_nan = k.clone()
    k_nan[0, 0, 3, 0] = float("nan")
    assert path(q, k_nan, v, mask=empty | True) == "tiles"
    decision = sb.explain_dispatch("flash_attention", q, k, v, explicit=True)
    assert "forces the library's tile loops" in decision.reason
    with pytest.raises(ValueError, match="not both"):
        path(q, k, v, mask=empty, is_causal=True)
    # the call follows the explanation: the tile loops run only when it says torch
    for kw, tiles in (({}, False), ({"block_size": 4}, True), ({"mask": empty}, True)):
        calls = []
        real = _tiles.forward

        def spy(p, calls=calls, real=real):
            calls.append(1)
            return real(p)

        _tiles.forward = spy
        try:
            sb.flash_attention(q, k, v, **kw)
        finally:
            _tiles.forward = real
        assert bool(calls) == tiles


def test_a_masked_nan_key_never_reaches_the_output():
    # torch's kernel adds the mask, so a nan at a masked key would leak: such a call
    # takes the tile loops, which remove the key.
    q, k, v = _qkv(6, 9)
    k = k.clone()
    k[0, 0, 3, 0] = float("nan")
    keep = torch.ones(6, 9, dtype=torch.bool)
    keep[:, 3] = False
    out = sb.flash_attention(q, k, v, mask=keep)
    assert torch.isfinite(out).all()


def test_a_compiled_call_reads_the_mask_when_it_runs():
    """Compiled, the graph computes whether torch's kernel may take a masked call
    (rows that keep a key, finite q and k) and the operator reads that answer when
    it runs: a row with nothing to attend gets the tile loops' -inf logsumexp and
    zero gradients, a nan at a masked key stays out, as in an eager call."""
    torch._dynamo.reset()

    def f(q, k, v, keep):
        out, lse = sb.flash_attention(q, k, v, mask=keep, return_lse=True)
        return out, lse

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    q, k, v = _qkv(6, 9)
    keep = torch.ones(2, 1, 6, 9, dtype=torch.bool)
    empty_row, nan_key = keep.clone(), keep.clone()
    empty_row[1, 0, 2] = False  # row 2 of batch 1 attends to nothing
    nan_key[..., 3] = False  # key 3 masked everywhere, and a nan in it
    k_nan = k.detach().clone()
    k_nan[..., 3, :] = float("nan")
    for keys, mask in ((k, keep), (k, empty_row), (k_nan, nan_key)):
        results = []
        for run in (f, compiled):
            inputs = [x.detach().clone().requires_grad_() for x in (q, keys, v)]
            out, lse = run(*inputs, mask)
            (out.sum() + lse.masked_fill(lse.isinf(), 0).sum()).backward()
            results.append((out, lse, *(x.grad for x in inputs)))
        for got, want in zip(results[1], results[0], strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)
        if mask is empty_row:  # the tile loops' answer, which torch's kernel is not
            assert torch.isneginf(results[1][1][1, :, 2]).all()
        if mask is nan_key:
            assert torch.isfinite(results[1][0]).all()


def test_vmap_and_jacrev_over_the_function():
    q, k, v = (t.detach() for t in _leaves((3, 5, 4), (3, 7, 4), (3, 7, 4)))

    def f(q, k, v):
        return sb.FlashAttention.apply(q, k, v, True)

    torch.testing.assert_close(torch.func.vmap(f)(q, k, v), f(q, k, v))
    jac = torch.func.jacrev(f)(q[0], k[0], v[0])
    ref = torch.func.jacrev(
        lambda q: F.scaled_dot_product_attention(q, k[0], v[0], is_causal=True)
    )(q[0])
    torch.testing.assert_close(jac, ref)
    # per-sample gradients: vmap of grad
    grads = torch.func.vmap(torch.func.grad(lambda q, k, v: f(q, k, v).sum()))(q, k, v)
    for i in range(3):
        leaf = q[i].clone().requires_grad_()
        (want,) = torch.autograd.grad(f(leaf, k[i], v[i]).sum(), leaf)
        torch.testing.assert_close(grads[i], want)


def test_grad_out_is_gone_in_0_3():
    # Deprecated in 0.2, removed in 0.3 as the CHANGELOG said: grad_output= only.
    q, k, v = _qkv(4, 5)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="grad_out"):
        sb.flash_attention_backward(q, k, v, out, lse, grad_out=out)


def test_without_torchs_cpu_operator_every_call_takes_the_tile_loops(monkeypatch):
    # An older or newer torch without aten::_scaled_dot_product_flash_attention_for_cpu
    # loses only the fused path.
    monkeypatch.setattr(_fused, "FORWARD", None)
    q, k, v = _qkv(6, 9)
    decision = sb.explain_dispatch("flash_attention", q, k, v)
    assert (
        decision.path == "tiles" and "no CPU FlashAttention operator" in decision.reason
    )
    torch.testing.assert_close(
        sb.flash_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )


@pytest.mark.parametrize(
    "shape", [(5, 7), (7,), (1, 5, 7), (3, 5, 7), (3, 1, 7), (2, 1, 1, 7), (2, 3, 5, 7)]
)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_every_mask_shape_that_broadcasts_gives_torchs_result(shape, kind):
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 3, 5, 4, generator=g)
    k, v = (torch.randn(2, 3, 7, 4, generator=g) for _ in range(2))
    mask = torch.rand(*shape, generator=g) > 0.3
    mask[..., 0] = True
    if kind == "float":
        mask = torch.randn(*shape, generator=g)
    path = sb.explain_dispatch("flash_attention", q, k, v, mask=mask).path
    assert path == "torch-fused"
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = sb.flash_attention(*leaves, mask=mask)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = mask if mask.dim() >= 2 else mask.expand(5, 7)  # torch wants 2 dims
    want = F.scaled_dot_product_attention(*ref, attn_mask=theirs)
    torch.testing.assert_close(ours, want)
    for a, b in zip(
        torch.autograd.grad(ours.sum(), leaves),
        torch.autograd.grad(want.sum(), ref),
        strict=True,
    ):
        torch.testing.assert_close(a, b)
    q3, k3, v3 = q[0], k[0], v[0]  # 3-D inputs: the mask gains a heads dimension
    if len(shape) <= 3:
        torch.testing.assert_close(
            sb.flash_attention(q3, k3, v3, mask=mask),
            F.scaled_dot_product_attention(q3, k3, v3, attn_mask=theirs),
        )


# ------------------------------------------------------- the registered operator pair


@pytest.mark.parametrize("layout", ["heads transposed", "contiguous", "empty row"])
@pytest.mark.parametrize("path", ["torch-fused", "tiles"])
def test_the_fake_kernels_promise_the_real_layouts(path, layout):
    """torch.library.opcheck on both operators: a fake kernel that promises other
    strides than the real one returns makes inductor's compiled backward fail its
    stride assertions. q, k, v as transposed views, as a model's heads reach
    attention (``(B, T, H, D).transpose(1, 2)``), or contiguous; and a mask with a
    row that attends to nothing, which sends a call planned for torch's kernel to
    the tile loops when it runs (their outputs must then take the kernel's layouts,
    which the fake kernel promised)."""
    from softmaxbook.attention.flash._operator import (
        flash_attention_backward_op,
        flash_attention_op,
    )

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 3, 4, generator=g).transpose(1, 2) for _ in range(3))
    if layout == "contiguous":
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    mask = None
    if layout == "empty row":
        mask = torch.ones(7, 7, dtype=torch.bool).tril()
        mask[2] = False
    plan = ("" if mask is not None else "top_left", 0.5, 1, 4, 4, path)
    checks = ("test_schema", "test_faketensor")  # compiling is tested elsewhere
    torch.library.opcheck(
        flash_attention_op, (q, k, v, mask, None, *plan), test_utils=checks
    )
    out, lse, fused = flash_attention_op(q, k, v, mask, None, *plan)
    assert bool(fused) is (path == "torch-fused" and layout != "empty row")
    grad_out = torch.randn(out.shape, generator=g).transpose(1, 2).contiguous()
    grad_out = grad_out.transpose(1, 2)  # another layout, as autograd may pass it
    args = (grad_out.mT.contiguous().mT, None, q, k, v, out, lse, mask, None, *plan)
    torch.library.opcheck(flash_attention_backward_op, args, test_utils=checks)
    args = (*args, fused)  # the forward pass's path, as a compiled graph passes it
    torch.library.opcheck(flash_attention_backward_op, args, test_utils=checks)
    lse_grad = torch.randn(lse.shape, generator=g)  # the tile loops' backward
    args = (grad_out, lse_grad, q, k, v, out, lse, mask, None, *plan)
    torch.library.opcheck(flash_attention_backward_op, args, test_utils=checks)


def test_a_zero_logsumexp_gradient_keeps_torchs_fused_backward(monkeypatch):
    """A compiled graph passes zeros, not None, for the gradient of an unused
    logsumexp: the backward operator still takes torch's fused kernel then, and
    gives the gradients of the tile loops; a nonzero one takes the tile loops."""
    from softmaxbook.attention.flash import _operator as _op

    calls = []
    fused = _op._fused.backward
    monkeypatch.setattr(_op._fused, "backward", lambda *a: calls.append(1) or fused(*a))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    plan = ("top_left", 0.5, 1, 4, 4, "torch-fused")
    out, lse, _ = _op.flash_attention_op(q, k, v, None, None, *plan)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    saved = (q, k, v, out, lse)
    zeros = torch.zeros_like(lse)
    got = _op.flash_attention_backward_op(grad_out, zeros, *saved, None, None, *plan)
    assert calls == [1]
    tiles = ("top_left", 0.5, 1, 4, 4, "tiles")
    want = _op.flash_attention_backward_op(grad_out, None, *saved, None, None, *tiles)
    for a, b in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    _op.flash_attention_backward_op(grad_out, zeros + 1.0, *saved, None, None, *plan)
    assert calls == [1]  # a logsumexp gradient: the tile loops


def test_the_operator_reads_the_mask_a_traced_call_could_not():
    """Under torch.compile the path is chosen without reading the mask; the operator
    reads it when it runs: torch's fused kernel for masks whose rows all keep a key
    (as an eager call), the tile loops for a row with nothing to attend (zeros,
    forward and backward, where the fused kernel need not give them); it returns
    which it took, and the backward operator takes the same path."""
    from softmaxbook.attention.flash import _operator as _op

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    keep = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    keep[..., 0] = True
    plan = ("", 0.5, 1, 4, 4, "torch-fused")
    out, lse, fused = _op.flash_attention_op(q, k, v, keep, None, *plan)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.5)
    torch.testing.assert_close(out, want)
    assert bool(fused)
    keep[1, 0, 2] = False  # row 2 of batch 1 attends to nothing
    out, lse, fused = _op.flash_attention_op(q, k, v, keep, None, *plan)
    assert not bool(fused)
    assert torch.isfinite(out).all() and (out[1, :, 2] == 0).all()
    assert torch.isneginf(lse[1, :, 2]).all()
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for answer in (fused, None):  # the forward pass's, or read again
        grads = _op.flash_attention_backward_op(
            grad_out, None, q, k, v, out, lse, keep, None, *plan, answer
        )
        assert all(torch.isfinite(d).all() for d in grads[:3])
        assert (grads[0][1, :, 2] == 0).all()


@pytest.mark.parametrize("where", ["q", "k at a masked key"])
def test_a_nan_reaching_torchs_kernel_sends_the_call_to_the_tile_loops(where):
    """A nan in q, or in k at a key the mask removes, reaches a score of torch's
    kernel (which adds -inf to a masked score): the operator reads it from the
    kernel's logsumexp and takes the tile loops, as an eager call does, and so does
    the backward operator; the results are the eager call's (here, with a boolean
    mask and scores that do not overflow; for a float mask holding nan or +inf, or
    scores that overflow, the two may place the nans of a nan result differently)."""
    from softmaxbook.attention.flash import _operator as _op

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    if where == "q":
        q[1, 2, 4, 0] = float("nan")
    else:
        k[0, 1, 5, 2] = float("nan")  # key 5: masked in every row
        keep[0, :, 5, 5] = False
    plan = ("", 0.5, 1, 4, 4, "torch-fused")
    out, lse, fused = _op.flash_attention_op(q, k, v, keep, None, *plan)
    assert not bool(fused)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = sb.flash_attention(*leaves, mask=keep, scale=0.5)
    torch.testing.assert_close(out, want.detach(), equal_nan=True)
    if where != "q":
        assert torch.isfinite(out).all()
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = _op.flash_attention_backward_op(
        grad_out, None, q, k, v, out, lse, keep, None, *plan, fused
    )
    want = torch.autograd.grad(want, leaves, grad_out)
    torch.testing.assert_close(grads[:3], want, equal_nan=True)


def test_the_backward_operator_takes_the_forward_passs_path(monkeypatch):
    """The backward operator takes the path the forward pass answered (``fused``),
    without reading the values again; without the answer it reads them."""
    from softmaxbook.attention.flash import _operator as _op

    calls = []
    fused_backward = _op._fused.backward
    monkeypatch.setattr(
        _op._fused, "backward", lambda *a: calls.append(1) or fused_backward(*a)
    )
    q, k, v = (x.double() for x in _qkv(6, 6))
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    plan = ("", 0.5, 1, 4, 4, "torch-fused")
    out, lse, fused = _op.flash_attention_op(q, k, v, keep, None, *plan)
    grad_out = torch.randn_like(out)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    attention = F.scaled_dot_product_attention(*leaves, attn_mask=keep, scale=0.5)
    want = torch.autograd.grad(attention, leaves, grad_out)
    saved = (q, k, v, out, lse, keep, None)
    for answer, kernel in ((fused, 1), (torch.tensor(False), 0), (None, 1)):
        calls.clear()
        grads = _op.flash_attention_backward_op(grad_out, None, *saved, *plan, answer)
        assert len(calls) == kernel
        torch.testing.assert_close(grads[:3], want)


def test_the_operators_refuse_a_call_autograd_would_record():
    """The operator pair carries no derivative of its own (the autograd Function
    that torch.compile traces around it does): a direct call that autograd would
    record is refused, where the autograd fallback would only warn and give no
    gradient. Without gradients it runs."""
    from softmaxbook.attention.flash import _operator as _op

    q, k, v = _qkv(4, 5)
    plan = ("", 0.5, 1, 4, 4, "tiles")
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="no derivative of its own"):
        _op.flash_attention_op(q, k, v, None, None, *plan)
    with torch.no_grad():
        out, *_ = _op.flash_attention_op(q, k, v, None, None, *plan)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.5))


@pytest.mark.parametrize("return_lse", [False, True])
def test_a_compiled_backward_gets_no_logsumexp_gradient_unless_returned(return_lse):
    """Compiled, the gradient of a logsumexp the caller does not return is zeros;
    the backward operator is handed None for it in the compiled backward graph
    (torch's fused kernel takes no logsumexp gradient), and the logsumexp's
    gradient where it is returned."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    graphs = []

    def keep_graph(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=keep_graph, bw_compiler=keep_graph)

    def f(q, k, v, keep):
        result = sb.flash_attention(q, k, v, mask=keep, return_lse=return_lse)
        return result[0].sum() + result[1].sum() if return_lse else result.sum()

    q, k, v = (x.requires_grad_() for x in _qkv(6, 9))
    keep = torch.ones(2, 1, 6, 9, dtype=torch.bool).tril()
    torch.compile(f, backend=backend, fullgraph=True)(q, k, v, keep).backward()
    op = torch.ops.softmaxbook.flash_attention_backward.default
    calls = [n for gm in graphs for n in gm.graph.nodes if n.target is op]
    assert len(calls) == 1 and (calls[0].args[1] is None) is not return_lse
    want = torch.autograd.grad(f(q, k, v, keep), (q, k, v))
    torch.testing.assert_close((q.grad, k.grad, v.grad), want)


def test_an_output_of_torchs_kernel_can_be_modified_in_place():
    """An output of torch's kernel (which returns views of its own buffers) can be
    modified in place, as torch's own output can; the backward pass then refuses
    the changed output it saved, as torch's does."""
    q, k, v = (x.requires_grad_() for x in _qkv(5, 7))
    path = sb.explain_dispatch("flash_attention", q, k, v, is_causal=True).path
    assert path == "torch-fused"
    for attention in (sb.flash_attention, F.scaled_dot_product_attention):
        out = attention(q, k, v, is_causal=True)
        out.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def _transforms(k: Tensor, v: Tensor, keep: Tensor) -> dict:
    def attend(q: Tensor) -> Tensor:
        return sb.flash_attention(q, k, v, mask=keep)

    def per_sample(q: Tensor) -> Tensor:
        return torch.func.vmap(lambda x: sb.flash_attention(x, k[0], v[0]))(q)

    return {
        "grad": torch.func.grad(lambda q: attend(q).sum()),
        "jacrev": torch.func.jacrev(attend),
        "grad of vmap": torch.func.grad(lambda q: per_sample(q).sum()),
        "vmap of grad": torch.func.vmap(
            torch.func.grad(lambda x: sb.flash_attention(x, k[0], v[0]).sum())
        ),
    }


@pytest.mark.parametrize(
    "transform", ["grad", "jacrev", "grad of vmap", "vmap of grad"]
)
def test_a_compiled_torch_func_derivative_is_refused_not_zero(transform):
    """Under a torch.func derivative, torch.compile would trace the operators
    without the Function that is their derivative. With ``fullgraph=True`` the call
    is refused while torch.compile traces; without, torch.compile runs it eagerly,
    where the autograd Function gives the transform's true result."""
    q, k, v = _qkv(6, 9)
    keep = torch.ones(2, 1, 6, 9, dtype=torch.bool).tril()
    f = _transforms(k, v, keep)[transform]
    torch._dynamo.reset()
    with pytest.raises(
        RuntimeError, match=r"no torch\.func transform but a single vmap"
    ):
        torch.compile(f, backend="aot_eager", fullgraph=True)(q)
    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager")(q)
    torch.testing.assert_close(got, f(q))
    assert got.abs().sum() > 0


def test_a_gradient_through_a_compiled_vmap_is_refused_not_wrong():
    """A compiled vmap whose inputs need gradients would trace the operator without
    the Function around it: it raises, where a silent pass-through would lose the
    attention's gradient."""
    q, k, v = _qkv(6, 9)
    lin = torch.nn.Linear(q.shape[-1], q.shape[-1])

    def loss(x: Tensor) -> Tensor:
        attend = torch.func.vmap(lambda y: sb.flash_attention(y, k[0], v[0]))
        return attend(lin(x)).pow(2).sum()

    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="no derivative of its own"):
        torch.compile(loss, backend="aot_eager")(q).backward()


def test_torch_func_grad_of_a_direct_operator_call_is_refused():
    """``torch.func.grad`` of the operator called directly raises (the tensors the
    transform tracks reach its autograd kernel), rather than giving zeros."""
    from softmaxbook.attention.flash import _operator as _op

    q, k, v = _qkv(4, 5)
    plan = ("", 0.5, 1, 4, 4, "tiles")
    grad = torch.func.grad(
        lambda q: _op.flash_attention_op(q, k, v, None, None, *plan)[0].sum()
    )
    with pytest.raises(RuntimeError, match="no derivative of its own"):
        grad(q)


def test_a_compiled_vmap_of_a_call_matches_eager():
    """One ``vmap`` needs no derivative: compiled, it gives the eager result."""
    q, k, v = _qkv(6, 9)
    f = torch.func.vmap(lambda x: sb.flash_attention(x, k[0], v[0], is_causal=True))
    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q)
    torch.testing.assert_close(got, f(q))
