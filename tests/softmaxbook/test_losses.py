"""Tests for softmaxbook.losses: label smoothing, z-loss, chunked cross-entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb

NEG_INF = float("-inf")


def _batch(n=12, V=9, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, V, generator=g, dtype=dtype) * 3
    target = torch.randint(0, V, (n,), generator=g)
    return logits, target


# --- label_smoothed_cross_entropy ---------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 1000), st.sampled_from(["mean", "sum"]))
def test_label_smoothing_matches_torch(eps, seed, reduction):
    logits, target = _batch(seed=seed)
    target[seed % 12] = -100  # one ignored row
    ours = sb.label_smoothed_cross_entropy(
        logits, target, smoothing=eps, reduction=reduction
    )
    theirs = F.cross_entropy(logits, target, label_smoothing=eps, reduction=reduction)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_label_smoothing_gradient_is_softmax_minus_smoothed_target():
    logits, target = _batch(n=5, V=7)
    eps, V = 0.3, 7
    z = logits.clone().requires_grad_()
    sb.label_smoothed_cross_entropy(
        z, target, smoothing=eps, reduction="sum"
    ).backward()
    q = (1 - eps) * F.one_hot(target, V).double() + eps / V
    torch.testing.assert_close(z.grad, torch.softmax(logits, -1) - q)
    assert torch.autograd.gradcheck(
        lambda t: sb.label_smoothed_cross_entropy(t, target, smoothing=eps),
        (logits.clone().requires_grad_(),),
    )


def test_label_smoothing_optimum_is_finite():
    # the loss is minimized where softmax(z) = q: the true logit sits
    # log(((1 - eps) V + eps) / eps) above the others
    V, eps = 5, 0.1
    gap = math.log(((1 - eps) * V + eps) / eps)
    target = torch.tensor([0])

    def loss_at(g):
        z = torch.tensor([[g, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
        return float(sb.label_smoothed_cross_entropy(z, target, smoothing=eps))

    assert loss_at(gap) < loss_at(gap - 0.5) and loss_at(gap) < loss_at(gap + 0.5)
    assert loss_at(gap) < loss_at(gap + 1e-3) and loss_at(gap) < loss_at(gap - 1e-3)


def test_label_smoothing_removed_classes_get_no_mass():
    logits = torch.tensor([[2.0, 0.0, NEG_INF, -1.0]], dtype=torch.float64)
    target = torch.tensor([0])
    ours = sb.label_smoothed_cross_entropy(logits, target, smoothing=0.2)
    finite = logits[:, [0, 1, 3]]
    expected = F.cross_entropy(finite, target, label_smoothing=0.2)
    torch.testing.assert_close(ours, expected)
    assert math.isinf(float(F.cross_entropy(logits, target, label_smoothing=0.2)))


def test_label_smoothing_shapes_ignore_and_dtypes():
    logits = torch.randn(2, 3, 6)
    target = torch.randint(0, 6, (2, 3))
    per_row = sb.label_smoothed_cross_entropy(logits, target, reduction="none")
    assert per_row.shape == (2, 3)
    theirs = F.cross_entropy(logits.movedim(-1, 1), target, label_smoothing=0.1,
                             reduction="none")  # fmt: skip
    torch.testing.assert_close(per_row, theirs)
    everything_ignored = torch.full((2, 3), -100)
    assert float(sb.label_smoothed_cross_entropy(logits, everything_ignored)) == 0.0
    for dtype in (torch.float16, torch.bfloat16):
        low = sb.label_smoothed_cross_entropy(logits.to(dtype), target)
        assert low.dtype == torch.float32
        ref = sb.label_smoothed_cross_entropy(logits.to(dtype).float(), target)
        torch.testing.assert_close(low, ref)


def test_label_smoothing_errors():
    logits, target = _batch()
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\]"):
        sb.label_smoothed_cross_entropy(logits, target, smoothing=1.5)
    with pytest.raises(ValueError, match="smoothing must be a finite number >= 0"):
        sb.label_smoothed_cross_entropy(logits, target, smoothing=-0.1)
    with pytest.raises(ValueError, match=r"outside \[0, 9\)"):
        sb.label_smoothed_cross_entropy(logits, target + 9)
    with pytest.raises(ValueError, match="target must have shape"):
        sb.label_smoothed_cross_entropy(logits, target[:3])
    with pytest.raises(TypeError, match="class indices"):
        sb.label_smoothed_cross_entropy(logits, target.double())
    with pytest.raises(ValueError, match="reduction"):
        sb.label_smoothed_cross_entropy(logits, target, reduction="max")
    with pytest.raises(TypeError, match="floating-point"):
        sb.label_smoothed_cross_entropy(target, target)


# --- z_loss -------------------------------------------------------------------------


def test_z_loss_definition_gradient_and_shift():
    logits, _ = _batch(n=4, V=5)
    lse = torch.logsumexp(logits, -1)
    torch.testing.assert_close(sb.z_loss(logits), (lse**2).mean())
    torch.testing.assert_close(sb.z_loss(logits, reduction="none"), lse**2)
    torch.testing.assert_close(sb.z_loss(logits, reduction="sum"), (lse**2).sum())
    z = logits.clone().requires_grad_()
    sb.z_loss(z, reduction="sum").backward()
    torch.testing.assert_close(z.grad, 2 * lse[:, None] * torch.softmax(logits, -1))
    # the loss that cross-entropy does not see: the shift of a row
    normalized = logits - lse[:, None]  # log-probabilities: log Z = 0
    assert float(sb.z_loss(normalized)) < 1e-24
    assert torch.autograd.gradcheck(sb.z_loss, (logits.clone().requires_grad_(),))


def test_z_loss_empty_rows_dtypes_and_vmap():
    z = torch.tensor([[NEG_INF, NEG_INF], [0.0, 0.0]], requires_grad=True)
    per_row = sb.z_loss(z, reduction="none")
    assert per_row[0] == 0 and torch.isclose(per_row[1], torch.tensor(math.log(2) ** 2))
    per_row.sum().backward()
    assert torch.isfinite(z.grad).all() and (z.grad[0] == 0).all()
    half = sb.z_loss(torch.randn(3, 4).half())
    assert half.dtype == torch.float32
    logits, _ = _batch(n=3, V=4)
    torch.testing.assert_close(
        torch.func.vmap(lambda r: sb.z_loss(r[None]))(logits),
        torch.logsumexp(logits, -1) ** 2,
    )
    with pytest.raises(ValueError, match="reduction"):
        sb.z_loss(logits, reduction=None)
    with pytest.raises(ValueError, match="at least one dimension"):
        sb.z_loss(torch.tensor(1.0))


# --- chunked_cross_entropy ----------------------------------------------------------


def _head(N=37, D=6, V=11, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g, dtype=dtype)
    weight = torch.randn(V, D, generator=g, dtype=dtype)
    bias = torch.randn(V, generator=g, dtype=dtype)
    target = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, bias, target


@pytest.mark.parametrize("chunk", [1, 5, 37, 100])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_matches_full_cross_entropy_and_gradients(chunk, reduction):
    hidden, weight, bias, target = _head()
    target[[3, 20]] = -100
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    ours = sb.chunked_cross_entropy(
        leaves[0], leaves[1], target, bias=leaves[2], chunk_size=chunk,
        reduction=reduction,
    )  # fmt: skip
    full = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    theirs = F.cross_entropy(full[0] @ full[1].T + full[2], target, reduction=reduction)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(theirs)
    (ours * upstream).sum().backward()
    (theirs * upstream).sum().backward()
    for a, b in zip(leaves, full):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_chunked_gradcheck_with_soft_cap_and_batch_shape():
    hidden, weight, bias, target = _head(N=8, D=4, V=5)
    hidden3 = hidden.view(2, 4, 4)
    target3 = target.view(2, 4)

    def loss(h, w, b):
        return sb.chunked_cross_entropy(
            h, w, target3, bias=b, chunk_size=3, soft_cap=2.0
        )

    args = [t.clone().requires_grad_() for t in (hidden3, weight, bias)]
    assert torch.autograd.gradcheck(loss, args)
    capped = sb.soft_cap(hidden @ weight.T + bias, 2.0)
    torch.testing.assert_close(loss(*args), F.cross_entropy(capped, target))
    none = sb.chunked_cross_entropy(hidden3, weight, target3, reduction="none")
    assert none.shape == (2, 4)


def test_chunked_low_precision_and_all_ignored():
    hidden, weight, _, target = _head(dtype=torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        h = hidden.to(dtype).requires_grad_()
        w = weight.to(dtype).requires_grad_()
        loss = sb.chunked_cross_entropy(h, w, target, chunk_size=8)
        ref = F.cross_entropy(h.detach().float() @ w.detach().float().T, target)
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
        loss.backward()
        assert h.grad.dtype == dtype and w.grad.dtype == dtype
    nothing = torch.full_like(target, -100)
    h = hidden.clone().requires_grad_()
    loss = sb.chunked_cross_entropy(h, weight, nothing)
    loss.backward()
    assert float(loss.detach()) == 0.0 and (h.grad == 0).all()


def test_chunked_never_holds_the_full_logits():
    # the largest tensor created inside the call is one chunk of logits:
    # watch every allocation through torch's dispatcher
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.biggest = max(Largest.biggest, t.numel())
            return out

    N, D, V, chunk = 64, 4, 50, 8
    hidden, weight, _, target = _head(N=N, D=D, V=V)
    h = hidden.clone().requires_grad_()
    with Largest():
        sb.chunked_cross_entropy(h, weight, target, chunk_size=chunk).backward()
    assert Largest.biggest == chunk * V  # never N * V
    Largest.biggest = 0
    with Largest():
        F.cross_entropy(h @ weight.T, target).backward()
    assert Largest.biggest == N * V


def test_chunked_errors():
    hidden, weight, bias, target = _head()
    with pytest.raises(ValueError, match=r"hidden must be \(\.\.\., D\)"):
        sb.chunked_cross_entropy(hidden, weight.T, target)
    with pytest.raises(TypeError, match="share a dtype"):
        sb.chunked_cross_entropy(hidden.float(), weight, target)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        sb.chunked_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="soft_cap"):
        sb.chunked_cross_entropy(hidden, weight, target, soft_cap=-1.0)
    with pytest.raises(ValueError, match="bias must be"):
        sb.chunked_cross_entropy(hidden, weight, target, bias=bias[:3])
    with pytest.raises(ValueError, match=r"outside \[0, 11\)"):
        sb.chunked_cross_entropy(hidden, weight, target + 11)
    with pytest.raises(ValueError, match="target must have shape"):
        sb.chunked_cross_entropy(hidden, weight, target[:-1])
