# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The supported release the testbed runs on (vLLM 0.33 in ``.venv``, 0.34 in ``.venv-034``;
the Ascend releases' vLLM in theirs), from the overlay's table of supported releases (in
vllm-ascend's patched tree, which has no overlay, the release its call sites name): what
differs between releases is asked of the table or of the installed vLLM, never of the
version."""

from __future__ import annotations

import vllm

from vllm_ascend.worker.v2.spec_decode.draft_window.release import VLLM_0_30_ASCEND, Release


def _installed_release() -> Release | None:
    try:
        from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported
    except ModuleNotFoundError:
        return VLLM_0_30_ASCEND if vllm.__version__.startswith("0.30.") else None
    return supported.release_for(vllm.__version__)


# The supported release of the installed vLLM.
RELEASE = _installed_release()
assert RELEASE is not None, f"the testbed runs on a supported vLLM, not {vllm.__version__}"
# vLLM 0.34 has no Model Runner V1 (and no VLLM_USE_V2_MODEL_RUNNER).
HAS_MODEL_RUNNER_V1 = RELEASE.model_runner_v1

get_block_table_width = RELEASE.block_table_width_function()


def use_model_runner_v2(monkeypatch) -> None:
    """Model Runner V2 for the configs a test builds: ``VLLM_USE_V2_MODEL_RUNNER=1`` where the
    release still has V1; nothing to set where V2 is the only runner (vLLM 0.34 refuses the
    variable set to anything else and warns that 1 is redundant)."""
    if HAS_MODEL_RUNNER_V1:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    else:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
