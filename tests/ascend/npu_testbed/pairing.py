# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The Ascend pairing's configs as a host builds them, and the methods the window hooks there."""

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

VENV = Path(sys.prefix)
# The second form (tests/ascend/conftest.py): vllm-ascend's tree with the upstream patch.
IN_TREE = os.environ.get("DRAFT_WINDOW_IN_TREE") == "1"
_PACKAGE = "vllm_ascend.worker.v2.spec_decode.draft_window"


def check_in_tree() -> None:
    """The tree form's premises: vllm-ascend imported from the patched tree, not the
    environment's site-packages, and nothing of the overlay importable there."""
    import vllm_ascend

    site = Path(sysconfig.get_paths()["purelib"])
    origin = Path(vllm_ascend.__file__).resolve()
    assert site not in origin.parents, f"vllm_ascend imported from {origin}, not the tree"
    assert importlib.util.find_spec(f"{_PACKAGE}.overlay") is None


def path_check_module():
    """The overlay's path check (``overlay/path_check.py``). The tree form has no overlay:
    there it is loaded from this repository's file, which imports only the core, so that the
    tree's windows are checked on every path as the plugin's are."""
    if not IN_TREE:
        return importlib.import_module(f"{_PACKAGE}.overlay.path_check")
    name = "draft_window_path_check"
    if name not in sys.modules:
        source = Path(__file__).resolve().parents[3] / _PACKAGE.replace(".", "/")
        spec = importlib.util.spec_from_file_location(name, source / "overlay" / "path_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_every_tree_window() -> None:
    """The tree form: each window vllm-ascend's call sites make (``create_draft_window``)
    gets the path check on its builders, as ``set_attn`` gives the plugin's."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import speculator

    create = speculator.create_draft_window
    if getattr(create, "attaches_path_check", False):
        return

    def create_checked(draft_speculator, release, *args, **kwargs):
        window = create(draft_speculator, release, *args, **kwargs)
        if window is not None:
            window.path_check = path_check_module().PathCheck(window, draft_speculator, release)
        return window

    create_checked.attaches_path_check = True
    speculator.create_draft_window = create_checked


def installed_release():
    """The supported release this environment is (its vLLM's minor version); in the tree
    form, the one vllm-ascend's call sites name."""
    from testbed.vllm_line import RELEASE

    return RELEASE


def draft_build_path(speculator) -> str:
    """The draft build every path goes through on this release, as the path check names it
    (``DraftModelSpeculator._build_attn_metadata``; ``_build_draft_attn_metadata`` on 0.29).
    In the tree form: the vllm-ascend class whose ``_build_attn_metadata`` calls the window."""
    if IN_TREE:
        cls = next(c for c in type(speculator).__mro__ if "_build_attn_metadata" in vars(c))
        return f"{cls.__name__}._build_attn_metadata"
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported

    return next(
        h.name
        for h in supported.hooks_for(installed_release())
        if h.wrapper_name == "build_attn_metadata"
    )


def draft_build_method() -> str:
    """The name of the draft build method (``_build_attn_metadata``; 0.29:
    ``_build_draft_attn_metadata``); the tree form is 0.30's."""
    return "_build_attn_metadata" if IN_TREE else draft_build_path(None).split(".")[1]


def speculative_config(model_dir, additional_config, method="eagle3"):
    """A real VllmConfig with a speculative config (EAGLE3 by default), as the engine builds
    it."""
    from testbed.configs import speculative_vllm_config

    return speculative_vllm_config(model_dir, 512, 2, method, additional_config)


def ascend_config(model_dir, additional_config):
    """vllm-ascend's own factory (its platform calls it at start-up) on a config without a
    draft."""
    from vllm.config import VllmConfig

    from testbed.configs import tiny_model_config
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
