# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The Ascend pairing's configs as a host builds them, and the methods the window hooks there."""

import sys
from pathlib import Path

VENV = Path(sys.prefix)


def installed_release():
    """The supported release this environment is (its vLLM's minor version)."""
    import vllm

    from vllm_ascend.worker.v2.spec_decode.draft_window import releases

    return releases.release_for(vllm.__version__)


def draft_build_path() -> str:
    """The draft build every path goes through on this release, as the path check names it
    (``DraftModelSpeculator._build_attn_metadata``; ``_build_draft_attn_metadata`` on 0.29)."""
    return next(
        h.name for h in installed_release().hooks if h.wrapper_name == "build_attn_metadata"
    )


def speculative_config(model_dir, additional_config, method="eagle3"):
    """A real VllmConfig with a speculative config (EAGLE3 by default), as the engine builds
    it."""
    from tests.testbed.configs import speculative_vllm_config

    return speculative_vllm_config(model_dir, 512, 2, method, additional_config)


def ascend_config(model_dir, additional_config):
    """vllm-ascend's own factory (its platform calls it at start-up) on a config without a
    draft."""
    from vllm.config import VllmConfig

    from tests.testbed.configs import tiny_model_config
    from vllm_ascend.ascend_config import init_ascend_config

    model = tiny_model_config(model_dir, 512)
    return init_ascend_config(VllmConfig(model_config=model, additional_config=additional_config))


def hooked_methods():
    """Every method of the speculator classes on the draft paths, vLLM's and vllm-ascend's."""
    from vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils import (
        SpeculatorCudaGraphManager,
    )
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import (
        AutoRegressiveSpeculator,
    )
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from vllm_ascend.worker.v2.spec_decode.autoregressive.aclgraph import (
        AutoRegressiveAclGraphManager,
    )
    from vllm_ascend.worker.v2.spec_decode.autoregressive.speculator import (
        AscendAutoRegressiveSpeculator,
    )
    from vllm_ascend.worker.v2.spec_decode.dflash.speculator import AscendDFlashSpeculator
    from vllm_ascend.worker.v2.spec_decode.dspark.speculator import AscendDSparkSpeculator
    from vllm_ascend.worker.v2.spec_decode.eagle.speculator import AscendEagleSpeculator

    classes = (
        DraftModelSpeculator,
        DFlashSpeculator,
        AutoRegressiveSpeculator,
        SpeculatorCudaGraphManager,
        AscendDSparkSpeculator,
        AscendDFlashSpeculator,
        AscendAutoRegressiveSpeculator,
        AscendEagleSpeculator,
        AutoRegressiveAclGraphManager,
    )
    return {
        (cls, name): method
        for cls in classes
        for name, method in vars(cls).items()
        if callable(method)
    }
