"""The draft window of one Model Runner V2 speculator: its persistent buffers, made once and
complete when made, and the refresh that windows them each pass.

vLLM's ``DraftModelSpeculator._build_attn_metadata`` reads the draft's KV lengths from
``self.input_buffers.seq_lens`` and its block tables from
``self.block_tables.input_block_tables``. The window hands it views of those two objects
(``views.py``) in which the draft's lengths and the draft groups' tables are its own
persistent windowed buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.dcp import DcpLayout, column_tokens
from vllm_ascend.worker.v2.spec_decode.draft_window.fused import FusedRefresh
from vllm_ascend.worker.v2.spec_decode.draft_window.proof import WindowProof
from vllm_ascend.worker.v2.spec_decode.draft_window.views import (
    BlockTablesView,
    InputBuffersView,
    cropped_table_width,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.window import (
    BlockTableWindow,
    WindowSpec,
    align_sinks,
    effective_min_context,
    lcm_alignment,
    seq_lens_upper_bound,
    window_seq_lens,
)


@dataclasses.dataclass(frozen=True)
class ToldLengths:
    """Where the kernel is told a length other than the draft's own (window.py: a told
    length), the window start comes from that length, on the host and on the device.

    ``source``: the device tensor of the target's lengths the told length starts from;
    ``max_model_len``: where it is clamped. ``bound``: the told length is the builder's host
    bound plus the build's step (vllm-ascend's DSpark on GLM-family targets, DFlash on MLA),
    rather than the target's length plus each decode step (its EAGLE decode)."""

    source: torch.Tensor
    max_model_len: int
    bound: bool = False


@dataclasses.dataclass(frozen=True)
class Watch:
    """The speculator whose draft builders the run-time proof watches, and what the
    installed line says about its host lengths (``lines.Line``)."""

    speculator: Any
    host_mirror: tuple[str, str] | None = None
    built_host_lengths: tuple[str, ...] = ()
    bound_as_exact_rows: tuple[str, str] | None = None


class Mrv2DraftWindow:
    """Persistent windowed inputs of one speculator's draft attention, created once."""

    def __init__(
        self,
        window_size: int,
        input_buffers: Any,
        block_tables: Any,
        draft_group_ids: Sequence[int],
        max_num_reqs: int,
        device: torch.device,
        max_query_len: int = 1,
        max_chunk_len: int | None = None,
        attention_sinks: int = 0,
        min_context: int = 0,
        told: ToldLengths | None = None,
        attn_groups: list[list[Any]] | None = None,
        left_alone_group_ids: Sequence[int] = (),
        watch: Watch | None = None,
    ) -> None:
        """``max_query_len``: the longest query of one request in the passes that read the
        window every step (DFlash: its query stretch; EAGLE decode: 1). ``max_chunk_len``:
        the longest query chunk of a draft prefill (EAGLE), which gets wider tables of its
        own so that the per-step tables stay as narrow as the window. ``attention_sinks``:
        the first tokens kept besides the window, rounded up to the alignment here.
        ``min_context``: the context from which a request reads its window (shorter ones
        read whole); 0 where it changes nothing (``effective_min_context``).
        ``attn_groups`` and ``left_alone_group_ids``: the draft groups whose builders keep
        vLLM's own inputs (``policy.py``). ``watch``: the speculator whose builders the
        run-time proof watches (none for a window no speculator builds from)."""
        # Per draft group: a request's tokens per table column (dcp.py: under DCP, all ranks').
        self.group_block_sizes = column_tokens(block_tables, draft_group_ids)
        alignment = lcm_alignment(list(self.group_block_sizes.values()))
        sinks = align_sinks(attention_sinks, alignment)
        min_context = effective_min_context(min_context, window_size, alignment, sinks)
        self.spec = WindowSpec(window_size, alignment, sinks, min_context)

        def tables(query_len: int) -> dict[int, BlockTableWindow]:
            return {
                g: BlockTableWindow(
                    self.spec,
                    b,
                    max_num_reqs,
                    device,
                    width=cropped_table_width(
                        self.spec, b, block_tables.input_block_tables[g].shape[1], query_len
                    ),
                )
                for g, b in self.group_block_sizes.items()
            }

        # Per draft group: the cropped tables every step reads (graphs capture these) ...
        self.windows = tables(max_query_len)
        # ... and, for a draft prefill over long chunks, wider ones used only there.
        self.chunk_windows = tables(max_chunk_len) if max_chunk_len else self.windows
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
        self.told = told
        # [n] bool, host, or None: the rows of the build in progress whose host bound the
        # window made their exact windowed length (a draft prefill's prefilling rows); the
        # run-time proof checks that a builder taking the bound as exact reads only those.
        self.exact_host_rows: torch.Tensor | None = None
        # [max_num_reqs] int32: the told lengths of the pass in progress, windowed in place.
        self.told_windowed = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        # Under DCP: this rank's layout; [max_num_reqs] int32: a draft prefill's DCP-local
        # lengths (else the target's), and scratch. A build may hand a kernel these or the
        # draft's own, which vLLM fills from the windowed lengths (the proof checks).
        self.dcp = DcpLayout.of(block_tables)
        self.dcp_local_seq_lens = self.dcp_scratch = None
        if self.dcp:
            self.dcp_local_seq_lens, self.dcp_scratch = torch.zeros(
                (2, max_num_reqs), dtype=torch.int32, device=device
            )
        own = getattr(input_buffers, "dcp_local_seq_lens", None)
        self.dcp_local_buffers = [b for b in (self.dcp_local_seq_lens, own) if b is not None]
        # [max_num_reqs] int32, host: scratch for windowing host lengths (told lengths).
        self.host_skip = torch.zeros(max_num_reqs, dtype=torch.int32)
        # One-launch refreshes (fused.py) of the per-step tables and of a draft prefill's
        # wider ones; None: the torch path (trust.py decides).
        self.fused_steps: FusedRefresh | None = None
        self.fused_chunks: FusedRefresh | None = None
        host_mirror = watch.host_mirror if watch is not None else None
        # [max_num_reqs] int32, host: the windowed lengths' exact mirror (InputBuffersView).
        has_mirror = host_mirror is not None and hasattr(input_buffers, host_mirror[0])
        self.seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32) if has_mirror else None
        self.input_buffers = InputBuffersView(
            input_buffers, self.seq_lens, host_mirror, self.seq_lens_cpu
        )
        self.block_tables = BlockTablesView(block_tables, self.windows)
        # The window's hooks running now, outermost first: a build's path (proof.py).
        self.path: list[str] = []
        # The speculator's attention groups split by the window's policy: an eager build runs
        # vLLM's own build once over each (None while every draft group is windowed).
        self.windowed_attn_groups: list[list[Any]] | None = None
        self.left_alone_attn_groups: list[list[Any]] | None = None
        if left_alone_group_ids:
            self._leave_groups_alone(attn_groups, left_alone_group_ids)
        self.proof = WindowProof(self, watch) if watch is not None else None

    def _leave_groups_alone(self, attn_groups: list[list[Any]], group_ids: Sequence[int]) -> None:
        """Keep what vLLM builds for the draft groups ``group_ids``: their builders must see
        vLLM's own lengths and tables, never the window's.

        vLLM builds every group from one ``seq_lens``. An eager build therefore runs vLLM's
        own build twice (the build hook): over the windowed groups through the views, and
        over these with vLLM's inputs. A graph capture builds all groups at once through the
        views, so these groups' builders are handed vLLM's own device ``seq_lens`` back (the
        views give them vLLM's tables already, and a capture's host lengths are vLLM's).
        """
        left = set(group_ids)
        self.windowed_attn_groups = [[] if g in left else gs for g, gs in enumerate(attn_groups)]
        self.left_alone_attn_groups = [gs if g in left else [] for g, gs in enumerate(attn_groups)]
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
        told_step: int | None = None,
    ) -> None:
        """Window the first ``num_reqs_padded`` rows on the device: lengths and tables.

        ``seq_lens`` defaults to the draft's own; a draft prefill passes the target's, with
        its ``query_start_loc`` so that every query token stays inside its window.
        ``told_step`` (with ``told`` set): the kernel is told
        ``min(told.source + told_step, told.max_model_len)`` instead of the draft's own
        length, so the window start comes from that told length, and the draft's own length
        and the cropped table follow the same start (invariant 2: one start per request).
        Device ops into persistent buffers only, so it may run inside a graph capture.
        """
        n = num_reqs_padded
        source = self.input_buffers.base.seq_lens if seq_lens is None else seq_lens
        told = self.told if told_step is not None else None
        windows = self.windows if query_start_loc is None else self.chunk_windows
        # The views hand the builder the tables this pass fills.
        self.block_tables.windows = windows
        fused = self.fused_steps if query_start_loc is None else self.fused_chunks
        if fused is not None:
            fused.launch(
                n,
                source,
                query_start_loc,
                told_source=None if told is None else told.source,
                told_step=told_step or 0,
                max_model_len=0 if told is None else told.max_model_len,
            )
            return
        query_lens = None
        if query_start_loc is not None:
            query_lens = self.query_lens[:n]
            torch.sub(query_start_loc[1 : n + 1], query_start_loc[:n], out=query_lens)
        read_lens = self.seq_lens
        if told is None:
            window_seq_lens(
                source[:n],
                self.spec,
                skip_out=self.window_skip[:n],
                out=self.seq_lens[:n],
                query_lens=query_lens,
            )
        else:
            assert query_lens is None
            told_lens = self.told_windowed[:n]
            torch.add(told.source[:n], told_step, out=told_lens)
            told_lens.clamp_(max=told.max_model_len)
            window_seq_lens(told_lens, self.spec, skip_out=self.window_skip[:n], out=told_lens)
            torch.sub(source[:n], self.window_skip[:n], out=self.seq_lens[:n])
            # The table covers what the kernel is told to read.
            read_lens = self.told_windowed
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
                self.spec, tables, self.seq_lens, self.window_skip, self.told_windowed
            )

        self.fused_steps = refresh_of(self.windows)
        self.fused_chunks = (
            self.fused_steps
            if self.chunk_windows is self.windows
            else refresh_of(self.chunk_windows)
        )

    def window_host_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Window host lengths the kernel is told, in place, by the same arithmetic as the
        device's told lengths (``refresh(told_step=...)``); zero rows stay zero."""
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

    def told_host_bound(
        self, seq_lens_cpu_upper_bound: torch.Tensor, num_reqs: int, step: int
    ) -> torch.Tensor:
        """Where the kernel is told ``min(U + step, max_model_len)`` as the exact length
        (``told.bound``): the host array that, once the builder adds ``step``, is that told
        length windowed by the device's arithmetic (``refresh(told_step=step)``)."""
        assert self.told is not None
        out = self.seq_lens_cpu_upper_bound[:num_reqs]
        torch.add(seq_lens_cpu_upper_bound[:num_reqs], step, out=out)
        out.clamp_(max=self.told.max_model_len)
        self.window_host_lengths(out).sub_(step)
        return self.seq_lens_cpu_upper_bound

    @contextmanager
    def swapped_into(
        self, speculator: Any, path: str, attn_groups: list[list[Any]] | None = None
    ) -> Iterator[None]:
        """Let the speculator's own code read the windowed views on ``path`` (the hook
        running), and ``attn_groups`` instead of its own if given; restore on exit."""
        saved = (speculator.input_buffers, speculator.block_tables, speculator.draft_max_seq_len)
        saved_groups = speculator.attn_groups
        speculator.input_buffers = self.input_buffers
        speculator.block_tables = self.block_tables
        speculator.draft_max_seq_len = min(saved[2], self.spec.max_read_len)
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
    def left_alone_only(self, speculator: Any) -> Iterator[None]:
        """Let the speculator's own code build only the groups the window leaves alone."""
        saved = speculator.attn_groups
        speculator.attn_groups = self.left_alone_attn_groups
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
