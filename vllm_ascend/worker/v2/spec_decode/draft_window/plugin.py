"""The ``vllm.general_plugins`` entry point.

vLLM calls every general plugin in each process it starts (engine core and workers), so
``register`` must be cheap and safe to call more than once.
"""

_registered = False


def register() -> None:
    """Install the draft window into vLLM's Model Runner V2 speculators.

    The MRV2 hooks land with the port issues; until then there is nothing to install,
    and the function only records that vLLM called it.
    """
    global _registered
    _registered = True


def is_registered() -> bool:
    return _registered
