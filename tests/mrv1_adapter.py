"""Load the released MRV1 `SlidingWindowAdapter` from the vllm-ascend wheel.

The whole `vllm_ascend` package imports torch_npu, which cannot load without CANN; the one
file that holds the adapter imports only numpy, torch and vLLM, so it is loaded alone.
"""

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

VLLM_ASCEND_VERSION = "0.26.0rc1"
WHEEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "wheels"
MEMBER = "vllm_ascend/spec_decode/utils.py"
MODULE_NAME = "released_vllm_ascend_spec_decode_utils"


def load_mrv1_adapter_module() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    wheels = sorted(WHEEL_DIR.glob(f"vllm_ascend-{VLLM_ASCEND_VERSION}-*.whl"))
    if not wheels:
        raise FileNotFoundError(
            f"no vllm_ascend-{VLLM_ASCEND_VERSION} wheel in {WHEEL_DIR}: run `make setup`"
        )
    target = WHEEL_DIR / f"vllm_ascend-{VLLM_ASCEND_VERSION}" / MEMBER
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            target.write_bytes(wheel.read(MEMBER))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module
