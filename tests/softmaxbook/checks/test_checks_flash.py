"""The FlashAttention and online-softmax checkers: the library and a student's correct
tile loop pass; each mistake a student makes in them gets its own hint.

The mistakes are written the way students write them: a tile loop that forgets to
rescale what it accumulated when the running maximum rises, a logsumexp in base 2,
without the maximum, or the maximum itself; a causal mask from the tile's own
indices; a forward that builds the whole score matrix; a backward without the
rowsum(dO * O) term; an autograd Function that saves the weights. Each test names the
fragment of the message a student needs to read.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import softmaxbook as sb
from softmaxbook import checks

# --------------------------------------------------------------------------------------
# A student's tile loop, with the mistakes as switches


def tile_loop(
    q,
    k,
    v,
    is_causal=False,
    block_q=16,
    block_k=16,
    *,
    rescale=("o", "l"),
    lse_as="natural",
    tile_mask=False,
    mask=None,
    empty_safe=True,
):
    """FlashAttention's forward: (out, lse), computed in float32 at least."""
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    acc = torch.promote_types(q.dtype, torch.float32)
    out = q.new_zeros(*q.shape[:-1], v.shape[-1], dtype=acc)
    lse = q.new_zeros(q.shape[:-1], dtype=acc)
    for q0 in range(0, L, block_q):
        qb = q[..., q0 : q0 + block_q, :].to(acc)
        n = qb.shape[-2]
        m = qb.new_full((*qb.shape[:-1], 1), -math.inf)
        ell = torch.zeros_like(m)
        o = qb.new_zeros(*qb.shape[:-1], v.shape[-1])
        for k0 in range(0, S, block_k):
            if is_causal and k0 > q0 + n - 1:
                break  # the tiles above the diagonal
            kb, vb = k[..., k0 : k0 + block_k, :].to(acc), v[..., k0 : k0 + block_k, :]
            s = qb @ kb.transpose(-2, -1) * scale
            i = torch.arange(q0, q0 + n)[:, None]
            j = torch.arange(k0, k0 + kb.shape[-2])[None, :]
            if is_causal:
                keep = (j - k0 <= i - q0) if tile_mask else (j <= i)
                s = s.masked_fill(~keep, -math.inf)
            if mask is not None:
                s = s.masked_fill(
                    ~mask[..., q0 : q0 + n, k0 : k0 + kb.shape[-2]], -math.inf
                )
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            shift = (
                m_new.masked_fill(torch.isneginf(m_new), 0.0) if empty_safe else m_new
            )
            p = torch.exp(s - shift)
            alpha = torch.exp(m - shift)
            ell = (alpha * ell if "l" in rescale else ell) + p.sum(dim=-1, keepdim=True)
            o = (alpha * o if "o" in rescale else o) + p @ vb.to(acc)
            m = m_new
        safe = torch.where(ell > 0, ell, torch.ones_like(ell)) if empty_safe else ell
        out[..., q0 : q0 + n, :] = o / safe
        row = {
            "natural": m + torch.log(ell),
            "base 2": (m + torch.log(ell)) / math.log(2),
            "m": m,
            "no max": torch.log(ell),
        }[lse_as]
        lse[..., q0 : q0 + n] = row.squeeze(-1)
    return out.to(q.dtype), lse


def flash_forward(q, k, v, is_causal=False, block_q=16, block_k=16):
    return tile_loop(q, k, v, is_causal, block_q, block_k)


def _variant(name, **options):
    def fn(q, k, v, is_causal=False, block_q=16, block_k=16):
        return tile_loop(q, k, v, is_causal, block_q, block_k, **options)

    fn.__name__ = name
    return fn


no_rescale = _variant("no_rescale", rescale=())
o_not_rescaled = _variant("o_not_rescaled", rescale=("l",))
lse_base2 = _variant("lse_base2", lse_as="base 2")
lse_is_m = _variant("lse_is_m", lse_as="m")
lse_no_max = _variant("lse_no_max", lse_as="no max")
tile_causal = _variant("tile_causal", tile_mask=True)


def out_only(q, k, v, is_causal=False, block_q=16, block_k=16):
    return tile_loop(q, k, v, is_causal, block_q, block_k)[0]


def no_rescale_out_only(q, k, v, is_causal=False, block_q=16, block_k=16):
    return tile_loop(q, k, v, is_causal, block_q, block_k, rescale=())[0]


def lse_keepdim(q, k, v, is_causal=False, block_q=16, block_k=16):
    out, lse = tile_loop(q, k, v, is_causal, block_q, block_k)
    return out, lse[..., None]


def no_is_causal(q, k, v, block_q=16, block_k=16):
    return tile_loop(q, k, v, False, block_q, block_k)


def whole_scores(q, k, v, is_causal=False, block_q=16, block_k=16):
    """Right values, but the (L, S) scores are formed: not FlashAttention."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def with_mask(q, k, v, is_causal=False, mask=None, block_q=16, block_k=16):
    return tile_loop(q, k, v, is_causal, block_q, block_k, mask=mask)


def with_mask_nan(q, k, v, is_causal=False, mask=None, block_q=16, block_k=16):
    return tile_loop(q, k, v, is_causal, block_q, block_k, mask=mask, empty_safe=False)


def library_tiles(q, k, v, is_causal=False, block_q=16, block_k=16):
    return sb.flash_attention(
        q, k, v, is_causal=is_causal, block_size=(block_q, block_k), return_lse=True
    )


def library_explicit(q, k, v, is_causal=False):
    return sb.flash_attention(
        q, k, v, is_causal=is_causal, explicit=True, return_lse=True
    )


def stub(q, k, v, is_causal=False, block_q=16, block_k=16):
    raise NotImplementedError("write your tile loop here")


@functools.cache
def forward_report(fn, **options):
    return checks.check_flash_forward(fn, **options)


# --------------------------------------------------------------------------------------
# Forward


@pytest.mark.parametrize(
    "fn", [flash_forward, library_tiles, library_explicit, out_only, with_mask]
)
def test_correct_forwards_pass(fn):
    report = forward_report(fn)
    assert report.ok, str(report)
    assert report.score == report.max_score
    if fn is not out_only:
        assert "the logsumexp (natural log)" in report.checked
    else:
        assert any("not checked: the logsumexp" in c for c in report.checked)


def test_the_library_tile_loop_passes_the_memory_check_where_it_is_seen():
    # On one thread the tile loop runs in the caller's thread, where the recording
    # sees every tile: the largest tensor is a fraction of the L x S scores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = checks.check_flash_forward(library_tiles)
    finally:
        torch.set_num_threads(threads)
    assert report.ok, str(report)
    memory = [
        r for r in report.results if r.name.endswith("the largest tensor created")
    ]
    assert len(memory) == 1 and memory[0].passed


FORWARD_MISTAKES = [
    (no_rescale, {}, ["That is the tile loop without the rescale",
                      "alpha = exp(m - m_new)"]),
    (no_rescale_out_only, {}, ["the output of your flash forward",
                               "That is the tile loop without the rescale"]),
    (o_not_rescaled, {}, ["Your running sum l is rescaled but the output"]),
    (lse_base2, {}, ["the logsumexp of your flash forward",
                     "That is the logsumexp in base 2"]),
    (lse_is_m, {}, ["That is the row maximum m, not the logsumexp"]),
    (lse_no_max, {}, ["That is log(l) without the maximum"]),
    (tile_causal, {}, ["is_causal=True", "compare positions in the whole sequence"]),
    (out_only, {"lse": True}, ["returned the output alone; return the pair "
                               "(out, lse)"]),
    (flash_forward, {"lse": False}, ["which looks like (out, lse): here only the "
                                     "output"]),
    (lse_keepdim, {}, ["returned shape (2, 24, 1); expected (2, 24)",
                       "lse.squeeze(-1)"]),
    (no_is_causal, {}, ["Accept is_causal as a keyword argument"]),
    (whole_scores, {}, ["created a tensor of shape (1, 384, 320)",
                        "whole score matrix"]),
    (with_mask_nan, {}, ["may attend to nothing", "A query with nothing to attend"]),
]  # fmt: skip
_HINTS = [
    "without the rescale",
    "rescaled but the output",
    "in base 2",
    "the row maximum m",
    "log(l) without the maximum",
    "whole sequence",
    "whole score matrix",
]


@pytest.mark.parametrize(
    "fn, options, fragments",
    FORWARD_MISTAKES,
    ids=[f"{f.__name__}-{o}" for f, o, _ in FORWARD_MISTAKES],
)
def test_forward_mistakes_get_their_own_hint(fn, options, fragments):
    report = forward_report(fn, **options)
    text = _text(report)
    assert not report.ok and report.score < report.max_score
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{report}"
    # and not another mistake's hint
    own = [h for h in _HINTS if any(h in f for f in fragments)]
    for hint in _HINTS:
        if hint not in own and not (
            fn is no_rescale and hint == "rescaled but the output"
        ):
            assert hint not in text, f"{hint!r} in the report of {fn.__name__}"


def test_a_forward_without_tile_sizes_gets_the_rescale_hint_too():
    # A function that takes no block sizes: its tiles are guessed for the diagnosis.
    def fixed_tiles(q, k, v, is_causal=False):
        return tile_loop(q, k, v, is_causal, 16, 16, rescale=())

    report = checks.check_flash_forward(fixed_tiles, memory=False)
    assert "That is the tile loop without the rescale" in _text(report)
    assert "block_q" not in _text(report)


@pytest.mark.parametrize(
    "fn", [flash_forward, no_rescale, lse_base2, whole_scores, stub]
)
def test_forward_scores_are_monotone(fn):
    report = forward_report(fn)
    assert _names(report) == _names(forward_report(flash_forward))
    if fn is stub:
        assert report.score == 0 and report.problems[0].endswith(
            "Implement the function: the stub still raises NotImplementedError."
        )
    elif fn is whole_scores:  # right values, one check lost: the memory
        assert report.score == report.max_score - 1
    elif fn is not flash_forward:
        assert 0 <= report.score < report.max_score


def test_forward_arguments_are_checked():
    with pytest.raises(TypeError, match="lse must be None, True or False"):
        checks.check_flash_forward(flash_forward, lse="yes")
    with pytest.raises(TypeError, match="fn must be a callable"):
        checks.check_flash_forward("flash_forward")


def test_a_pair_where_one_output_is_due_is_named_as_such():
    # check_attention on a function that returns (out, lse) used to get the hint
    # of torch.max's (values, indices)
    def attention_with_lse(q, k, v, mask=None):
        return sb.flash_attention(q, k, v, mask=mask, return_lse=True)

    text = _text(checks.check_attention(attention_with_lse))
    assert "which looks like (out, lse): here only the output is expected" in text
    assert "torch.max" not in text


# --------------------------------------------------------------------------------------
# Backward


def flash_backward(q, k, v, out, lse, grad_output, is_causal=False, *, mistake=""):
    acc = torch.promote_types(q.dtype, torch.float32)
    q_, k_, v_, o_, do = (t.to(acc) for t in (q, k, v, out, grad_output))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q_ @ k_.transpose(-2, -1) * scale
    if is_causal and mistake != "causal":
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    p = torch.exp(s - lse.to(acc)[..., None])
    dv = p.transpose(-2, -1) @ do
    dp = do @ v_.transpose(-2, -1)
    delta = {
        "": (do * o_).sum(dim=-1, keepdim=True),
        "no D": 0.0,
        "D of dO": do.sum(dim=-1, keepdim=True),
    }.get(mistake, (do * o_).sum(dim=-1, keepdim=True))
    ds = p * (dp - delta)
    c = 1.0 if mistake == "no scale" else scale
    dq, dk = ds @ k_ * c, ds.transpose(-2, -1) @ q_ * c
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward_variant(mistake):
    def fn(q, k, v, out, lse, grad_output, is_causal=False):
        return flash_backward(
            q, k, v, out, lse, grad_output, is_causal, mistake=mistake
        )

    fn.__name__ = f"backward_{mistake.replace(' ', '_')}"
    return fn


def library_backward(q, k, v, out, lse, grad_output, is_causal=False):
    return sb.flash_attention_backward(
        q, k, v, out, lse, grad_output, is_causal=is_causal
    )


@pytest.mark.parametrize("fn", [flash_backward, library_backward])
def test_correct_backwards_pass(fn):
    report = checks.check_flash_backward(fn)
    assert report.ok, str(report)
    assert report.score == report.max_score >= 6


BACKWARD_MISTAKES = [
    ("no D", ["of dq of your flash backward",
              "That is the backward without the rowsum term",
              "D_i = rowsum(dO * O)_i"]),
    ("D of dO", ["not the sum of grad_output alone"]),
    ("no scale", ["dq and dk miss the scale"]),
    ("causal", ["is_causal=True", "Your backward ignores the causal mask"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "mistake, fragments", BACKWARD_MISTAKES, ids=[m for m, _ in BACKWARD_MISTAKES]
)
def test_backward_mistakes_get_their_own_hint(mistake, fragments):
    report = checks.check_flash_backward(_backward_variant(mistake))
    text = _text(report)
    assert not report.ok and report.score < report.max_score
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{report}"
    for _, others in BACKWARD_MISTAKES:
        if others is not fragments:
            assert others[-1] not in text
    if mistake == "no D":  # dv is right: the hint is given once, for dq and dk
        assert len(report.problems) == 1


def test_a_backward_stub_scores_zero():
    def stub_backward(q, k, v, out, lse, grad_output, is_causal=False):
        raise NotImplementedError

    report = checks.check_flash_backward(stub_backward)
    good = checks.check_flash_backward(flash_backward)
    assert report.score == 0 and _names(report) == _names(good)


# --------------------------------------------------------------------------------------
# The autograd Function


class Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = tile_loop(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v, out, lse = ctx.saved_tensors
        return *flash_backward(q, k, v, out, lse, grad_output, ctx.is_causal), None


class SavesTheWeights(Flash):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = tile_loop(q, k, v, is_causal)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        ctx.weights = torch.exp(s - lse[..., None])  # an attribute, not saved
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out


class SavesBase2(Flash):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = tile_loop(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse / math.log(2))
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v, out, lse2 = ctx.saved_tensors
        lse = lse2 * math.log(2)
        return *flash_backward(q, k, v, out, lse, grad_output, ctx.is_causal), None


class SavesNoLse(Flash):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, _ = tile_loop(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v, out = ctx.saved_tensors
        _, lse = tile_loop(q, k, v, ctx.is_causal)  # recomputed: the forward again
        return *flash_backward(q, k, v, out, lse, grad_output, ctx.is_causal), None


class ReturnsPair(Flash):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = tile_loop(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out, lse

    @staticmethod
    def backward(ctx, grad_output, grad_lse):
        return Flash.backward(ctx, grad_output)


class NoIsCausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return Flash.forward(ctx, q, k, v)


def plain_autograd(q, k, v, is_causal=False):
    return whole_scores(q, k, v, is_causal)[0]


@pytest.mark.parametrize("cls_or_fn", [Flash, sb.FlashAttention, ReturnsPair])
def test_correct_functions_pass(cls_or_fn):
    report = checks.check_flash_function(cls_or_fn)
    assert report.ok, str(report)
    assert report.function == cls_or_fn.__name__
    assert report.score == report.max_score == 8


FUNCTION_MISTAKES = [
    (SavesTheWeights, ["the node of your autograd Function (SavesTheWeightsBackward) "
                       "saves a tensor of shape (2, 37, 45)",
                       "ctx.save_for_backward(q, k, v, out, lse)"]),
    (plain_autograd, ["recorded from your forward's operations (no autograd Function",
                      "the attention weights or scores"]),
    (SavesBase2, ["saves one number per query row", "but not the logsumexp",
                  "That is the logsumexp in base 2"]),
    (SavesNoLse, ["saves no tensor of one number per query row, (2, 37)"]),
    (NoIsCausal, ["The Function is called as apply(q, k, v, is_causal)"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "cls_or_fn, fragments",
    FUNCTION_MISTAKES,
    ids=[c.__name__ for c, _ in FUNCTION_MISTAKES],
)
def test_function_mistakes_get_their_own_hint(cls_or_fn, fragments):
    report = checks.check_flash_function(cls_or_fn)
    text = _text(report)
    assert not report.ok
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{report}"
    if cls_or_fn is not NoIsCausal:  # right values and gradients: one check lost
        assert report.score == report.max_score - 1
        (lost,) = [r for r in report.results if not r.passed]
        assert lost.name.endswith(": what the backward saves")
    else:
        assert report.score == 0


def test_the_function_checker_refuses_what_it_cannot_call():
    with pytest.raises(
        TypeError, match=r"torch\.autograd\.Function subclass or a function"
    ):
        checks.check_flash_function(3)


# --------------------------------------------------------------------------------------
# The online softmax


def online(x, block_size=4, *, rescale="right", state=False, stale=False, safe=True):
    """A student's streaming softmax: the weights, or the state (m, l)."""
    m = x.new_full(x.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    ell = torch.zeros_like(m)
    blocks = []
    for b in x.double().split(block_size, dim=-1):
        m_new = torch.maximum(m, b.amax(dim=-1, keepdim=True))
        shift = m_new.masked_fill(torch.isneginf(m_new), 0.0) if safe else m_new
        factor = {"right": torch.exp(m - shift), "none": 1.0}.get(rescale)
        if rescale == "inverted":
            factor = torch.exp(shift - m).masked_fill(torch.isneginf(m), 1.0)
        ell = ell * factor + torch.exp(b - shift).sum(dim=-1, keepdim=True)
        blocks.append(torch.exp(b - shift))
        m = m_new
    if state:
        return m.to(x.dtype), ell.to(x.dtype)
    shift = m.masked_fill(torch.isneginf(m), 0.0)
    e = torch.cat(blocks, dim=-1) if stale else torch.exp(x.double() - shift)
    return (e / torch.where(ell > 0, ell, torch.ones_like(ell))).to(x.dtype)


def _online_variant(name, **options):
    def fn(x, block_size=4):
        return online(x, block_size, **options)

    fn.__name__ = name
    return fn


@pytest.mark.parametrize(
    "fn",
    [
        sb.online_softmax,
        _online_variant("online"),
        _online_variant("state", state=True),
    ],
    ids=lambda f: f.__name__,
)
def test_correct_online_softmaxes_pass(fn):
    report = checks.check_online_softmax(fn)
    assert report.ok, str(report)
    assert report.score == report.max_score == 11


ONLINE_MISTAKES = [
    ({"rescale": "none"}, ["block_size = 3",
                           "That is the online softmax without the rescale",
                           "multiplied by exp(m - m_new)"]),
    ({"rescale": "none", "state": True}, ["l of your online softmax",
                                          "online softmax without the rescale"]),
    ({"rescale": "inverted"}, ["you multiplied by its inverse, exp(m_new - m)"]),
    ({"stale": True}, ["Each weight must use the final maximum and sum"]),
    ({"safe": False}, ["scores [-inf, -inf, -inf, 1, 2, 0.5] (float64), "
                       "block_size = 2", "exp(-inf - (-inf)) = nan"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "options, fragments", ONLINE_MISTAKES, ids=lambda v: str(v)[:30]
)
def test_online_mistakes_get_their_own_hint(options, fragments):
    report = checks.check_online_softmax(_online_variant("mine", **options))
    text = _text(report)
    assert not report.ok and report.score < report.max_score
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{report}"


def test_an_online_stub_scores_zero_and_the_identity_no_more():
    def online_stub(x, block_size=4):
        raise NotImplementedError

    def identity(x, block_size=4):
        return x

    good = checks.check_online_softmax(_online_variant("online"))
    for fn in (online_stub, identity):
        report = checks.check_online_softmax(fn)
        assert report.score == 0 and _names(report) == _names(good)


# --------------------------------------------------------------------------------------


def test_the_new_checkers_are_public_and_documented():
    for name in [
        "check_flash_forward",
        "check_flash_backward",
        "check_flash_function",
        "check_online_softmax",
    ]:
        assert name in checks.__all__
        assert "Examples" in getattr(checks, name).__doc__
    assert "CheckResult" in checks.__all__


def _names(report):
    return [r.name for r in report.results]


def _text(report):
    return " ".join(" ".join(report.problems).split())
