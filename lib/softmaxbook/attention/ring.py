r"""Ring attention: exact attention over a sequence split across processes.

Each of :math:`W` processes (ranks) holds one contiguous block of the
queries, keys and values. The key and value blocks travel around a ring:
at step :math:`t` rank :math:`r` attends with its queries to the block of
rank :math:`r - t`, while it already sends that block on to rank
:math:`r + 1` and receives the next one from rank :math:`r - 1`. Each step
gives a partial result over one block of keys, and partial results merge
exactly through their logsumexps (:func:`~softmaxbook.merge_attention_states`):
after :math:`W` steps every rank holds the attention output of its queries
over the whole sequence (Liu et al., 2023). A rank holds at most three key and
value blocks at a time: its own (kept for the backward pass), the one it
attends to while sending it on, and the one arriving (at step 0 the first two
are the same block, and nothing arrives after the last step). The backward
pass sends the blocks around again, each followed by the gradient accumulated
for it so far, which arrives back at its owner after the last step.

The communication is ``torch.distributed`` point-to-point (``isend``,
``irecv``), which both the ``gloo`` backend (CPU processes) and ``nccl``
(GPUs) provide; the tests run it with ``gloo`` only.
:func:`run_ring_attention` starts the processes on this machine (``gloo``,
loopback address only) for experiments and tests.
"""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta
from itertools import pairwise
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._numerics import acc_dtype
from .._validate import check_positive, check_positive_int
from ._args import resolve_attention
from .flash import DEFAULT_BLOCK_SIZE, flash_attention, flash_attention_backward
from .online import merge_attention_states

__all__ = ["ring_attention", "run_ring_attention", "RingRun", "block_owner"]


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool | str = False,
    scale: float | None = None,
    group: Any = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
    mask: Tensor | None = None,
    sinks: Tensor | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""Attention over a sequence split across the ranks of a process group.

    Call it on every rank of ``group`` (default: the whole world) with that
    rank's blocks: rank :math:`r` holds the :math:`r`-th contiguous block of
    the queries, keys and values, in rank order. Returns the attention
    output of this rank's queries over *all* keys,

    .. math::

        o_r = \mathrm{softmax}\big(q_r [k_0; \dots; k_{W-1}]^\top
        \cdot \text{scale}\big)\, [v_0; \dots; v_{W-1}],

    computed by passing the key and value blocks around the ring and merging
    the partial results through their logsumexps. Each rank holds at most
    three key and value blocks at a time (its own, the one it attends to
    while sending it on, and the one arriving), so its memory falls as
    :math:`1/W` for a fixed sequence. Differentiable: the backward pass runs
    the ring again (:func:`~softmaxbook.flash_attention_backward` on each
    block, the block's gradient travelling with it).

    With ``is_causal`` (``True``, ``"top_left"`` or ``"bottom_right"``: the
    same mask here) every rank must hold as many queries as keys, the
    same number on every rank (a causal sequence split into equal blocks);
    the blocks of later ranks are then skipped. The other options of
    :func:`~softmaxbook.scaled_dot_product_attention` are not supported: a
    general ``mask``, ``sinks``, ``enable_gqa`` and ``dropout_p`` raise a
    ``ValueError`` naming them (a mask of the whole sequence would have to
    be cut and travel with the key blocks). (This leaves the last rank
    the most work; "striped" and "zigzag" orders of the blocks balance it.)

    Shapes: ``q`` ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S,
    Dv)`` on each rank (``S`` may differ between ranks without
    ``is_causal``); returns ``(..., L, Dv)`` in the dtype of ``q``.

    Equivalent to ``flash_attention(q, torch.cat(all_k, -2), torch.cat(all_v,
    -2), is_causal=is_causal, scale=scale)[..., rows of this rank, :]``; here
    in a process group of one (:func:`run_ring_attention` starts several):

    >>> import torch
    >>> import torch.distributed as dist
    >>> import softmaxbook as sb
    >>> from softmaxbook import ring
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> q, k, v = torch.randn(3, 2, 6, 8).unbind(0)  # (H, L, D) each
    >>> out = ring.ring_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, sb.flash_attention(q, k, v, is_causal=True), atol=1e-6)
    True
    >>> dist.destroy_process_group()

    Raises
    ------
    RuntimeError
        If ``torch.distributed`` is not initialized.
    TypeError, ValueError
        For bad input, as :func:`~softmaxbook.flash_attention`, if
        ``is_causal`` is set and the blocks are not square and equal, or for
        an option ring attention does not support.
    """
    args = resolve_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="ring_attention",
        unsupported=_UNSUPPORTED,
    )  # fmt: skip
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "ring_attention needs torch.distributed: call "
            "torch.distributed.init_process_group first (or use "
            "run_ring_attention, which starts the processes)"
        )
    causal, scale = args.causal is not None, args.scale
    if causal:
        lengths = torch.tensor([q.shape[-2], k.shape[-2]])
        gathered = [torch.empty_like(lengths) for _ in range(_world(group))]
        dist.all_gather(gathered, lengths, group=group)
        if any(not torch.equal(g, lengths) or g[0] != g[1] for g in gathered):
            raise ValueError(
                "ring_attention with is_causal=True needs equal, square blocks "
                "(as many queries as keys, the same on every rank); got (L, S) = "
                f"{[tuple(g.tolist()) for g in gathered]}"
            )
    out, _ = _RingAttention.apply(q, k, v, causal, scale, group, block_size)
    return out.to(q.dtype)  # the one rounding of a half-precision result


#: What ring attention cannot honour: the blocks carry no mask, sinks or shared heads.
_UNSUPPORTED = ("mask", "sinks", "enable_gqa", "dropout_p")


def _world(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def block_owner(rank: int, step: int, world_size: int) -> int:
    r"""The rank whose key/value block ``rank`` holds at ``step`` of the ring:
    :math:`(r - t) \bmod W`, since each rank sends to ``rank + 1`` and receives
    from ``rank - 1``.

    >>> [block_owner(0, t, 4) for t in range(4)]
    [0, 3, 2, 1]
    """
    return (rank - step) % world_size


class _Ring:
    """Who this rank sends to and receives from, and one step of passing blocks."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        ranks = [(self.rank + 1) % self.world, (self.rank - 1) % self.world]
        if group is not None:  # point-to-point calls take global ranks
            ranks = [dist.get_global_rank(group, r) for r in ranks]
        self.send_to, self.recv_from = ranks

    def owner(self, step: int) -> int:
        """The rank whose key block this rank holds at ``step``."""
        return block_owner(self.rank, step, self.world)

    def start(self, tensors: list[Tensor]) -> tuple[Any, list[Tensor]]:
        """Send ``tensors`` on and receive the previous rank's; returns the pending
        requests and the buffers that will hold what arrives."""
        dist = self.dist
        buffers = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.send_to, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.recv_from, self.group) for b in buffers]
        return dist.batch_isend_irecv(ops), buffers

    @staticmethod
    def finish(requests: Any, buffers: list[Tensor]) -> list[Tensor]:
        for request in requests:
            request.wait()
        return buffers


class _RingAttention(torch.autograd.Function):
    """The ring's forward and backward passes. The blocks travel in their own dtype;
    each step computes in float32 at least (float64 stays float64), and the partial
    outputs and logsumexps stay in that dtype through the merges, so a half-precision
    output is rounded once, by the caller, not once per merge (as Flash-Decoding
    keeps its partial results in float32)."""

    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        is_causal: bool,
        scale: float,
        group: Any,
        block_size: int | tuple[int, int] | None,
    ) -> tuple[Tensor, Tensor]:
        ring = _Ring(group)
        acc = acc_dtype(q.dtype)
        q_acc = q.to(acc)
        blocks = [k.contiguous(), v.contiguous()]
        out: Tensor | None = None
        lse: Tensor | None = None
        for step in range(ring.world):
            src = ring.owner(step)
            # Start passing this block on before computing with it: the transfer
            # overlaps the computation.
            pending = ring.start(blocks) if step < ring.world - 1 else None
            if not is_causal or src <= ring.rank:  # later blocks: all masked
                o, lse_o = flash_attention(
                    q_acc,
                    blocks[0].to(acc),
                    blocks[1].to(acc),
                    is_causal=is_causal and src == ring.rank,
                    scale=scale,
                    block_size=block_size,
                    return_lse=True,
                )
                if out is None or lse is None:
                    out, lse = o, lse_o
                else:
                    out, lse = merge_attention_states(out, lse, o, lse_o)
            if pending is not None:
                blocks = ring.finish(*pending)
        assert out is not None and lse is not None  # the own block is never skipped
        return out, lse

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, v, is_causal, scale, group, block_size = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (is_causal, scale, group, block_size)
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(
        ctx: Any, grad_out: Tensor, _grad_lse: Tensor | None
    ) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, scale, group, block_size = ctx.args
        ring = _Ring(group)
        acc = acc_dtype(q.dtype)
        q_acc, grad_out = q.to(acc), grad_out.to(acc)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        blocks = [k.contiguous(), v.contiguous()]
        grads = [torch.zeros(t.shape, dtype=acc, device=t.device) for t in (k, v)]
        for step in range(ring.world):
            src = ring.owner(step)
            pending = ring.start(blocks) if step < ring.world - 1 else None
            if not is_causal or src <= ring.rank:
                # This block's share of the gradients: the weights come from the
                # merged logsumexp, so no other block is needed.
                dq_s, dk_s, dv_s = flash_attention_backward(
                    q_acc, blocks[0].to(acc), blocks[1].to(acc), out, lse, grad_out,
                    is_causal=is_causal and src == ring.rank, scale=scale,
                    block_size=block_size,
                )  # fmt: skip
                dq += dq_s
                grads[0] += dk_s
                grads[1] += dv_s
            # The block's gradient follows it to the next rank; after the last step
            # it arrives at the block's owner.
            if ring.world > 1:
                grads = ring.finish(*ring.start(grads))
            if pending is not None:
                blocks = ring.finish(*pending)
        dk, dv = grads
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


# --------------------------------------------------------------------------------------
# Running it on this machine
# --------------------------------------------------------------------------------------


class RingRun(NamedTuple):
    """What :func:`run_ring_attention` brings back from its processes."""

    #: The attention output, the blocks of all ranks put together ``(..., L, Dv)``.
    out: Tensor
    #: ``(dq, dk, dv)`` for the given ``grad_output``, or None without it.
    grads: tuple[Tensor, Tensor, Tensor] | None
    #: Bytes of the query, key and value blocks each rank was given, one per rank.
    input_bytes: list[int]
    #: The growth of each rank's resident memory during the call (the peak of
    #: ``VmHWM`` over the resident size before it; Linux only, else None).
    peak_bytes: list[int] | None


def run_ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    world_size: int,
    is_causal: bool | str = False,
    scale: float | None = None,
    grad_output: Tensor | None = None,
    timeout: float = 120.0,
) -> RingRun:
    r"""Run :func:`ring_attention` on ``world_size`` new processes of this machine.

    Splits the sequence of ``q``, ``k`` and ``v`` into ``world_size``
    contiguous blocks (dimension -2; block sizes differ by at most one),
    starts one process per block (forked from a fork server, which imports
    torch once; ``spawn`` where there is none), connects them with the
    ``gloo`` backend over the loopback address 127.0.0.1, runs the ring on
    each, and returns the output put together. With ``grad_output`` it also runs
    the backward pass and returns the gradients. Each process runs torch on
    one thread and measures the growth of its resident memory during the call
    (the extra memory the ring needs beyond its input blocks).

    Shapes: ``q`` ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S,
    Dv)`` with the same batch dimensions; ``grad_output`` ``(..., L, Dv)``.

    Equivalent to ``flash_attention(q, k, v, is_causal=is_causal,
    scale=scale)`` (and its gradients), computed by ``world_size`` processes:

    >>> import torch
    >>> import softmaxbook as sb
    >>> from softmaxbook import ring
    >>> q, k, v = torch.randn(3, 2, 6, 8, dtype=torch.float64).unbind(0)
    >>> g = torch.randn(2, 6, 8, dtype=torch.float64)
    >>> run = ring.run_ring_attention(q, k, v, world_size=2, grad_output=g)
    >>> leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    >>> out = sb.flash_attention(*leaves)
    >>> torch.allclose(run.out, out)
    True
    >>> expected = torch.autograd.grad(out, leaves, g)
    >>> all(torch.allclose(a, b) for a, b in zip(run.grads, expected))
    True

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`ring_attention`.
    RuntimeError
        If a process fails (with its traceback) or the run exceeds ``timeout``
        seconds (the processes are then stopped).
    """
    import torch.multiprocessing as mp

    world_size = check_positive_int(world_size, "world_size")
    timeout = check_positive(timeout, "timeout")
    resolve_attention(
        q, k, v, is_causal=is_causal, scale=scale, caller="run_ring_attention"
    )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "run_ring_attention needs q, k and v with the same batch dimensions, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if grad_output is not None and grad_output.shape != q.shape[:-1] + v.shape[-1:]:
        raise ValueError(
            f"grad_output must have shape {tuple(q.shape[:-1] + v.shape[-1:])}, "
            f"got {tuple(grad_output.shape)}"
        )
    if world_size > min(q.shape[-2], k.shape[-2]):
        raise ValueError(
            f"world_size={world_size} is more than the sequence has positions "
            f"(L = {q.shape[-2]}, S = {k.shape[-2]})"
        )
    chunks = [_split(t, world_size) for t in (q, k, v)]
    do = (
        _split(grad_output, world_size)
        if grad_output is not None
        else [None] * world_size
    )
    ctx = _start_context(mp)
    results = ctx.Queue()
    port = _free_port()
    options = {"is_causal": is_causal, "scale": scale, "timeout": timeout}
    procs = []
    for rank in range(world_size):
        blocks = [c[rank] for c in chunks]
        args = (rank, world_size, port, blocks, do[rank], options, results)
        procs.append(ctx.Process(target=_worker, args=args, daemon=True))
    for p in procs:
        p.start()
    try:
        gathered = _collect(results, procs, world_size, timeout)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():  # only the processes started here
                p.terminate()
                p.join(timeout=5)
    ranks = [gathered[r] for r in range(world_size)]
    out = torch.cat([torch.from_numpy(r["out"]) for r in ranks], dim=-2)
    grads: tuple[Tensor, Tensor, Tensor] | None = None
    if grad_output is not None:
        dq, dk, dv = (
            torch.cat([torch.from_numpy(r["grads"][i]) for r in ranks], dim=-2).to(
                q.dtype
            )
            for i in range(3)
        )
        grads = (dq, dk, dv)
    peaks = [r["peak"] for r in ranks]
    return RingRun(
        out.to(q.dtype),
        grads,
        [r["input_bytes"] for r in ranks],
        None if None in peaks else peaks,
    )


#: Imported once by the fork server instead of by every rank of every call: this
#: module (torch with it), and the symbolic-shape module (sympy) that torch imports on
#: the first ``broadcast_shapes`` or ``autograd.grad`` with ``grad_outputs``.
_PRELOAD = ["__main__", __name__, "torch.fx.experimental.symbolic_shapes"]


def _start_context(mp: Any) -> Any:
    """A fork server where the platform has one (Linux, macOS), else ``spawn``.

    Both start clean processes (no threads or CUDA state copied from the caller).
    A spawned process imports torch afresh, 2 to 3 s of CPU per rank and call; the
    fork server imports it once, the first time it is needed, and forks each rank
    from there."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _split(t: Tensor, parts: int) -> list[Tensor]:
    n = t.shape[-2]
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [t[..., a:b, :].contiguous() for a, b in pairwise(edges)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collect(
    results: Any, procs: list[Any], world_size: int, timeout: float
) -> dict[int, dict[str, Any]]:
    import queue
    import time

    gathered: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(gathered) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(
                f"run_ring_attention: no result after {timeout:g} s "
                f"({len(gathered)} of {world_size} ranks finished); stopped them"
            )
        try:
            rank, payload = results.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(
                    f"run_ring_attention: a process exited with code "
                    f"{dead[0].exitcode} before reporting"
                ) from None
            continue
        if isinstance(payload, str):
            raise RuntimeError(f"run_ring_attention: rank {rank} failed:\n{payload}")
        gathered[rank] = payload
    return gathered


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:  # writing 5 resets VmHWM to the current resident size (Linux)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _numpy(t: Tensor) -> Any:
    """``t`` as a NumPy array, half precision widened exactly to float32 (NumPy has no
    bfloat16); :func:`run_ring_attention` casts the results back."""
    return t.detach().to(acc_dtype(t.dtype)).numpy()


def _worker(
    rank: int,
    world_size: int,
    port: int,
    blocks: list[Tensor],
    grad_out: Tensor | None,
    options: dict[str, Any],
    results: Any,
) -> None:
    """One rank of :func:`run_ring_attention` (runs in a process of its own)."""
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)  # the ranks share this machine's cores
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=options["timeout"]),
        )
        q, k, v = blocks
        kw = {"is_causal": options["is_causal"], "scale": options["scale"]}
        if grad_out is not None:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
        ring_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :], **kw)  # warm-up
        dist.barrier()
        before = _status_kib("VmRSS")
        measured = _reset_peak() and before is not None
        out = ring_attention(q, k, v, **kw)
        grads = None
        if grad_out is not None:
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
        peak = _status_kib("VmHWM") if measured else None
        payload = {
            "out": _numpy(out),
            "grads": None if grads is None else [_numpy(g) for g in grads],
            "input_bytes": sum(t.numel() * t.element_size() for t in blocks),
            "peak": None
            if peak is None or before is None
            else max(peak - before, 0) * 1024,
        }
        dist.barrier()
        results.put((rank, payload))
    except Exception:  # reported to the parent, which raises it
        results.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
