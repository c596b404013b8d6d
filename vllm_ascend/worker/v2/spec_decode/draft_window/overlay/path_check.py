# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Run-time check that the draft's attention builders get the windowed lengths and tables
on every path. Reads pointers, shapes and host tensors only (safe in graph capture).

The plugin form's: its hooks wrap vLLM's and vllm-ascend's methods by name, and a change
there that routes a build around them must stop the server rather than read outside the
window. It imports only the core (and torch), so that the tests of the tree form can
attach it too."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release, dotted
from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import (
    WindowNotInPathError,
    not_in_path,
)

if TYPE_CHECKING:
    from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator
    from vllm.v1.worker.utils import AttentionGroup

    from vllm_ascend.worker.v2.spec_decode.draft_window.window_buffers import DraftWindow

_BUILDS = ("build", "build_for_cudagraph_capture")
_UPDATE = "update_draft_decode_metadata"
UPDATE_PATH = "DraftModelSpeculator._update_draft_decode_metadata"


class PathCheck:
    """Watches the metadata builders of one speculator's windowed KV cache groups."""

    def __init__(
        self,
        window: DraftWindow,
        speculator: DraftModelSpeculator,
        release: Release,
        bound_as_exact_rows: tuple[str, str] | None = None,
    ) -> None:
        self.speculator = speculator
        self.window = window
        self.built_host_lengths = release.built_host_lengths
        # Metadata (decode, prefill) row counts where prefill rows take the host bound as exact.
        self.bound_as_exact_rows = bound_as_exact_rows
        # Host copies of unwindowed lengths, which a built host seq_lens must never be.
        mirror_name = release.host_mirror[0] if release.host_mirror else None
        self.unwindowed_host = [
            mirror
            for buffers in (
                speculator.input_buffers,
                getattr(speculator, "target_input_buffers", None),
            )
            if mirror_name and isinstance(mirror := getattr(buffers, mirror_name, None), torch.Tensor)
        ]
        # (path, builder method, group) already checked, outside graph capture.
        self.checked: set[tuple[tuple[str, ...], str, int]] = set()
        self.capture_paths: set[str] = set()
        self.num_checks = 0
        for g in window.windows:
            for group in speculator.attn_groups[g]:
                for builder in group.metadata_builders:
                    for name in (*_BUILDS, _UPDATE):
                        if callable(getattr(builder, name, None)):
                            setattr(builder, name, self._watch(builder, name, g, group))

    def capture_on(self, path: str) -> None:
        self.capture_paths.add(path)

    def _watch(self, builder: AttentionMetadataBuilder, name: str, g: int, group: AttentionGroup) -> Callable[..., Any]:
        real = getattr(builder, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            key = (tuple(self.window.path), name, g)
            if key in self.checked:
                metadata = real(*args, **kwargs)
                if self.bound_as_exact_rows is not None:
                    self._check_exact_rows(name, g, metadata)
                return metadata
            self._check(name, g, group, args, kwargs)
            metadata = real(*args, **kwargs)
            self._check_built(name, g, metadata)
            if self.bound_as_exact_rows is not None:
                self._check_exact_rows(name, g, metadata)
            # During capture every build is checked: a captured step that bypassed the
            # hooks must not pass because the input preparation was checked first.
            if self.capture_paths.isdisjoint(self.window.path):
                self.checked.add(key)
            return metadata

        watched.__wrapped__ = real
        return watched

    def _check(
        self,
        name: str,
        g: int,
        group: AttentionGroup,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.num_checks += 1
        if name == _UPDATE:
            metadata = kwargs.get("metadata", args[0] if args else None)
            problems = self._check_update(g, metadata)
        else:
            cm = kwargs.get("common_attn_metadata", args[-1] if args else None)
            capture = name != "build" or not self.capture_paths.isdisjoint(self.window.path)
            problems = self._check_common(g, group, cm, capture)
        if problems:
            raise self._error(name, g, problems)

    def _check_common(self, g: int, group: AttentionGroup, cm: CommonAttentionMetadata, capture: bool) -> list[str]:
        window = self.window
        problems = []
        if not _same_start(cm.seq_lens, window.seq_lens):
            problems.append("its device seq_lens is not the window's windowed seq_lens")
        if not self._is_cropped_table(g, group, cm.block_table_tensor):
            problems.append(
                f"its block table (shape {tuple(cm.block_table_tensor.shape)}) is not the group's cropped table"
            )
        # Capture's host lengths are vLLM's worst case (max_model_len): still bounds.
        if not capture:
            problems += self._host_lengths_problems(cm)
        local = getattr(cm, "dcp_local_seq_lens", None)
        if local is not None and not any(_same_start(local, b) for b in window.dcp_local_buffers):
            problems.append("its DCP-local seq_lens are not computed from the window's lengths")
        vllms = (window.block_tables.base.slot_mappings, window.build_slot_mappings)
        if not any(b is not None and _same_storage(cm.slot_mapping, b) for b in vllms):
            problems.append("its slot_mapping is not vLLM's own (a windowed slot mapping?)")
        return problems

    def _check_built(self, name: str, g: int, metadata: object) -> None:
        """Check the built metadata's own lengths (vllm-ascend's FIA ``seq_lens_list``)."""
        problems = []
        seq_lens = getattr(metadata, "seq_lens", None)
        host = next(
            (value for path in self.built_host_lengths if (value := dotted(metadata, path)) is not None),
            None,
        )
        if (
            isinstance(seq_lens, torch.Tensor)
            and not _same_start(seq_lens, self.window.seq_lens)
            and not self._is_host_mirror(seq_lens, host)
        ):
            problems.append("the built metadata's seq_lens is not the window's windowed seq_lens")
        capture = name != "build" or not self.capture_paths.isdisjoint(self.window.path)
        query_len = getattr(metadata, "max_query_len", None) or 0
        if isinstance(host, list) and host and not capture:
            cap = self.window.spec.read_cap(query_len)
            if max(host) > cap:
                problems.append(f"the built seq_lens_list reaches {max(host)}, past the window's {cap}")
        if problems:
            raise self._error(name, g, problems)

    def _check_exact_rows(self, name: str, g: int, metadata: object) -> None:
        """Rows whose host bound a prefill path takes as exact must be exact in the window."""
        decodes, prefills = (getattr(metadata, f, None) for f in self.bound_as_exact_rows)
        if not isinstance(prefills, int) or prefills <= 0:
            return
        exact = self.window.exact_host_rows
        rows = range(decodes, decodes + prefills)
        inexact = [r for r in rows if exact is None or r >= exact.shape[0] or not bool(exact[r])]
        if inexact:
            shown = ", ".join(map(str, inexact[:8])) + (", ..." if len(inexact) > 8 else "")
            raise self._error(
                name,
                g,
                [
                    f"its prefill path takes the host bound of rows {shown} as their exact length "
                    f"(context = bound - query), and the window handed it only a bound there "
                    f"(exact: the prefilling rows of a draft prefill)"
                ],
            )

    def _is_host_mirror(self, seq_lens: torch.Tensor, host: object) -> bool:
        """Whether ``seq_lens`` is a host tensor of ``host``, not vLLM's own lengths."""
        window = self.window
        vllms = [window.input_buffers.base.seq_lens, *self.unwindowed_host]
        if window.actual is not None:
            vllms.append(window.actual.source)
        return (
            isinstance(host, list)
            and seq_lens.device.type == "cpu"
            and not any(_same_storage(seq_lens, t) for t in vllms)
            and seq_lens[: len(host)].tolist() == host
        )

    def _host_lengths_problems(self, cm: CommonAttentionMetadata) -> list[str]:
        cap = self.window.spec.read_cap(cm.max_query_len)
        problems = []
        if cm.max_seq_len > cap:
            problems.append(f"max_seq_len={cm.max_seq_len} exceeds the window's {cap}")
        bound = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if bound is not None and bound.numel() and int(bound.max()) > cap:
            problems.append(f"seq_lens_cpu_upper_bound reaches {int(bound.max())}, past the window's {cap}")
        return problems

    def _check_update(self, g: int, metadata: object) -> list[str]:
        problems = []
        if UPDATE_PATH not in self.window.path:
            problems.append(
                "recorded metadata is updated in place outside the window's update hook, so "
                "the windowed lengths and tables it references are not refreshed"
            )
        seq_lens = getattr(metadata, "seq_lens", None)
        if isinstance(seq_lens, torch.Tensor) and not _same_start(seq_lens, self.window.seq_lens):
            problems.append("the metadata's seq_lens is not the window's windowed seq_lens")
        return problems

    def _is_cropped_table(self, g: int, group: AttentionGroup, table: torch.Tensor) -> bool:
        window = self.window
        cropped = window.block_tables.windows[g].block_table
        if _same_storage(table, cropped):
            return True
        # Or the group's kernel-block map of it, no wider.
        kernel_table = getattr(group, "kernel_block_table", None)
        kernel_block_size = getattr(group, "kernel_block_size", None)
        if kernel_table is None or not kernel_block_size or not _same_storage(table, kernel_table):
            return False
        per_block = group.kv_cache_spec.block_size // kernel_block_size
        return table.shape[1] <= cropped.shape[1] * per_block

    def _error(self, name: str, g: int, problems: list[str]) -> WindowNotInPathError:
        owner = type(self.speculator).__name__
        if self.window.path:
            where = "under the window's calls " + " -> ".join(self.window.path)
        else:
            where = "outside the window's calls, called from " + self._callers()
        return not_in_path(
            f"{owner}'s draft attention builder for KV-cache group {g} got metadata ({name}) "
            f"{where}, and " + "; ".join(problems) + ". The draft would read outside its "
            "window. A method on that path overrides one that calls the window without calling "
            "super(), or bypasses it"
        )

    def _callers(self) -> str:
        frames, in_speculator = [], False
        frame = sys._getframe(4)  # the watched builder method's caller
        while frame is not None and len(frames) < 6:
            receiver = frame.f_locals.get("self")
            if receiver is self.speculator:
                in_speculator = True
            elif in_speculator:
                break
            if receiver is not None and "/v1/worker/utils.py" not in frame.f_code.co_filename:
                code = frame.f_code
                name = getattr(code, "co_qualname", code.co_name)
                frames.append(f"{name} ({code.co_filename}:{frame.f_lineno})")
            frame = frame.f_back
        return " -> ".join(reversed(frames)) or "an unknown caller"


def _same_start(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    return view.data_ptr() == buffer.data_ptr()


def _same_storage(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
