# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The draft window of one Model Runner V2 speculator: its persistent buffers, made once from
its plan (``plan.py``) and complete when made, and the refresh that windows them each pass.

vLLM's ``DraftModelSpeculator._build_attn_metadata`` reads the draft's KV lengths from
``self.input_buffers.seq_lens`` and its block tables from
``self.block_tables.input_block_tables``. The window hands it views of those two objects
(``views.py``) in which the draft's lengths and the draft groups' tables are its own
persistent windowed buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.fused import FusedRefresh
from vllm_ascend.worker.v2.spec_decode.draft_window.plan import Plan
from vllm_ascend.worker.v2.spec_decode.draft_window.views import (
    BlockTablesView,
    InputBuffersView,
    cropped_table_width,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    seq_lens_upper_bound,
    window_seq_lens,
)

if TYPE_CHECKING:
    from vllm_ascend.worker.v2.spec_decode.draft_window.path_check import PathCheck


@dataclass
class ProposeState:
    """A speculator's state within one propose: the target's batch its draft prefill reads,
    whether that prefill went through the window, whether a graph capture is running, and
    how many later decode steps reuse the metadata being built."""

    prefill_batch: Any = None
    prefill_windowed: bool = False
    capturing: bool = False
    extra_steps: int = 0
    # Windowed builds so far (the first one is said once).
    num_builds: int = 0


class DraftWindow:
    """Persistent windowed inputs of one speculator's draft attention, created once."""

    def __init__(
        self,
        plan: Plan,
        input_buffers: Any,
        block_tables: Any,
        max_num_reqs: int,
        device: torch.device,
        attn_groups: list[list[Any]] | None = None,
        host_mirror: tuple[str, str] | None = None,
        table_width: Callable[[int, int], int] | None = None,
    ) -> None:
        """``attn_groups``: the speculator's, split here by ``plan.decisions`` (the groups
        not windowed keep vLLM's own inputs). ``host_mirror``: the names of the exact host
        mirror of ``seq_lens`` the release's input buffers keep (``release.Release``).
        ``table_width``: the release's block-table width rounding, which the cropped tables
        follow (None: not rounded)."""
        self.plan = plan
        self._table_width = table_width
        self.spec = plan.spec
        # Per windowed draft group: a request's tokens per table column.
        self.group_block_sizes = dict(plan.group_units)
        # Under DCP: this rank's layout (else None).
        self.dcp = plan.layout
        self.actual = plan.actual
        full_widths = {g: block_tables.input_block_tables[g].shape[1] for g in plan.group_units}
        # Per draft group: the cropped tables every step reads (graphs capture these) ...
        self.windows = self._tables(full_widths, max_num_reqs, device, plan.max_query_len)
        # ... and, for a draft prefill over long chunks, wider ones used only there.
        self.chunk_windows = self.windows
        if plan.max_chunk_len:
            self.chunk_windows = self._tables(full_widths, max_num_reqs, device, plan.max_chunk_len)
        self._allocate(max_num_reqs, device, input_buffers)
        # One-launch refreshes (fused.py) of the per-step tables and of a draft prefill's
        # wider ones; None: the torch path (fused_check.py decides).
        self.fused_steps: FusedRefresh | None = None
        self.fused_chunks: FusedRefresh | None = None
        # [max_num_reqs] int32, host: the windowed lengths' exact mirror (InputBuffersView).
        has_mirror = host_mirror is not None and hasattr(input_buffers, host_mirror[0])
        self.seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32) if has_mirror else None
        self.input_buffers = InputBuffersView(
            input_buffers, self.seq_lens, host_mirror, self.seq_lens_cpu
        )
        self.block_tables = BlockTablesView(block_tables, self.windows)
        # The window's calls running now (hooks or explicit calls), outermost first: a
        # build's path (path_check.py).
        self.path: list[str] = []
        # The speculator's attention groups split by the plan: an eager build runs vLLM's
        # own build once over each (None while every draft group is windowed).
        self.windowed_attn_groups: list[list[Any]] | None = None
        self.unwindowed_attn_groups: list[list[Any]] | None = None
        if plan.unwindowed_group_ids:
            self._keep_unwindowed_groups(attn_groups, plan.unwindowed_group_ids)
        # The slot mapping handed to the build in progress, where its caller passes one (a
        # draft model's prefill writes through a buffer of its own): vLLM's, never windowed.
        self.build_slot_mappings: torch.Tensor | None = None
        # The run-time check of the speculator's builders (set by its creator, if any).
        self.path_check: PathCheck | None = None
        # What the speculator's calls within one propose tell each other.
        self.propose = ProposeState()

    def _tables(
        self, full_widths: dict[int, int], max_num_reqs: int, device: torch.device, query: int
    ) -> dict[int, BlockTableWindow]:
        """One cropped table per windowed group, wide enough for passes of ``query`` query
        tokens per request."""
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

    def _allocate(self, max_num_reqs: int, device: torch.device, input_buffers: Any) -> None:
        """The persistent lengths a refresh writes, sized once."""
        # [max_num_reqs] int32: the windowed seq_lens the draft's attention reads.
        # NOTE: graphs capture its address; it is only ever written in place.
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        # [max_num_reqs] int32: each request's tokens left out between its sinks and its
        # window (without sinks: the window start), a multiple of the alignment.
        self.window_skip = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        # [max_num_reqs] int32: query tokens per request of a multi-token pass.
        self.query_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        # [max_num_reqs] int32, host: the windowed seq_lens_cpu_upper_bound.
        self.seq_lens_cpu_upper_bound = torch.zeros(max_num_reqs, dtype=torch.int32)
        # [n] bool, host, or None: the rows of the build in progress whose host bound the
        # window made their exact windowed length (a draft prefill's prefilling rows); the
        # path check makes sure a builder taking the bound as exact reads only those.
        self.exact_host_rows: torch.Tensor | None = None
        # [max_num_reqs] int32: the actual lengths of the pass in progress, windowed in place.
        self.actual_windowed = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        # Under DCP, [max_num_reqs] int32: a draft prefill's DCP-local lengths (else the
        # target's), and scratch. A build may hand a kernel these or the draft's own, which
        # vLLM fills from the windowed lengths (the path check makes sure).
        self.dcp_local_seq_lens = self.dcp_scratch = None
        if self.dcp:
            self.dcp_local_seq_lens, self.dcp_scratch = torch.zeros(
                (2, max_num_reqs), dtype=torch.int32, device=device
            )
        own = getattr(input_buffers, "dcp_local_seq_lens", None)
        self.dcp_local_buffers = [b for b in (self.dcp_local_seq_lens, own) if b is not None]
        # [max_num_reqs] int32, host: scratch for windowing host lengths (actual lengths).
        self.host_skip = torch.zeros(max_num_reqs, dtype=torch.int32)

    def _keep_unwindowed_groups(
        self, attn_groups: list[list[Any]], group_ids: Sequence[int]
    ) -> None:
        """Keep what vLLM builds for the draft groups ``group_ids``: their builders must see
        vLLM's own lengths and tables, never the window's.

        vLLM builds every group from one ``seq_lens``. An eager build therefore runs vLLM's
        own build twice (the build hook): over the windowed groups through the views, and
        over these with vLLM's inputs. A graph capture builds all groups at once through the
        views, so these groups' builders are handed vLLM's own device ``seq_lens`` back (the
        views give them vLLM's tables already, and a capture's host lengths are vLLM's).
        """
        kept = set(group_ids)
        self.windowed_attn_groups = [[] if g in kept else gs for g, gs in enumerate(attn_groups)]
        self.unwindowed_attn_groups = [gs if g in kept else [] for g, gs in enumerate(attn_groups)]
        for g in group_ids:
            for group in attn_groups[g]:
                for builder in group.metadata_builders:
                    for name, position in (("build", 1), ("build_for_cudagraph_capture", 0)):
                        real = getattr(builder, name, None)
                        if callable(real):
                            setattr(builder, name, self._with_vllms_seq_lens(real, position))

    def _with_vllms_seq_lens(self, real: Any, position: int) -> Any:
        windowed, vllms = self.seq_lens, self.input_buffers.base.seq_lens

        def build(*args: Any, **kwargs: Any) -> Any:
            in_kwargs = "common_attn_metadata" in kwargs
            cm = kwargs["common_attn_metadata"] if in_kwargs else args[position]
            if cm.seq_lens.data_ptr() == windowed.data_ptr():
                cm = dataclasses.replace(cm, seq_lens=vllms[: cm.seq_lens.shape[0]])
                if in_kwargs:
                    kwargs["common_attn_metadata"] = cm
                else:
                    args = (*args[:position], cm, *args[position + 1 :])
            return real(*args, **kwargs)

        build.__wrapped__ = real
        return build

    def refresh(
        self,
        num_reqs_padded: int,
        seq_lens: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
        actual_step: int | None = None,
    ) -> None:
        """Window the first ``num_reqs_padded`` rows on the device: lengths and tables.

        ``seq_lens`` defaults to the draft's own; a draft prefill passes the target's, with
        its ``query_start_loc`` so that every query token stays inside its window.
        ``actual_step`` (with ``plan.actual`` set): the kernel takes
        ``min(actual.source + actual_step, actual.max_model_len)`` as its actual lengths
        instead of the draft's own, so the window start comes from those, and the draft's
        own length and the cropped table follow the same start (invariant 2: one start per
        request).
        Device ops into persistent buffers only, so it may run inside a graph capture.
        """
        n = num_reqs_padded
        source = self.input_buffers.base.seq_lens if seq_lens is None else seq_lens
        actual = self.actual if actual_step is not None else None
        windows = self.windows if query_start_loc is None else self.chunk_windows
        # The views hand the builder the tables this pass fills.
        self.block_tables.windows = windows
        fused = self.fused_steps if query_start_loc is None else self.fused_chunks
        if fused is not None:
            fused.launch(
                n,
                source,
                query_start_loc,
                actual_source=None if actual is None else actual.source,
                actual_step=actual_step or 0,
                max_model_len=0 if actual is None else actual.max_model_len,
            )
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
            # The table covers what the kernel's actual lengths read.
            read_lens = self.actual_windowed
        full_tables = self.block_tables.base.input_block_tables
        for g, window in windows.items():
            window.gather(full_tables[g], self.window_skip, read_lens, n)

    def enable_fused(self) -> None:
        """Refresh with one kernel launch (fused.py) from now on."""
        full_tables = self.block_tables.base.input_block_tables

        def refresh_of(windows: dict[int, BlockTableWindow]) -> FusedRefresh:
            tables = [
                (full_tables[g], windows[g].block_table, windows[g].block_size)
                for g in sorted(windows)
            ]
            return FusedRefresh(
                self.spec, tables, self.seq_lens, self.window_skip, self.actual_windowed
            )

        self.fused_steps = refresh_of(self.windows)
        self.fused_chunks = (
            self.fused_steps
            if self.chunk_windows is self.windows
            else refresh_of(self.chunk_windows)
        )

    def window_actual_seq_lens(self, lengths: torch.Tensor) -> torch.Tensor:
        """Window the kernel's actual lengths on the host, in place, by the same arithmetic as
        the device's (``refresh(actual_step=...)``); zero rows stay zero."""
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
        """A host bound that, once the builder adds ``step``, bounds every windowed read,
        also those of ``extra_steps`` later steps that reuse the metadata (one token each)."""
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

    def actual_host_bound(
        self, seq_lens_cpu_upper_bound: torch.Tensor, num_reqs: int, step: int
    ) -> torch.Tensor:
        """Where the kernel takes ``min(U + step, max_model_len)`` as its actual lengths
        (``actual.from_bound``): the host array that, once the builder adds ``step``, is that
        length windowed by the device's arithmetic (``refresh(actual_step=step)``)."""
        assert self.actual is not None
        out = self.seq_lens_cpu_upper_bound[:num_reqs]
        torch.add(seq_lens_cpu_upper_bound[:num_reqs], step, out=out)
        out.clamp_(max=self.actual.max_model_len)
        self.window_actual_seq_lens(out).sub_(step)
        return self.seq_lens_cpu_upper_bound

    @contextmanager
    def swapped_into(
        self,
        speculator: Any,
        path: str,
        attn_groups: list[list[Any]] | None = None,
        max_query_len: int = 1,
    ) -> Iterator[None]:
        """Let the speculator's own code read the windowed views on ``path`` (the hook
        running), and ``attn_groups`` instead of its own if given; restore on exit. The
        draft's longest read is that of passes of up to ``max_query_len`` query tokens."""
        saved = (speculator.input_buffers, speculator.block_tables, speculator.draft_max_seq_len)
        saved_groups = speculator.attn_groups
        speculator.input_buffers = self.input_buffers
        speculator.block_tables = self.block_tables
        speculator.draft_max_seq_len = min(saved[2], self.spec.read_cap(max_query_len))
        if attn_groups is not None:
            speculator.attn_groups = attn_groups
        self.path.append(path)
        try:
            yield
        finally:
            self.path.pop()
            speculator.input_buffers, speculator.block_tables, speculator.draft_max_seq_len = saved
            speculator.attn_groups = saved_groups

    @contextmanager
    def unwindowed_only(self, speculator: Any) -> Iterator[None]:
        """Let the speculator's own code build only the groups the window does not window."""
        saved = speculator.attn_groups
        speculator.attn_groups = self.unwindowed_attn_groups
        try:
            yield
        finally:
            speculator.attn_groups = saved

    @contextmanager
    def on_path(self, path: str) -> Iterator[None]:
        """Name the hook running, for builds that need no swapped views."""
        self.path.append(path)
        try:
            yield
        finally:
            self.path.pop()
