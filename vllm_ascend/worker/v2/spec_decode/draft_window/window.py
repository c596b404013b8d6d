# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Draft window arithmetic (pure torch). Slot mappings are never windowed; every KV length
the kernel reads comes from one ``skip`` per request. With ``L`` the length, ``W`` the
window, ``a`` the alignment (lcm of block sizes) and ``S`` the sinks (a multiple of ``a``):

    skip     = floor(max(L - W - S, 0) / a) * a     (0 where L < draft_window_min_context)
    windowed = L - skip                             (at most WindowSpec.read_cap())

The cropped table is the sink columns followed by the columns from token ``S + skip``; keys
are cached rotated, so skipping the gap is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch


def lcm_alignment(block_sizes: Sequence[int]) -> int:
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


def effective_min_context(min_context: int, window_size: int, alignment: int, sink_size: int = 0) -> int:
    """0 at or below ``S + W + a``, where no context is cropped anyway."""
    if min_context < 0:
        raise ValueError(f"min_context must be >= 0 tokens, got {min_context}")
    return min_context if min_context > sink_size + window_size + alignment else 0


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


@dataclass(frozen=True)
class WindowSpec:
    """Static shape of one window (``M`` = 0: every context is windowed)."""

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
        """Window over groups whose table columns cover ``column_tokens`` tokens each."""
        alignment = lcm_alignment(list(column_tokens))
        sink_size = align_sinks(sink_tokens, alignment)
        min_context = effective_min_context(min_context, window_size, alignment, sink_size)
        return cls(window_size, alignment, sink_size, min_context)

    @property
    def reach(self) -> int:
        """``S + W + a``: the shortest context that is cropped."""
        return self.sink_size + self.window_size + self.alignment

    def read_cap(self, query_len: int = 0) -> int:
        """Longest KV length a pass of ``query_len`` queries per request reads."""
        cap = self.sink_size + max(self.window_size, query_len) + self.alignment - 1
        return max(cap, self.min_context - 1)

    @property
    def max_read_len(self) -> int:
        return self.read_cap()

    def retained_tokens(self, block_size: int) -> int:
        """``W + a - b``: the sliding window a draft KV cache needs to keep every read."""
        if self.sink_size or self.min_context:
            raise ValueError("retained_tokens is defined for a window without sinks or threshold")
        return self.window_size + self.alignment - self._divisor(block_size)

    def max_window_blocks(self, block_size: int) -> int:
        return ceil_div(self.max_read_len, self._divisor(block_size))

    def _divisor(self, block_size: int) -> int:
        if self.alignment % block_size != 0:
            raise ValueError(f"block_size {block_size} does not divide the alignment {self.alignment}")
        return block_size


def window_seq_lens(
    seq_lens: torch.Tensor,
    spec: WindowSpec,
    *,
    skip_out: torch.Tensor,
    out: torch.Tensor,
    query_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write each request's ``skip`` into ``skip_out`` and windowed length into ``out``;
    with ``query_lens`` every query token still reads itself."""
    sinks = spec.sink_size
    if spec.min_context:
        # [L >= M] * L - W - S: negative below the threshold, so skip = 0 there.
        torch.add(seq_lens, 1 - spec.min_context, out=skip_out)
        skip_out.clamp_(min=0, max=1).mul_(seq_lens).sub_(spec.window_size + sinks)
    else:
        torch.add(seq_lens, -spec.window_size - sinks, out=skip_out)
    skip_out.clamp_(min=0)
    skip_out.div_(spec.alignment, rounding_mode="floor")
    skip_out.mul_(spec.alignment)
    if query_lens is not None:
        torch.sub(seq_lens, query_lens, out=out)
        if sinks:
            out.sub_(sinks).clamp_(min=0)
        out.div_(spec.alignment, rounding_mode="floor").mul_(spec.alignment)
        torch.minimum(skip_out, out, out=skip_out)
    torch.sub(seq_lens, skip_out, out=out)
    return out


def seq_lens_upper_bound(
    upper_bound: torch.Tensor,
    spec: WindowSpec,
    *,
    out: torch.Tensor,
    step: int = 0,
    query_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Smallest host bound of the windowed lengths once the builder adds ``step``."""
    cap = spec.max_read_len - step
    if cap < 0:
        raise ValueError(
            f"step {step} exceeds what a window of {spec.window_size} tokens (alignment {spec.alignment}) can read"
        )
    if query_lens is None:
        return torch.clamp(upper_bound, max=cap, out=out)
    caps = query_lens.clamp(min=spec.window_size) + (spec.sink_size + spec.alignment - 1 - step)
    if spec.min_context:
        caps.clamp_(min=spec.min_context - 1 - step)
    return torch.minimum(upper_bound, caps, out=out)


def cropped_table_width(
    spec: WindowSpec,
    block_size: int,
    full_width: int,
    max_query_len: int,
    table_width: Callable[[int, int], int] | None = None,
) -> int:
    """Columns a pass reads, rounded up as vLLM rounds its tables, at most ``full_width``."""
    needed = ceil_div(spec.read_cap(max_query_len), block_size)
    if table_width is not None:
        needed = table_width(needed, block_size)
    return min(needed, full_width)


class BlockTableWindow:
    """Cropped block table of one KV cache group, allocated once and written in place."""

    def __init__(
        self,
        spec: WindowSpec,
        block_size: int,
        max_num_reqs: int,
        device: torch.device | str,
        width: int | None = None,
    ) -> None:
        self.spec = spec
        self.block_size = block_size
        self.max_window_blocks = width or spec.max_window_blocks(block_size)
        shape = (max_num_reqs, self.max_window_blocks)
        self.block_table = torch.zeros(shape, dtype=torch.int32, device=device)
        self._cols = torch.arange(self.max_window_blocks, dtype=torch.int64, device=device)
        self._num_sink_cols = min(spec.sink_size // block_size, self.max_window_blocks)
        self._src_cols = torch.zeros(shape, dtype=torch.int64, device=device)
        self._unused = torch.zeros(shape, dtype=torch.bool, device=device)
        # int64, the gather's index dtype, so no op allocates a temporary.
        self.skip_blocks = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.needed = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)

    def gather(
        self,
        full_block_table: torch.Tensor,
        skip: torch.Tensor,
        windowed_seq_lens: torch.Tensor,
        num_reqs: int,
    ) -> torch.Tensor:
        """Fill the first ``num_reqs`` rows; columns not read are 0 (null block)."""
        b = self.block_size
        num_cols = full_block_table.shape[1]
        skip_blocks = self.skip_blocks[:num_reqs]
        needed = self.needed[:num_reqs]
        src_cols = self._src_cols[:num_reqs]
        unused = self._unused[:num_reqs]
        out = self.block_table[:num_reqs]

        skip_blocks.copy_(skip[:num_reqs]).div_(b, rounding_mode="floor")
        needed.copy_(windowed_seq_lens[:num_reqs])
        needed.add_(b - 1).div_(b, rounding_mode="floor")
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
