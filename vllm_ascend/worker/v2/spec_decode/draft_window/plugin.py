"""The ``vllm.general_plugins`` entry point.

vLLM calls every general plugin in each process it starts (engine core and workers), so
``register`` must be cheap and safe to call more than once. It works with or without
vllm-ascend installed: the hooks wrap vLLM's own speculator classes, which vllm-ascend's
MRV2 speculators subclass and call through ``super()``.
"""

import copy
import functools

from vllm_ascend.worker.v2.spec_decode.draft_window.config import KEY

_LIFT_MARK = "__draft_window_lifts_v1_fallback__"


def register() -> None:
    """Install the draft window into vLLM's Model Runner V2 speculators."""
    from vllm_ascend.worker.v2.spec_decode.draft_window import hooks

    hooks.install()
    lift_v1_fallback()


def lift_v1_fallback() -> None:
    """Keep Model Runner V2 when it was asked for and only the window forces V1.

    A vllm-ascend release may answer ``VllmConfig.use_v2_model_runner`` with V1 whenever
    ``draft_window_size`` is set, because its V2 runner had no window. Detected by
    behaviour: with ``VLLM_USE_V2_MODEL_RUNNER=1`` set and the answer V1, the same
    question is asked of a copy without the key; if that answers V2, the key alone forced
    V1, and V2 is kept. Any other reason for V1 stands.
    """
    from vllm import envs
    from vllm.config import VllmConfig
    from vllm.logger import init_logger

    prop = VllmConfig.__dict__.get("use_v2_model_runner")
    if not isinstance(prop, property) or hasattr(prop.fget, _LIFT_MARK):
        return
    original = prop.fget
    logger = init_logger("vllm.draft_window")

    @functools.wraps(original)
    def use_v2_model_runner(self) -> bool:
        if original(self):
            return True
        additional = self.additional_config
        if not envs.VLLM_USE_V2_MODEL_RUNNER or not isinstance(additional, dict):
            return False
        if additional.get(KEY) is None:
            return False
        probe = copy.copy(self)
        probe.additional_config = {k: v for k, v in additional.items() if k != KEY}
        if not original(probe):
            return False
        logger.info_once(
            "VLLM_USE_V2_MODEL_RUNNER=1 with %s: the installed fallback to Model Runner V1 "
            "is lifted, since Model Runner V2 now supports the draft window.",
            KEY,
        )
        return True

    setattr(use_v2_model_runner, _LIFT_MARK, original)
    VllmConfig.use_v2_model_runner = property(use_v2_model_runner)
