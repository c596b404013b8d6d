# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The ``vllm.general_plugins`` entry point.

vLLM calls every general plugin in each process it starts (engine core and workers), with
no guard, so ``register`` must be cheap, safe to call more than once, and must never raise
because of what the installed vLLM or vllm-ascend look like. It installs the hooks where
the installed vLLM is a supported release (``install.py``) and adjusts the two places outside
them that see the window's keys: the start-up check of a complete ``VllmConfig`` (which
refuses a window that would not be served) and vllm-ascend's own validation of
``additional_config``. No supported release forces Model Runner V1 because of the window
(vllm-ascend 0.30.0rc2 leaves ``use_v2_model_runner`` to vLLM), so the runner choice is
vLLM's.
"""

import functools
import importlib

from vllm_ascend.worker.v2.spec_decode.draft_window import policy
from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    AUTO,
    FREE_KV_KEY,
    KEY,
    MIN_CONTEXT_KEY,
    SINKS_KEY,
    DraftWindowConfig,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import (
    free_kv,
    install,
    patches,
    supported,
    versions,
)
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.log import logger
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import refuse_config

# The keys besides draft_window_size that only this package reads.
OWN_KEYS = (SINKS_KEY, MIN_CONTEXT_KEY, FREE_KV_KEY)
# Every key of additional_config that starts so is one of this package's (vllm-ascend's
# own AscendConfig declares draft_window_size alone): any other is a misspelling.
PREFIX = "draft_"


def unknown_keys(additional_config: dict | None) -> list[str]:
    """The ``draft_*`` keys of ``additional_config`` this package does not know."""
    known = (KEY, *OWN_KEYS)
    return sorted(k for k in additional_config or {} if k.startswith(PREFIX) and k not in known)


def register() -> None:
    """Install the draft window into vLLM's Model Runner V2 speculators, or, where it cannot
    be served, only the start-up check that refuses a config asking for it."""
    state = install.install()
    failed = []
    for step in (check_window_config, accept_own_keys):
        try:
            step()
        except Exception as error:
            failed.append(f"{step.__name__} failed ({type(error).__name__}: {error})")
    if not state.installed:
        logger.debug(
            "draft window: hooks not installed (%s; supported: %s): %s",
            versions.describe_versions(),
            supported.SUPPORTED,
            "; ".join(state.problems),
        )
    if failed:
        # A config check that could not be installed leaves a window config neither
        # served nor refused: said where a server's log shows it.
        logger.warning("draft window: %s", "; ".join(failed))


def unregister() -> None:
    """Undo ``register()``: vLLM's methods, the config check and vllm-ascend's
    ``AscendConfig`` as they were (for tests)."""
    install.uninstall()


def check_window_config() -> None:
    """Check the window's keys once each ``VllmConfig`` is complete (``__post_init__``), in
    the process that builds it (the engine's, before any worker loads a model), after every
    plugin and platform patch has settled how ``use_v2_model_runner`` answers: a vllm-ascend
    release replaces that property, possibly after this plugin has run. See
    ``_check_window_config``.
    """
    from vllm.config import VllmConfig

    def check_after(post_init):
        @functools.wraps(post_init)
        def __post_init__(self) -> None:
            post_init(self)
            try:
                _check_window_config(self)
            except ValueError:
                raise
            except Exception as error:
                # A vLLM that moved what the check reads: one named error, not a traceback
                # from inside vLLM's config.
                raise ValueError(_unchecked_message(self, error)) from error

        return __post_init__

    if VllmConfig.__dict__.get("__post_init__") is None:
        raise RuntimeError("vLLM's VllmConfig has no __post_init__ to check the window in")
    patches.replace(VllmConfig, "__post_init__", check_after)


def _check_window_config(vllm_config) -> None:
    """Validate set keys (a draft or not); then, for a draft on Model Runner V2, refuse a
    window whose hooks are not installed; on Model Runner V1, refuse sinks > 0 and a
    threshold > 0, which only the MRV2 hooks apply (vllm-ascend's V1 window has neither).
    Keys unset change nothing."""
    additional = vllm_config.additional_config
    if not isinstance(additional, dict):
        return
    unknown = unknown_keys(additional)
    if unknown:
        raise ValueError(
            f"additional_config has {', '.join(unknown)}, which the draft window does not "
            f"know (a misspelling?): its keys are {', '.join((KEY, *OWN_KEYS))}. Fix or "
            f"remove {' and '.join(unknown)}."
        )
    if all(additional.get(key) is None for key in (KEY, *OWN_KEYS)):
        return
    config = DraftWindowConfig.from_additional_config(additional)
    if vllm_config.speculative_config is None or not config.enabled:
        return
    model_runner_v2 = versions.runs_model_runner_v2(vllm_config)
    if model_runner_v2 and not install.status().installed:
        raise ValueError(_unserved_message(config, install.status()))
    installed = install.installation()
    release = installed.release if installed is not None else None
    policy.check_start_up(vllm_config, config, release, model_runner_v2)
    if model_runner_v2 and release is not None:
        refuse_config(vllm_config, release, config.draft_window_size)
    method = getattr(vllm_config.speculative_config, "method", None)
    if model_runner_v2 and config.draft_window_free_kv and method is not None:
        free_kv.refuse_free_kv(vllm_config, config, release)


def _keys(config: DraftWindowConfig) -> str:
    keys = f"{KEY}={config.draft_window_size}"
    if config.draft_attention_sinks:
        keys += f" and {SINKS_KEY}={config.draft_attention_sinks}"
    if config.draft_window_min_context:
        keys += f" and {MIN_CONTEXT_KEY}={config.draft_window_min_context}"
    if config.draft_window_free_kv:
        keys += f" and {FREE_KV_KEY}=true"
    return keys


def _unchecked_message(vllm_config, error: Exception) -> str:
    additional = getattr(vllm_config, "additional_config", None) or {}
    keys = ", ".join(f"{k}={additional[k]!r}" for k in (KEY, *OWN_KEYS) if k in additional)
    return (
        f"additional_config {keys} could not be checked on this vLLM "
        f"({versions.describe_versions()}; supported: {supported.SUPPORTED}): "
        f"{type(error).__name__}: {error}. Install a supported vLLM or remove {KEY} from "
        f"additional_config."
    )


def _unserved_message(config: DraftWindowConfig, state: install.Status) -> str:
    keys = _keys(config)
    # vllm-ascend's Model Runner V1 has a window of its own (without sinks or threshold),
    # where vLLM still has Model Runner V1.
    has_v1_window = versions.installed_versions()["vllm-ascend"] != "not installed"
    v1_serves = not config.auto and not config.draft_attention_sinks and not config.draft_window_min_context
    v1 = (
        ", run Model Runner V1 (VLLM_USE_V2_MODEL_RUNNER=0), whose draft window is vllm-ascend's own,"
        if has_v1_window and v1_serves and versions.has_model_runner_v1()
        else ""
    )
    return (
        f"additional_config {keys} cannot be served on Model Runner V2 here: the draft "
        f"window could not hook this vLLM ({versions.describe_versions()}; supported: "
        f"{supported.SUPPORTED}): {'; '.join(state.problems)}. Install a supported vLLM{v1} or "
        f"remove {KEY} from additional_config."
    )


def accept_own_keys() -> None:
    """Let vllm-ascend's strictly validated ``AscendConfig`` pass the window's own keys
    (``config.OWN_KEYS``) and ``draft_window_size="auto"``; where that fails, say so and go
    on (most deployments never set them, and a plugin error would stop every vLLM start-up).
    """
    try:
        _accept_own_keys()
    except Exception as error:
        logger.warning(
            "Could not let vllm-ascend's AscendConfig accept %s and %s=%s (%s: %s); "
            "vllm-ascend may reject them as unknown or invalid.",
            " and ".join(OWN_KEYS),
            KEY,
            AUTO,
            type(error).__name__,
            error,
        )


def _accept_own_keys() -> None:
    """Let vllm-ascend's strictly validated ``AscendConfig`` pass the window's own keys.

    vllm-ascend builds ``AscendConfig`` from the keys of ``additional_config``. Releases up
    to 0.26.0rc1 read the keys they know and ignore the rest. A later config migration
    makes it a pydantic dataclass with ``extra="forbid"`` that declares
    ``draft_window_size`` but not ``draft_attention_sinks`` or ``draft_window_min_context``,
    so either would stop start-up as an unknown option. They are this package's and are
    validated by ``DraftWindowConfig`` where the MRV2 hooks read them, so they alone are
    dropped before vllm-ascend validates the rest: typos are still rejected and every other
    value is still coerced. A config that ignores unknown keys, or declares all of them
    itself, is left as it is; one it declares is passed on.

    Its ``draft_window_size: int | None`` would also reject ``"auto"``, which only the MRV2
    window resolves (from ``additional_config``, read by the hooks themselves): where the
    declared field rejects it, ``"auto"`` reaches ``AscendConfig`` as None. Its
    ``draft_window_size`` feeds only vllm-ascend's Model Runner V1 window, and a Model
    Runner V1 config with ``"auto"`` stops in the config check (``policy.check_start_up``).
    """
    from pydantic import BaseModel
    from pydantic.dataclasses import is_pydantic_dataclass, rebuild_dataclass

    try:
        module = importlib.import_module(supported.STRICT_CONFIG[0])
    except ModuleNotFoundError as exc:
        package = supported.STRICT_CONFIG[0].split(".")[0]
        if exc.name != package and not (exc.name or "").startswith(f"{package}."):
            raise
        return
    ascend_config = getattr(module, supported.STRICT_CONFIG[1], None)
    if is_pydantic_dataclass(ascend_config):
        extra = ascend_config.__pydantic_config__.get("extra")
    elif isinstance(ascend_config, type) and issubclass(ascend_config, BaseModel):
        extra = ascend_config.model_config.get("extra")
    else:
        return
    fields = ascend_config.__pydantic_fields__
    undeclared = tuple(key for key in OWN_KEYS if key not in fields)
    if extra != "forbid" or not (undeclared or _rejects_auto(fields.get(KEY))):
        return
    if patches.is_replaced(ascend_config, "__init__"):
        return
    if is_pydantic_dataclass(ascend_config):
        # NOTE: pydantic completes a dataclass whose annotations were unresolved when it was
        # defined (vllm-ascend's name classes defined below it) on first use, and doing so
        # sets a new __init__ that would drop the wrapper below; complete it first.
        rebuild_dataclass(ascend_config)

    # After the rebuild: the field's annotation resolved.
    rejects_auto = _rejects_auto(ascend_config.__pydantic_fields__.get(KEY))

    def drop_own_keys(own_init):
        init = own_init if own_init is not None else ascend_config.__init__  # or inherited

        @functools.wraps(init)
        def __init__(self, *args, **kwargs) -> None:
            for key in undeclared:
                kwargs.pop(key, None)
            if rejects_auto and kwargs.get(KEY) == AUTO:
                kwargs[KEY] = None
            init(self, *args, **kwargs)

        return __init__

    patches.replace(ascend_config, "__init__", drop_own_keys)


def _rejects_auto(field) -> bool:
    """Whether a declared ``draft_window_size`` field (pydantic's ``FieldInfo``; None:
    undeclared) rejects ``"auto"``: vllm-ascend's ``int | None`` does, the upstream patch's
    ``int | Literal["auto"] | None`` does not."""
    from pydantic import TypeAdapter, ValidationError

    if field is None:
        return False
    try:
        TypeAdapter(field.annotation).validate_python(AUTO)
    except ValidationError:
        return True
    except Exception:
        # An annotation not resolved yet (completed on first use): taken as the release's.
        return True
    return False
