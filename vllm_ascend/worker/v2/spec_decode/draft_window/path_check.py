# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The path check: the run-time check that the draft's attention is handed the window, on
every path.

The hooks wrap vLLM methods by name. A subclass that overrides one without ``super()``, a
vLLM that stops forwarding ``_build_uniform_attn_metadata`` to ``_build_attn_metadata``, or
a graph capture that goes around the hooked one would leave the draft reading its whole
context, and nothing would say so. The path check therefore watches the other end: the
attention metadata builders of every windowed KV-cache group. The first time each path
hands them metadata (and at every build of a graph capture: a capture's input preparation
and the steps it records run under the same hooks), it checks that

- the device ``seq_lens`` is the window's persistent windowed buffer, and the block table
  is the group's persistent cropped table (or the group's kernel-block map of it, no wider);
- every host length is windowed: ``max_seq_len`` and ``seq_lens_cpu_upper_bound`` are at
  most ``S + max(W, q) + a - 1``, the longest read of a pass of ``q`` query tokens per
  request (upstream vLLM takes both as bounds). At a graph capture they are vLLM's worst
  case over every replay instead (``max_model_len``), which stay bounds;
- under decode context parallelism, the device DCP-local lengths are ones computed from the
  window's lengths: the window's own, or the draft's buffer vLLM fills from them;
- the slot mapping is vLLM's own: the window never touches where the draft writes;
- an in-place update of recorded metadata runs inside the window's update hook, which
  refreshes the persistent buffers the metadata references;
- what the builder built, where the backend keeps host lengths of its own (vllm-ascend's
  FIA takes ``seq_lens_list`` as exact lengths): built from the window's device lengths,
  and at most the longest read;
- at every build, not only the first: the rows a builder's prefill path serves, where that
  path takes the host bound as the exact length (vLLM's MLA: context = bound - q), are rows
  whose bound the window made exact (a draft prefill's prefilling rows). Elsewhere the
  window's host bound is only a bound.

Any failure stops with an error naming the path: the hooks a build ran under, or, for a
build under none, the methods that called it. The checks read pointers, shapes and host
tensors only: no device value, so they may run inside a graph capture. Once a path is
checked, a build costs one set lookup (and the prefill-row check above, two integers).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from vllm_ascend.worker.v2.spec_decode.draft_window.release import Release, dotted

# The builder methods a kernel's metadata comes from.
_BUILDS = ("build", "build_for_cudagraph_capture")
_UPDATE = "update_draft_decode_metadata"
# The path label of the in-place update hook (hooks/speculator.py).
UPDATE_PATH = "DraftModelSpeculator._update_draft_decode_metadata"
_NOT_SUPPORTED = "Windowing it is not supported: remove draft_window_size, or report the path."


class WindowNotInPathError(RuntimeError):
    """The draft's attention was about to read outside the window."""


def not_in_path(what: str) -> WindowNotInPathError:
    """The one error for a path the window is not on: ``what`` says where and why."""
    return WindowNotInPathError(f"draft window not in the path: {what}. {_NOT_SUPPORTED}")


class PathCheck:
    """Watches the builders of one speculator's windowed KV-cache groups, with the
    host-length fields the installed release's builders keep."""

    def __init__(self, window: Any, speculator: Any, release: Release) -> None:
        self.speculator = speculator
        self.window = window
        # The built metadata's host length lists the kernel takes (vllm-ascend's FIA and MLA
        # keep them), as dotted attribute paths.
        self.built_host_lengths = release.built_host_lengths
        # The built metadata's (decode rows, prefill rows) counts, where a prefill path takes
        # the host bound as exact (release.Release.bound_as_exact_rows).
        self.bound_as_exact_rows = release.bound_as_exact_rows
        # The release's host mirrors of the unwindowed lengths (draft's and target's), which a
        # built host seq_lens must never be.
        mirror_name = release.host_mirror[0] if release.host_mirror else None
        self.unwindowed_host = [
            mirror
            for buffers in (
                speculator.input_buffers,
                getattr(speculator, "target_input_buffers", None),
            )
            if mirror_name
            and isinstance(mirror := getattr(buffers, mirror_name, None), torch.Tensor)
        ]
        # (path, builder method, group) already checked, outside graph captures.
        self.checked: set[tuple[tuple[str, ...], str, int]] = set()
        # The hooks that capture graphs (``capture_on``): every build under them is checked.
        self.capture_paths: set[str] = set()
        # Number of builder calls checked: shows in tests that the check ran.
        self.num_checks = 0
        for g in window.windows:
            for group in speculator.attn_groups[g]:
                for builder in group.metadata_builders:
                    for name in (*_BUILDS, _UPDATE):
                        if callable(getattr(builder, name, None)):
                            setattr(builder, name, self._watch(builder, name, g, group))

    def capture_on(self, path: str) -> None:
        """Graphs are captured on ``path``: every build under it is checked."""
        self.capture_paths.add(path)

    def _watch(self, builder: Any, name: str, g: int, group: Any) -> Any:
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
            # NOTE: within a graph capture every build is checked: a capture's input
            # preparation and the steps it records build under the same hooks, and a step
            # that went around the build hook must not pass as the preparation checked first.
            if self.capture_paths.isdisjoint(self.window.path):
                self.checked.add(key)
            return metadata

        watched.__wrapped__ = real
        return watched

    def _check(self, name: str, g: int, group: Any, args: tuple, kwargs: dict) -> None:
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

    def _check_common(self, g: int, group: Any, cm: Any, capture: bool) -> list[str]:
        window = self.window
        problems = []
        if not _same_start(cm.seq_lens, window.seq_lens):
            problems.append("its device seq_lens is not the window's windowed seq_lens")
        if not self._is_cropped_table(g, group, cm.block_table_tensor):
            problems.append(
                f"its block table (shape {tuple(cm.block_table_tensor.shape)}) is not the "
                f"group's cropped table"
            )
        # NOTE: a graph capture gives vLLM's worst case over every replay (max_model_len)
        # as its host lengths: bounds the launch is sized by once, while every replay reads
        # the device lengths and tables checked above.
        if not capture:
            problems += self._host_lengths_problems(cm)
        local = getattr(cm, "dcp_local_seq_lens", None)
        if local is not None and not any(_same_start(local, b) for b in window.dcp_local_buffers):
            problems.append("its DCP-local seq_lens are not computed from the window's lengths")
        vllms = (window.block_tables.base.slot_mappings, window.build_slot_mappings)
        if not any(b is not None and _same_storage(cm.slot_mapping, b) for b in vllms):
            problems.append("its slot_mapping is not vLLM's own (a windowed slot mapping?)")
        return problems

    def _check_built(self, name: str, g: int, metadata: Any) -> None:
        """What the kernel takes from the built metadata, where the backend keeps its own
        host lengths (vllm-ascend's FIA takes ``seq_lens_list`` as exact lengths): windowed
        (at most the longest read; outside a capture) and from the window's device lengths."""
        problems = []
        seq_lens = getattr(metadata, "seq_lens", None)
        host = next(
            (
                value
                for path in self.built_host_lengths
                if (value := dotted(metadata, path)) is not None
            ),
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
                problems.append(
                    f"the built seq_lens_list reaches {max(host)}, past the window's {cap}"
                )
        if problems:
            raise self._error(name, g, problems)

    def _check_exact_rows(self, name: str, g: int, metadata: Any) -> None:
        """The rows the builder's prefill path serves (it takes their host bound as exact)
        are rows whose bound the window made exact. Host integers only: cheap enough for
        every build."""
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

    def _is_host_mirror(self, seq_lens: torch.Tensor, host: Any) -> bool:
        """Where the kernel takes actual lengths from the host (vllm-ascend's EAGLE: its
        builder keeps the host lengths it was given, and its decode steps overwrite them in
        place), the built ``seq_lens`` is a host tensor holding ``seq_lens_list``, which the
        cap bounds; never one of vLLM's own device tensors of unwindowed lengths."""
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

    def _host_lengths_problems(self, cm: Any) -> list[str]:
        cap = self.window.spec.read_cap(cm.max_query_len)
        problems = []
        if cm.max_seq_len > cap:
            problems.append(f"max_seq_len={cm.max_seq_len} exceeds the window's {cap}")
        bound = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if bound is not None and bound.numel() and int(bound.max()) > cap:
            problems.append(
                f"seq_lens_cpu_upper_bound reaches {int(bound.max())}, past the window's {cap}"
            )
        return problems

    def _check_update(self, g: int, metadata: Any) -> list[str]:
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

    def _is_cropped_table(self, g: int, group: Any, table: torch.Tensor) -> bool:
        window = self.window
        # The cropped tables of the pass in progress (per step, or a prefill's wider ones).
        cropped = window.block_tables.windows[g].block_table
        if _same_storage(table, cropped):
            return True
        # A backend with smaller kernel blocks reads the group's persistent kernel-block
        # map of the cropped table: as many kernel blocks per row as the cropped columns.
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
        """The methods on the stack up to and through the speculator's own, outermost first
        (vLLM's attention plumbing between them names nothing useful)."""
        frames, in_speculator = [], False
        frame = sys._getframe(4)  # the caller of the watched builder method
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
