# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window's arithmetic: pure torch, device-agnostic, no vLLM import.

Invariants (the whole feature rests on these two):

1. **slot_mapping is never windowed.** The draft writes its KV through the full block
   table at absolute positions; nothing here produces or touches a slot mapping. The
   window only changes what attention *reads*, so the cache stays coherent whatever the
   window is, and the target reads the same cache at full length.
2. **Every KV length the attention kernel reads is windowed by the same arithmetic.**
   The device ``seq_lens``, any exact host mirror of it and the cropped block table all
   come from one ``skip`` per request (below); a host *upper bound* is truncated by
   :func:`seq_lens_upper_bound`, which keeps it a bound (see below).

Notation. ``L``: the length a request's attention reads (its ``seq_lens``; on vllm-ascend
sometimes its *actual lengths*: what vllm-ascend computes on the host and hands its kernel
as exact, FIA's ``actual_seq_lengths_kv``, such as the target's length plus the draft step,
whose window the device then follows); ``W``: ``draft_window_size``;
``a``: the alignment, the tokens one column of the cropped table covers (a common multiple
of the block sizes of every KV-cache group the window serves, so that one windowed length is
valid for all of them); ``b``: one group's block size (``b`` divides ``a``); ``S``: the
attention sinks, the first tokens every request keeps besides its window
(``draft_attention_sinks`` rounded up to a multiple of ``a``; 0 for a plain window).

    start    = floor(max(L - W, 0) / a) * a           block-aligned window start
    skip     = max(start - S, 0)                      tokens left out between sinks and window
             = floor(max(L - W - S, 0) / a) * a       (S is a multiple of a)
    windowed = L - skip                               what the kernel reads
    needed_b = ceil(windowed / b)                     columns it reads (0 for a padded row)

The second form of ``skip`` is the window start for a window of ``W + S``: sinks cost no
extra op in the length math, only one per group in the table's column index. Every draft
pass is windowed for itself (a rebuild, or the in-place update recorded in a graph), so one
window never serves a later step; vllm-ascend's MRV1 window, which does, is compared in the
design doc (section 6).

The cropped table is the sink columns ``[0, S / b)`` of the full table followed by its
columns from ``(S + skip) / b = start / b`` on, so the kernel reads ``[0, S)`` and then
``[start, L)`` as one sequence of ``windowed`` tokens. Keys are cached already rotated and
queries keep their absolute positions, so the gap changes nothing but what is read; the
queries stay the last tokens read, so the causal mask still lets each see its own past
inside the window. Where sinks and window meet (``start <= S``) nothing is skipped: the
read is exactly the unwindowed one. With ``S = 0``, ``skip = start``.

Bounds, with short proofs:

- ``0 <= start <= L`` and ``start = 0`` when ``L = 0`` (padded rows read nothing):
  if ``L - W > 0`` then ``start <= L - W < L``.
- ``windowed <= S + W + a - 1``: ``L - start <= W + a - 1`` (if ``L <= W``, ``start = 0``;
  otherwise ``start > L - W - a``, flooring loses less than ``a``). If ``skip > 0``,
  ``windowed = S + (L - start)``; if not, ``start <= S`` and ``windowed = L <= S + W + a - 1``.
  Hence every pass reads at most ``S + W + a - 1`` tokens (``WindowSpec.read_cap``) and
  ``needed_b <= ceil((S + W + a - 1) / b)``, the clone's width.
- ``windowed >= min(L, S + W)``: the draft never sees less than its sinks and its window
  (``start <= L - W`` whenever ``start > 0``).
- Host bound: the host knows only ``U >= L``. ``min(U, S + W + a - 1)`` bounds
  ``windowed``, by the bound above and ``windowed <= L <= U``. It is also the *smallest*
  bound for ``U >= 1``: ``windowed`` is a sawtooth in ``L`` that equals ``L`` until ``L``
  reaches ``S + W + a - 1`` and peaks there again at every tooth. Applying the windowing
  formula to ``U`` instead is not a bound: with ``W = 64, a = 16, S = 0``, ``U = 80``
  windows to 64 while ``L = 79 <= U`` windows to 79.

A pass whose queries are several tokens (a draft prefill) also keeps ``start <= L - q``, so
each query token reads at least itself; only a chunk longer than the window is affected,
and it reads at most ``S + q + a - 1`` tokens (``WindowSpec.read_cap(q)``).

Threshold. ``M``: ``draft_window_min_context``, the context from which the window engages
(0: every context). A request whose ``L`` is below ``M`` reads all of it, one at or above
it reads its window, decided per request and per pass from the same ``L``:

    skip     = floor(max(L - W - S, 0) / a) * a   if L >= M, else 0

No context below ``S + W + a`` is cropped anyway, so an ``M`` at or below ``S + W + a``
changes nothing and is applied as 0 (``effective_min_context``); above it, ``M - 1 >= S + W +
a`` is the longest whole read, so every pass reads at most ``max(S + W + a - 1, M - 1)``
(``read_cap``) and the host bound becomes ``min(U, max(S + W + a - 1, M - 1))``. That is
still the smallest bound: ``L = min(U, M - 1)`` reads all of itself.

Decode context parallelism: ``dcp.py`` shows why one start per request serves every rank.

Every function writes into caller-provided persistent buffers (``out=``), so a per-step
caller allocates nothing on the device, and none reads a device value on the host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


def lcm_alignment(block_sizes: Sequence[int]) -> int:
    """The smallest alignment valid for every group: the lcm of their block sizes."""
    if not block_sizes:
        raise ValueError("lcm_alignment needs at least one block size, got none")
    for block_size in block_sizes:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block sizes must be positive integers, got {list(block_sizes)}")
    return math.lcm(*block_sizes)


def align_sinks(sink_tokens: int, alignment: int) -> int:
    """``draft_attention_sinks`` rounded up to whole columns of the cropped table."""
    if sink_tokens < 0:
        raise ValueError(f"attention sinks must be >= 0 tokens, got {sink_tokens}")
    return ceil_div(sink_tokens, alignment) * alignment


def effective_min_context(
    min_context: int, window_size: int, alignment: int, sink_size: int = 0
) -> int:
    """``draft_window_min_context`` as the window applies it: 0 where it changes nothing,
    at or below ``S + W + a`` (every shorter context already reads whole)."""
    if min_context < 0:
        raise ValueError(f"min_context must be >= 0 tokens, got {min_context}")
    return min_context if min_context > sink_size + window_size + alignment else 0


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for integers, ``y > 0``."""
    return -(-x // y)


@dataclass(frozen=True)
class WindowSpec:
    """The static shape of one window: ``W``, ``a``, ``S`` and ``M`` in the module
    docstring (``M`` 0: every context is windowed)."""

    window_size: int
    alignment: int
    sink_size: int = 0
    min_context: int = 0

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.alignment < 1:
            raise ValueError(f"alignment must be >= 1, got {self.alignment}")
        if self.sink_size < 0 or self.sink_size % self.alignment:
            raise ValueError(
                f"sink_size must be a multiple of the alignment {self.alignment} (see "
                f"align_sinks), got {self.sink_size}"
            )
        if self.min_context and self.min_context <= self.reach:
            raise ValueError(
                f"min_context must be 0 or above S + W + a = {self.reach}, below which no "
                f"context is cropped (see effective_min_context), got {self.min_context}"
            )

    @classmethod
    def derive(
        cls,
        window_size: int,
        column_tokens: Iterable[int],
        sink_tokens: int = 0,
        min_context: int = 0,
    ) -> WindowSpec:
        """The shape of a window over groups whose table columns cover ``column_tokens``
        tokens each: the alignment their lcm, ``draft_attention_sinks`` rounded up to it,
        and ``draft_window_min_context`` as applied (0 where it changes nothing)."""
        alignment = lcm_alignment(list(column_tokens))
        sink_size = align_sinks(sink_tokens, alignment)
        min_context = effective_min_context(min_context, window_size, alignment, sink_size)
        return cls(window_size, alignment, sink_size, min_context)

    @property
    def reach(self) -> int:
        """``S + W + a``: the shortest context a window without a threshold crops."""
        return self.sink_size + self.window_size + self.alignment

    def read_cap(self, query_len: int = 0) -> int:
        """The longest KV length a pass of ``query_len`` query tokens per request reads:
        ``S + max(W, q) + a - 1``, or ``M - 1`` (a whole context below the threshold)
        where that is longer."""
        cap = self.sink_size + max(self.window_size, query_len) + self.alignment - 1
        return max(cap, self.min_context - 1)

    @property
    def max_read_len(self) -> int:
        """The longest KV length any one-token-per-request pass reads: ``S + W + a - 1``,
        or ``M - 1``."""
        return self.read_cap()

    def crops_within(self, max_model_len: int) -> bool:
        """Whether a request within ``max_model_len`` is ever cropped: a context reaching
        ``S + W + a``, and the threshold if any."""
        return self.reach <= max_model_len and self.min_context <= max_model_len

    def retained_tokens(self, block_size: int) -> int:
        """``N = W + a - b``: the fewest tokens below a pass's first query position that a
        group of ``block_size``-token columns must keep so that no read of a plain window
        (no sinks, no threshold) reaches a block vLLM's sliding-window KV cache freed or
        nulled (design doc, section 3.4)."""
        if self.sink_size or self.min_context:
            raise ValueError("retained_tokens is defined for a window without sinks or threshold")
        return self.window_size + self.alignment - self._divisor(block_size)

    def max_window_blocks(self, block_size: int) -> int:
        """Width of a cropped table whose columns are blocks of ``block_size`` tokens."""
        return ceil_div(self.max_read_len, self._divisor(block_size))

    def _divisor(self, block_size: int) -> int:
        if self.alignment % block_size != 0:
            raise ValueError(
                f"block_size {block_size} does not divide the alignment {self.alignment}"
            )
        return block_size


def window_seq_lens(
    # [n] int32, device or host
    seq_lens: torch.Tensor,
    spec: WindowSpec,
    *,
    # [n] int32, same device as seq_lens
    skip_out: torch.Tensor,
    # [n] int32, same device as seq_lens
    out: torch.Tensor,
    # [n] int32, same device as seq_lens: tokens each request queries in this pass
    query_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write each request's ``skip`` (the tokens left out between its sinks and its window;
    without sinks, the window start) into ``skip_out`` and the length its attention reads
    (sinks and window) into ``out``.

    Works the same on the device ``seq_lens`` and on an exact host mirror of it, which is
    how invariant 2 holds without a device-to-host copy.

    With ``query_lens`` (a pass whose queries are several tokens, such as a draft prefill
    over a verify chunk or a prompt chunk), the start is also kept at or before
    ``floor((L - q) / a) * a``, so every query token reads at least itself: a chunk
    longer than the window keeps the whole chunk, and reads at most ``S + q + a - 1``.
    """
    sinks = spec.sink_size
    if spec.min_context:
        # skip = 0 below the threshold: [L >= M] * L - W - S, floored at 0 below, is
        # L - W - S at or above it and negative under it.
        torch.add(seq_lens, 1 - spec.min_context, out=skip_out)
        skip_out.clamp_(min=0, max=1).mul_(seq_lens).sub_(spec.window_size + sinks)
    else:
        torch.add(seq_lens, -spec.window_size - sinks, out=skip_out)
    skip_out.clamp_(min=0)
    skip_out.div_(spec.alignment, rounding_mode="floor")
    skip_out.mul_(spec.alignment)
    if query_lens is not None:
        # `out` holds the skip of the latest start that still covers the first query token.
        torch.sub(seq_lens, query_lens, out=out)
        if sinks:
            out.sub_(sinks).clamp_(min=0)
        out.div_(spec.alignment, rounding_mode="floor").mul_(spec.alignment)
        torch.minimum(skip_out, out, out=skip_out)
    torch.sub(seq_lens, skip_out, out=out)
    return out


def seq_lens_upper_bound(
    # [n] int32, host
    upper_bound: torch.Tensor,
    spec: WindowSpec,
    *,
    out: torch.Tensor,
    step: int = 0,
    # [n] int32, host: as for window_seq_lens
    query_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The tightest host bound of what the windowed metadata reads, from a bound of ``L``.

    ``step`` is what the caller adds to the result afterwards (vLLM's metadata builder
    adds its ``step`` to ``seq_lens_cpu_upper_bound``): for every row, the result plus
    ``step`` is at least ``windowed`` for every ``L <= upper_bound + step``. With
    ``query_lens`` a chunk longer than the window may read up to ``S + q + a - 1``. ``out``
    may alias ``upper_bound``. Host only: it may allocate host tensors.
    """
    cap = spec.max_read_len - step
    if cap < 0:
        raise ValueError(
            f"step {step} exceeds what a window of {spec.window_size} tokens "
            f"(alignment {spec.alignment}) can read"
        )
    if query_lens is None:
        return torch.clamp(upper_bound, max=cap, out=out)
    caps = query_lens.clamp(min=spec.window_size) + (spec.sink_size + spec.alignment - 1 - step)
    if spec.min_context:
        caps.clamp_(min=spec.min_context - 1 - step)
    return torch.minimum(upper_bound, caps, out=out)


class BlockTableWindow:
    """The cropped block table of one KV-cache group, in persistent buffers.

    The attention kernel reads ``block_table`` through graph replays, so it is allocated
    once at ``[max_num_reqs, max_window_blocks]`` and only ever written in place.
    """

    def __init__(
        self,
        spec: WindowSpec,
        block_size: int,
        max_num_reqs: int,
        device: torch.device | str,
        width: int | None = None,
    ) -> None:
        """``width`` (default: ``spec.max_window_blocks(block_size)``) may be rounded up
        for a kernel's padding, or capped at the full table's width, which no window
        reads past."""
        self.spec = spec
        self.block_size = block_size
        self.max_window_blocks = width or spec.max_window_blocks(block_size)
        shape = (max_num_reqs, self.max_window_blocks)
        # [max_num_reqs, max_window_blocks] int32: the persistent clone the draft reads.
        self.block_table = torch.zeros(shape, dtype=torch.int32, device=device)
        # [max_window_blocks] int64: column offsets inside the window.
        self._cols = torch.arange(self.max_window_blocks, dtype=torch.int64, device=device)
        # Sink columns of the clone: the full table's first columns, in every row.
        self._num_sink_cols = min(spec.sink_size // block_size, self.max_window_blocks)
        # [max_num_reqs, max_window_blocks] int64: source column of each clone entry.
        self._src_cols = torch.zeros(shape, dtype=torch.int64, device=device)
        # [max_num_reqs, max_window_blocks] bool: clone entries past `needed`.
        self._unused = torch.zeros(shape, dtype=torch.bool, device=device)
        # [max_num_reqs] int64: full-table columns left out between the sink columns and
        # the window (without sinks: the window's first column). The index math runs in
        # int64, the gather's index dtype, so no op promotes into a temporary.
        self.skip_blocks = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        # [max_num_reqs] int64: columns the pass reads, within the table.
        self.needed = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)

    def gather(
        self,
        # [>= num_reqs, num_cols] int32: the group's full table (never written)
        full_block_table: torch.Tensor,
        # [>= num_reqs] int32: skip, from window_seq_lens
        skip: torch.Tensor,
        # [>= num_reqs] int32: from window_seq_lens
        windowed_seq_lens: torch.Tensor,
        num_reqs: int,
    ) -> torch.Tensor:
        """Fill the clone's first ``num_reqs`` rows; return that persistent view.

        Clone column ``c`` holds full column ``c`` for a sink column and ``c + skip / b``
        past them. Columns at or past ``needed`` and past the full table's width are zero
        (the null block), and the gather index is clamped so it never leaves the table.
        """
        b = self.block_size
        num_cols = full_block_table.shape[1]
        skip_blocks = self.skip_blocks[:num_reqs]
        needed = self.needed[:num_reqs]
        src_cols = self._src_cols[:num_reqs]
        unused = self._unused[:num_reqs]
        out = self.block_table[:num_reqs]

        skip_blocks.copy_(skip[:num_reqs]).div_(b, rounding_mode="floor")
        # needed = ceil(windowed / b), 0 for a padded row.
        needed.copy_(windowed_seq_lens[:num_reqs])
        needed.add_(b - 1).div_(b, rounding_mode="floor")
        # Columns past the full table's width do not exist: count only those inside it
        # (the last one read is column needed - 1 + skip / b).
        needed.add_(skip_blocks).clamp_(max=num_cols).sub_(skip_blocks).clamp_(min=0)

        torch.add(skip_blocks.unsqueeze(1), self._cols.unsqueeze(0), out=src_cols)
        if self._num_sink_cols:
            sink_cols = self._num_sink_cols
            src_cols[:, :sink_cols].copy_(self._cols[:sink_cols].unsqueeze(0))
        src_cols.clamp_(max=num_cols - 1)
        torch.gather(full_block_table[:num_reqs], 1, src_cols, out=out)
        torch.ge(self._cols.unsqueeze(0), needed.unsqueeze(1), out=unused)
        out.masked_fill_(unused, 0)
        return out
