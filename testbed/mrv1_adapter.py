# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Load single files of the released vllm-ascend wheel, such as the MRV1
`SlidingWindowAdapter`.

The whole `vllm_ascend` package imports torch_npu, which cannot load without CANN; the files
loaded here import only numpy, torch and vLLM at the top, so each is loaded alone.
"""

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

VLLM_ASCEND_VERSION = "0.26.0rc1"
WHEEL_DIR = Path(__file__).resolve().parents[1] / ".cache" / "wheels"
MEMBER = "vllm_ascend/spec_decode/utils.py"
MODULE_NAME = "released_vllm_ascend_spec_decode_utils"


def load_released_file(member: str, module_name: str) -> ModuleType:
    """A fresh module of `member` (a path inside the wheel), unpacked beside the wheel once."""
    wheels = sorted(WHEEL_DIR.glob(f"vllm_ascend-{VLLM_ASCEND_VERSION}-*.whl"))
    if not wheels:
        raise FileNotFoundError(
            f"no vllm_ascend-{VLLM_ASCEND_VERSION} wheel in {WHEEL_DIR}: run `make setup`"
        )
    target = WHEEL_DIR / f"vllm_ascend-{VLLM_ASCEND_VERSION}" / member
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            target.write_bytes(wheel.read(member))
    spec = importlib.util.spec_from_file_location(module_name, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_mrv1_adapter_module() -> ModuleType:
    if MODULE_NAME not in sys.modules:
        sys.modules[MODULE_NAME] = load_released_file(MEMBER, MODULE_NAME)
    return sys.modules[MODULE_NAME]
