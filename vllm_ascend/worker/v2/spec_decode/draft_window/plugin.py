"""The ``vllm.general_plugins`` entry point.

vLLM calls every general plugin in each process it starts (engine core and workers), so
``register`` must be cheap and safe to call more than once. It works with or without
vllm-ascend installed: the hooks wrap vLLM's own speculator classes, which vllm-ascend's
MRV2 speculators subclass and call through ``super()``. Besides the hooks it adjusts the
two places outside them that see the window's keys: the choice of model runner, and
vllm-ascend's own validation of ``additional_config``.
"""

import copy
import functools
import importlib

from vllm_ascend.worker.v2.spec_decode.draft_window.config import (
    KEY,
    SINKS_KEY,
    DraftWindowConfig,
)

_LIFT_MARK = "__draft_window_lifts_v1_fallback__"
_SINKS_MARK = "__draft_window_drops_sinks_key__"
_REFUSE_MARK = "__draft_window_refuses_sinks_on_v1__"


def register() -> None:
    """Install the draft window into vLLM's Model Runner V2 speculators."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import hooks

    hooks.install()
    lift_v1_fallback()
    refuse_sinks_on_v1()
    accept_sinks_key()


def lift_v1_fallback() -> None:
    """Keep Model Runner V2 when it was asked for and only the window forces V1.

    A vllm-ascend release may answer ``VllmConfig.use_v2_model_runner`` with V1 whenever
    ``draft_window_size`` is set, because its V2 runner had no window. Detected by
    behaviour: with ``VLLM_USE_V2_MODEL_RUNNER=1`` set and the answer V1, the same
    question is asked of a copy without the key; if that answers V2, the key alone forced
    V1, and V2 is kept. Any other reason for V1 stands.
    """
    from vllm.config import VllmConfig

    prop = VllmConfig.__dict__.get("use_v2_model_runner")
    if not isinstance(prop, property) or hasattr(prop.fget, _LIFT_MARK):
        return
    original = prop.fget

    @functools.wraps(original)
    def use_v2_model_runner(self) -> bool:
        return original(self) or _only_the_window_forces_v1(self, original)

    setattr(use_v2_model_runner, _LIFT_MARK, original)
    VllmConfig.use_v2_model_runner = property(use_v2_model_runner)


def _only_the_window_forces_v1(vllm_config, use_v2_model_runner) -> bool:
    from vllm import envs
    from vllm.logger import init_logger

    additional = vllm_config.additional_config
    if not envs.VLLM_USE_V2_MODEL_RUNNER or not isinstance(additional, dict):
        return False
    if additional.get(KEY) is None:
        return False
    probe = copy.copy(vllm_config)
    probe.additional_config = {k: v for k, v in additional.items() if k != KEY}
    if not use_v2_model_runner(probe):
        return False
    init_logger("vllm.draft_window").info_once(
        "VLLM_USE_V2_MODEL_RUNNER=1 with %s: the installed fallback to Model Runner V1 "
        "is lifted, since Model Runner V2 now supports the draft window.",
        KEY,
    )
    return True


def refuse_sinks_on_v1() -> None:
    """Stop start-up when ``draft_attention_sinks`` > 0 would run on Model Runner V1.

    Only the MRV2 hooks keep sinks; vllm-ascend's V1 draft window has none, and a setting
    silently ignored would change what the draft attends to. Checked once each
    ``VllmConfig`` is complete (``__post_init__``), in the process that builds it, after
    every plugin and platform patch has settled how ``use_v2_model_runner`` answers: a
    vllm-ascend release replaces that property, possibly after this plugin has run. A set
    sinks key is validated there (it needs ``draft_window_size``), with a draft or not;
    sinks 0 or unset, or no speculative config, change nothing else.
    """
    from vllm.config import VllmConfig

    post_init = VllmConfig.__dict__.get("__post_init__")
    if post_init is None or hasattr(post_init, _REFUSE_MARK):
        return

    @functools.wraps(post_init)
    def __post_init__(self) -> None:
        post_init(self)
        _refuse_sinks_on_v1(self)

    setattr(__post_init__, _REFUSE_MARK, post_init)
    VllmConfig.__post_init__ = __post_init__


def _refuse_sinks_on_v1(vllm_config) -> None:
    additional = vllm_config.additional_config
    if not isinstance(additional, dict) or additional.get(SINKS_KEY) is None:
        return
    # Validated wherever it is set, a draft or not: it needs draft_window_size.
    sinks = DraftWindowConfig.from_additional_config(additional).draft_attention_sinks
    if vllm_config.speculative_config is None:
        return
    if sinks > 0 and not vllm_config.use_v2_model_runner:
        raise ValueError(
            f"{SINKS_KEY}={sinks} needs Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1): "
            "vllm-ascend's Model Runner V1 draft window has no attention sinks. "
            f"Set VLLM_USE_V2_MODEL_RUNNER=1 or remove {SINKS_KEY}."
        )


def accept_sinks_key() -> None:
    """Let vllm-ascend's strictly validated ``AscendConfig`` pass ``draft_attention_sinks``;
    where that fails, say so and go on (most deployments never set the key, and a plugin
    error would stop every vLLM start-up).
    """
    try:
        _accept_sinks_key()
    except Exception as error:
        from vllm.logger import init_logger

        init_logger("vllm.draft_window").warning(
            "Could not let vllm-ascend's AscendConfig accept %s (%s: %s); vllm-ascend may "
            "reject the key as unknown.",
            SINKS_KEY,
            type(error).__name__,
            error,
        )


def _accept_sinks_key() -> None:
    """Let vllm-ascend's strictly validated ``AscendConfig`` pass ``draft_attention_sinks``.

    vllm-ascend builds ``AscendConfig`` from the keys of ``additional_config``. Releases up
    to 0.26.0rc1 read the keys they know and ignore the rest. A later config migration
    makes it a pydantic dataclass with ``extra="forbid"`` that declares
    ``draft_window_size`` but not the sinks, so the sinks key would stop start-up as an
    unknown option. The key is this package's and is validated by ``DraftWindowConfig``
    where the MRV2 hooks read it, so it alone is dropped before vllm-ascend validates the
    rest: typos are still rejected and every other value is still coerced. A config that
    ignores unknown keys, or declares the sinks itself, is left as it is.
    """
    from pydantic import BaseModel
    from pydantic.dataclasses import is_pydantic_dataclass, rebuild_dataclass

    try:
        module = importlib.import_module("vllm_ascend.ascend_config")
    except ModuleNotFoundError as exc:
        if exc.name != "vllm_ascend" and not (exc.name or "").startswith("vllm_ascend."):
            raise
        return
    ascend_config = getattr(module, "AscendConfig", None)
    if is_pydantic_dataclass(ascend_config):
        extra = ascend_config.__pydantic_config__.get("extra")
    elif isinstance(ascend_config, type) and issubclass(ascend_config, BaseModel):
        extra = ascend_config.model_config.get("extra")
    else:
        return
    if extra != "forbid" or SINKS_KEY in ascend_config.__pydantic_fields__:
        return
    if hasattr(ascend_config.__init__, _SINKS_MARK):
        return
    if is_pydantic_dataclass(ascend_config):
        # NOTE: pydantic completes a dataclass whose annotations were unresolved when it was
        # defined (vllm-ascend's name classes defined below it) on first use, and doing so
        # sets a new __init__ that would drop the wrapper below; complete it first.
        rebuild_dataclass(ascend_config)
    init = ascend_config.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs) -> None:
        kwargs.pop(SINKS_KEY, None)
        init(self, *args, **kwargs)

    setattr(__init__, _SINKS_MARK, init)
    ascend_config.__init__ = __init__
