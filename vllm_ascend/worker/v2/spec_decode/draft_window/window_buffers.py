# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Persistent windowed inputs of one Model Runner V2 speculator and their refresh."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.views import BlockTablesView, InputBuffersView
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    cropped_table_width,
    seq_lens_upper_bound,
    window_seq_lens,
)

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
    from vllm.v1.worker.utils import AttentionGroup

    from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout
    from vllm_ascend.worker.v2.spec_decode.draft_window.groups import GroupDecision
    from vllm_ascend.worker.v2.spec_decode.draft_window.window import WindowSpec


@dataclass(frozen=True)
class ActualSeqLens:
    """The host-computed lengths the kernel takes, the window start's source: the host bound
    plus the step (``from_bound``), else the target's length plus each decode step."""

    source: torch.Tensor
    max_model_len: int
    from_bound: bool = False


@dataclass(frozen=True)
class Plan:
    """One speculator's window: its shape and what its persistent buffers are sized by."""

    spec: WindowSpec
    # Per windowed group: a request's tokens per table column (under DCP every rank's: dcp.py).
    group_units: Mapping[int, int]
    # Under decode context parallelism: this rank's layout, read once at start-up.
    layout: DcpLayout | None = None
    # DFlash/DSpark: the query stretch every pass reads; an EAGLE decode step: 1.
    max_query_len: int = 1
    # EAGLE's draft prefill: its longest query chunk (wider tables of its own), else None.
    max_chunk_len: int | None = None
    actual: ActualSeqLens | None = None
    # Every draft KV-cache group's decision (groups.py); those not windowed keep vLLM's inputs.
    decisions: tuple[GroupDecision, ...] = ()
    # draft_attention_sinks as asked (``spec.sink_size``: rounded up to the alignment).
    sink_tokens: int = 0

    @property
    def unwindowed_group_ids(self) -> list[int]:
        return [d.group_id for d in self.decisions if not d.windowed]


class WindowNotInPathError(RuntimeError):
    """The draft's attention was about to read outside the window."""


def not_in_path(what: str) -> WindowNotInPathError:
    return WindowNotInPathError(
        f"draft window not in the path: {what}. Windowing it is not supported: remove "
        f"draft_window_size, or report the path."
    )


class RefreshKernel(Protocol):
    """A refresh in one launch that replaces the torch path, attached by whoever has one."""

    def launch(
        self,
        num_reqs_padded: int,
        source: torch.Tensor,
        query_start_loc: torch.Tensor | None,
        actual_step: int | None,
    ) -> None:
        """Write what ``DraftWindow.refresh`` writes, for the same arguments."""


class BuilderCheck(Protocol):
    """A check of the window's metadata builders, attached by whoever wants one."""

    def capture_on(self, path: str) -> None:
        """Every build under ``path`` is a graph capture's."""


@dataclass
class ProposeState:
    """State shared by a speculator's calls within one propose."""

    prefill_batch: InputBatch | None = None
    prefill_windowed: bool = False
    capturing: bool = False
    # Later decode steps that reuse the metadata being built.
    extra_steps: int = 0
    num_builds: int = 0


class DraftWindow:
    def __init__(
        self,
        plan: Plan,
        input_buffers: InputBuffers,
        block_tables: BlockTables,
        max_num_reqs: int,
        device: torch.device,
        attn_groups: list[list[AttentionGroup]] | None = None,
        host_mirror: tuple[str, str] | None = None,
        table_width: Callable[[int, int], int] | None = None,
    ) -> None:
        self.plan = plan
        self._table_width = table_width
        self.spec = plan.spec
        self.group_block_sizes = dict(plan.group_units)
        self.dcp = plan.layout
        self.actual = plan.actual
        self._allocate(max_num_reqs, device, input_buffers)
        # A one-launch refresh (None: the torch path).
        self.refresh_kernel: RefreshKernel | None = None
        has_mirror = host_mirror is not None and hasattr(input_buffers, host_mirror[0])
        self.seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32) if has_mirror else None
        self.path: list[str] = []
        self.windowed_attn_groups: list[list[AttentionGroup]] | None = None
        self.unwindowed_attn_groups: list[list[AttentionGroup]] | None = None
        self._unwindowed_builders: list[object] = []
        if plan.unwindowed_group_ids:
            assert attn_groups is not None, "the groups not windowed need their builders"
            self._keep_unwindowed_groups(attn_groups, plan.unwindowed_group_ids)
        # The slot mapping passed to the build in progress, if any (never windowed).
        self.build_slot_mappings: torch.Tensor | None = None
        # A check of the builders (None: none attached).
        self.path_check: BuilderCheck | None = None
        self.propose = ProposeState()
        full_widths = {g: block_tables.input_block_tables[g].shape[1] for g in plan.group_units}
        self.windows = self._tables(full_widths, max_num_reqs, device, plan.max_query_len)
        # Wider tables for a draft prefill over chunks longer than a decode step.
        self.chunk_windows = self.windows
        if plan.max_chunk_len:
            self.chunk_windows = self._tables(full_widths, max_num_reqs, device, plan.max_chunk_len)
        self.input_buffers = InputBuffersView(input_buffers, self.seq_lens, host_mirror, self.seq_lens_cpu)
        self.block_tables = BlockTablesView(block_tables, self.windows)

    def _tables(
        self, full_widths: dict[int, int], max_num_reqs: int, device: torch.device, query: int
    ) -> dict[int, BlockTableWindow]:
        return {
            g: BlockTableWindow(
                self.spec,
                b,
                max_num_reqs,
                device,
                width=cropped_table_width(self.spec, b, full_widths[g], query, self._table_width),
            )
            for g, b in self.group_block_sizes.items()
        }

    def _allocate(self, max_num_reqs: int, device: torch.device, input_buffers: InputBuffers) -> None:
        # Graphs capture these addresses: write them in place only.
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.window_skip = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.query_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu_upper_bound = torch.zeros(max_num_reqs, dtype=torch.int32)
        # Rows of the build in progress whose host bound is their exact windowed length.
        self.exact_host_rows: torch.Tensor | None = None
        self.actual_windowed = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.dcp_local_seq_lens = self.dcp_scratch = None
        if self.dcp:
            self.dcp_local_seq_lens, self.dcp_scratch = torch.zeros((2, max_num_reqs), dtype=torch.int32, device=device)
        own = getattr(input_buffers, "dcp_local_seq_lens", None)
        self.dcp_local_buffers = [b for b in (self.dcp_local_seq_lens, own) if b is not None]
        self.host_skip = torch.zeros(max_num_reqs, dtype=torch.int32)

    def _keep_unwindowed_groups(self, attn_groups: list[list[AttentionGroup]], group_ids: Sequence[int]) -> None:
        """Build the groups ``group_ids`` from vLLM's own lengths (on a graph capture's path too)."""
        kept = set(group_ids)
        self.windowed_attn_groups = [[] if g in kept else gs for g, gs in enumerate(attn_groups)]
        self.unwindowed_attn_groups = [gs if g in kept else [] for g, gs in enumerate(attn_groups)]
        self._unwindowed_builders = [b for g in group_ids for group in attn_groups[g] for b in group.metadata_builders]

    @contextmanager
    def _unwindowed_builders_on_vllms_lengths(self) -> Iterator[None]:
        """While inside, the builders of the groups not windowed read vLLM's own ``seq_lens``."""
        replaced = []
        for builder in self._unwindowed_builders:
            for name, position in (("build", 1), ("build_for_cudagraph_capture", 0)):
                real = getattr(builder, name, None)
                if callable(real):
                    replaced.append((builder, name, builder.__dict__.get(name)))
                    setattr(builder, name, self._with_vllms_seq_lens(real, position))
        try:
            yield
        finally:
            for builder, name, own in reversed(replaced):
                if own is None:
                    delattr(builder, name)
                else:
                    setattr(builder, name, own)

    def _with_vllms_seq_lens(self, real: Callable[..., object], position: int) -> Callable[..., object]:
        windowed, vllms = self.seq_lens, self.input_buffers.base.seq_lens

        @functools.wraps(real)
        def build(*args: Any, **kwargs: Any) -> object:
            in_kwargs = "common_attn_metadata" in kwargs
            cm = kwargs["common_attn_metadata"] if in_kwargs else args[position]
            if cm.seq_lens.data_ptr() == windowed.data_ptr():
                cm = dataclasses.replace(cm, seq_lens=vllms[: cm.seq_lens.shape[0]])
                if in_kwargs:
                    kwargs["common_attn_metadata"] = cm
                else:
                    args = (*args[:position], cm, *args[position + 1 :])
            return real(*args, **kwargs)

        return build

    def refresh(
        self,
        num_reqs_padded: int,
        seq_lens: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
        actual_step: int | None = None,
    ) -> None:
        """Window the first ``num_reqs_padded`` rows' lengths and tables on the device (the
        start from the kernel's actual lengths with ``actual_step``)."""
        n = num_reqs_padded
        source = self.input_buffers.base.seq_lens if seq_lens is None else seq_lens
        actual = self.actual if actual_step is not None else None
        windows = self.windows if query_start_loc is None else self.chunk_windows
        self.block_tables.windows = windows
        if self.refresh_kernel is not None:
            self.refresh_kernel.launch(n, source, query_start_loc, actual_step)
            return
        query_lens = None
        if query_start_loc is not None:
            query_lens = self.query_lens[:n]
            torch.sub(query_start_loc[1 : n + 1], query_start_loc[:n], out=query_lens)
        read_lens = self.seq_lens
        if actual is None:
            window_seq_lens(
                source[:n],
                self.spec,
                skip_out=self.window_skip[:n],
                out=self.seq_lens[:n],
                query_lens=query_lens,
            )
        else:
            assert query_lens is None
            actual_lens = self.actual_windowed[:n]
            torch.add(actual.source[:n], actual_step, out=actual_lens)
            actual_lens.clamp_(max=actual.max_model_len)
            window_seq_lens(actual_lens, self.spec, skip_out=self.window_skip[:n], out=actual_lens)
            torch.sub(source[:n], self.window_skip[:n], out=self.seq_lens[:n])
            read_lens = self.actual_windowed
        full_tables = self.block_tables.base.input_block_tables
        for g, window in windows.items():
            window.gather(full_tables[g], self.window_skip, read_lens, n)

    def window_actual_seq_lens(self, lengths: torch.Tensor) -> torch.Tensor:
        """Window the kernel's actual lengths on the host, in place."""
        n = lengths.shape[0]
        window_seq_lens(lengths, self.spec, skip_out=self.host_skip[:n], out=lengths)
        return lengths

    def host_upper_bound(
        self,
        seq_lens_cpu_upper_bound: torch.Tensor,
        num_reqs: int,
        step: int,
        query_lens_cpu: torch.Tensor | None = None,
        extra_steps: int = 0,
    ) -> torch.Tensor:
        """Host bound of the windowed lengths, also for ``extra_steps`` later steps."""
        out = self.seq_lens_cpu_upper_bound[:num_reqs]
        seq_lens_upper_bound(
            seq_lens_cpu_upper_bound[:num_reqs],
            self.spec,
            out=out,
            step=step,
            query_lens=None if query_lens_cpu is None else query_lens_cpu[:num_reqs],
        )
        if extra_steps:
            # min(U + extra, cap) = min(min(U, cap) + extra, cap), cap = S + W + a - 1 - step.
            out.add_(extra_steps).clamp_(max=self.spec.max_read_len - step)
        return self.seq_lens_cpu_upper_bound

    def actual_host_bound(self, seq_lens_cpu_upper_bound: torch.Tensor, num_reqs: int, step: int) -> torch.Tensor:
        """Host lengths that, plus ``step``, are the device's windowed actual lengths."""
        assert self.actual is not None
        out = self.seq_lens_cpu_upper_bound[:num_reqs]
        torch.add(seq_lens_cpu_upper_bound[:num_reqs], step, out=out)
        out.clamp_(max=self.actual.max_model_len)
        self.window_actual_seq_lens(out).sub_(step)
        return self.seq_lens_cpu_upper_bound

    @contextmanager
    def swapped_into(
        self,
        speculator: DraftModelSpeculator,
        path: str,
        attn_groups: list[list[AttentionGroup]] | None = None,
        max_query_len: int = 1,
    ) -> Iterator[None]:
        """Point the speculator at the windowed views (and ``attn_groups``) until exit."""
        saved = (speculator.input_buffers, speculator.block_tables, speculator.draft_max_seq_len)
        saved_groups = speculator.attn_groups
        speculator.input_buffers = self.input_buffers
        speculator.block_tables = self.block_tables
        speculator.draft_max_seq_len = min(saved[2], self.spec.read_cap(max_query_len))
        if attn_groups is not None:
            speculator.attn_groups = attn_groups
        try:
            with self.on_path(path):
                yield
        finally:
            speculator.input_buffers, speculator.block_tables, speculator.draft_max_seq_len = saved
            speculator.attn_groups = saved_groups

    @contextmanager
    def unwindowed_only(self, speculator: DraftModelSpeculator) -> Iterator[None]:
        saved = speculator.attn_groups
        speculator.attn_groups = self.unwindowed_attn_groups
        try:
            yield
        finally:
            speculator.attn_groups = saved

    @contextmanager
    def on_path(self, path: str) -> Iterator[None]:
        self.path.append(path)
        try:
            with self._unwindowed_builders_on_vllms_lengths():
                yield
        finally:
            self.path.pop()
