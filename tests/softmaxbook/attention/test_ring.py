"""Tests of softmaxbook.attention.ring: ring attention between processes of this
machine.

Each test starts its processes with run_ring_attention: workers forked from a
fork server (which imports torch once per test process, so a run after the first
costs a fraction of a second), the gloo backend, the loopback address only. Every
run is bounded (its timeout stops the processes), so a hung ring fails the test
instead of hanging it.
"""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb

TIMEOUT = 240.0  # seconds for one run, processes' start-up included


def _inputs(n, bh=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad_out = (torch.randn(1, bh, n, d, generator=g) for _ in range(4))
    return q, k, v, grad_out


def _single_process(q, k, v, grad_out, is_causal):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sb.flash_attention(*leaves, is_causal=is_causal)
    return out.detach(), torch.autograd.grad(out, leaves, grad_out)


def _assert_equal_within_float32(run, q, k, v, grad_out, is_causal):
    out, grads = _single_process(q, k, v, grad_out, is_causal)
    torch.testing.assert_close(run.out, out, atol=2e-6, rtol=1e-5)
    for ring_grad, grad in zip(run.grads, grads, strict=True):
        torch.testing.assert_close(ring_grad, grad, atol=2e-5, rtol=1e-4)


def test_two_processes_match_single_process_attention():
    q, k, v, grad_out = _inputs(96)
    run = sb.run_ring_attention(
        q, k, v, world_size=2, grad_output=grad_out, timeout=TIMEOUT
    )
    _assert_equal_within_float32(run, q, k, v, grad_out, False)
    assert run.input_bytes == [3 * 48 * 2 * 16 * 4] * 2  # each rank: half of q, k, v


@pytest.mark.slow
def test_four_processes_causal_match_single_process_attention():
    q, k, v, grad_out = _inputs(128, seed=1)
    run = sb.run_ring_attention(
        q, k, v, world_size=4, is_causal=True, grad_output=grad_out, timeout=TIMEOUT
    )
    _assert_equal_within_float32(run, q, k, v, grad_out, True)


@pytest.mark.slow
@pytest.mark.skipif(
    not sb.attention.ring._reset_peak(), reason="needs Linux's /proc/self/clear_refs"
)
def test_memory_per_rank_shrinks_with_the_number_of_ranks(monkeypatch):
    # A fixed sequence of 4096 positions: each rank holds 1/W of it and at most two
    # key blocks, so the memory a rank needs during the call falls with W.
    # Spawned ranks, which start from an empty interpreter: ranks forked from the
    # fork server measured peaks a few MiB higher and noisier (once, under load, a
    # rank of 4 at 16.6 MiB against 17.6 for a rank of 2, within the margin).
    monkeypatch.setattr(
        sb.attention.ring, "_start_context", lambda mp: mp.get_context("spawn")
    )
    q, k, v, grad_out = _inputs(4096, bh=2, d=32)
    peaks = {}
    for world in (2, 4):
        run = sb.run_ring_attention(
            q, k, v, world_size=world, grad_output=grad_out, timeout=TIMEOUT
        )
        peaks[world] = run.peak_bytes
        assert run.input_bytes == [3 * q.numel() * 4 // world] * world
    # Every rank of 4 needs less than every rank of 2, by a margin of 1 MiB (the
    # blocks a rank of 2 holds beyond a rank of 4 are several MiB).
    assert max(peaks[4]) + 2**20 < min(peaks[2]), peaks


def test_ring_attention_needs_torch_distributed():
    q, k, v, _ = _inputs(8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        sb.ring_attention(q, k, v)


def test_ring_attention_names_the_options_it_does_not_support():
    q, k, v, _ = _inputs(8)
    for option, value in [
        ("mask", torch.ones(8, 8, dtype=torch.bool)),
        ("mask", torch.zeros(8, 8)),
        ("sinks", torch.zeros(2)),
        ("dropout_p", 0.1),
    ]:
        with pytest.raises(ValueError, match="ring_attention does not support"):
            sb.ring_attention(q, k, v, **{option: value})
    kv = k[:, :1]
    with pytest.raises(ValueError, match="ring_attention does not support enable_gqa"):
        sb.ring_attention(q, kv, kv, enable_gqa=True)


def test_run_ring_attention_grad_out_is_gone_in_0_3():
    # Deprecated in 0.2, removed in 0.3 as the CHANGELOG said: grad_output= only.
    q, k, v, grad_out = _inputs(8)
    with pytest.raises(TypeError, match="grad_out"):
        sb.run_ring_attention(q, k, v, world_size=2, grad_out=grad_out)


def test_run_ring_attention_bad_input():
    q, k, v, grad_out = _inputs(8)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        sb.run_ring_attention(q, k, v, world_size=0)
    with pytest.raises(ValueError, match="more than the sequence has positions"):
        sb.run_ring_attention(q, k, v, world_size=9)
    with pytest.raises(ValueError, match="same batch dimensions"):
        sb.run_ring_attention(q, k[:, :1], v[:, :1], world_size=2)
    with pytest.raises(ValueError, match="grad_output must have shape"):
        sb.run_ring_attention(q, k, v, world_size=2, grad_output=grad_out[..., :4])


@pytest.mark.slow
def test_a_failing_rank_is_reported_not_hung():
    # Causal ring attention needs square blocks; q of 8 and k of 12 positions gives
    # (4, 6) blocks: every rank raises, and the parent reports a rank's traceback.
    q, k, v, _ = _inputs(12)
    with pytest.raises(RuntimeError, match=r"rank [01] failed"):
        sb.run_ring_attention(
            q[..., :8, :], k, v, world_size=2, is_causal=True, timeout=TIMEOUT
        )


def test_bfloat16_inputs_give_bfloat16_results_rounded_once():
    # bfloat16 blocks once crashed the workers (a .numpy() call on a bfloat16
    # tensor); and each rank should merge its partial results in float32 and round
    # once at the end, so the output is as close to exact attention as one rounding.
    q, k, v, grad_out = (t.bfloat16() for t in _inputs(96, d=16, seed=2))
    run = sb.run_ring_attention(
        q, k, v, world_size=4, grad_output=grad_out, timeout=TIMEOUT
    )
    assert run.out.dtype == torch.bfloat16
    assert [g.dtype for g in run.grads] == [torch.bfloat16] * 3
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    exact = sb.flash_attention(*leaves)
    one_rounding = (exact.bfloat16().double() - exact).abs().max()
    assert (run.out.double() - exact).abs().max() <= 1.5 * one_rounding
    exact_grads = torch.autograd.grad(exact, leaves, grad_out.double())
    for ring_grad, grad in zip(run.grads, exact_grads, strict=True):
        rounding = (grad.bfloat16().double() - grad).abs().max()
        assert (ring_grad.double() - grad).abs().max() <= 2 * rounding


def test_a_rank_holds_at_most_three_key_value_blocks_as_documented():
    # By the ring's own rule (_Ring.owner), rank r holds at step t its own block,
    # the block of rank r - t (attended to and sent on) and, before the last step,
    # the block of rank r - t - 1 arriving: three distinct blocks from W = 3 on.
    from softmaxbook.attention import ring

    for world in (2, 3, 4, 8):
        most = 0
        for rank in range(world):
            r = object.__new__(ring._Ring)
            r.rank, r.world = rank, world
            for step in range(world):
                held = {rank, r.owner(step)}
                if step < world - 1:
                    held.add(r.owner(step + 1))  # arriving while this one is sent
                most = max(most, len(held))
        assert most == min(world, 3)
    for doc in (ring.__doc__, ring.ring_attention.__doc__):
        text = " ".join(doc.split())
        assert "three key and value blocks" in text, text[:200]
        assert "two key and value blocks" not in text
        assert "two blocks of keys" not in text


def test_ranks_start_from_a_fork_server_where_there_is_one():
    # A spawned rank imports torch afresh (2 to 3 s of CPU per rank and call, which
    # was most of these tests' time); the fork server imports it once.
    import torch.multiprocessing as mp

    from softmaxbook.attention import ring

    ctx = ring._start_context(mp)
    if "forkserver" in mp.get_all_start_methods():
        assert ctx.get_start_method() == "forkserver"
        assert "softmaxbook.attention.ring" in ring._PRELOAD
    else:
        assert ctx.get_start_method() == "spawn"
