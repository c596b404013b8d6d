# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""The Python make setup builds every test environment from (``PYTHON``, ``python3`` unless
given): 3.11, the one version all the pinned wheels exist for (``vllm-ascend 0.26.0rc1``'s
cp311 wheel, the local ``torch 2.13.0+cpu`` wheel). Any other stops setup here, before
anything is installed, with one message naming the interpreter, its version and the fix.

Written for any Python a newcomer may have as ``python3`` (no f-strings).
"""

import sys

NEEDED = (3, 11)


def problem(executable, version):
    """The message for an interpreter of ``version`` (major, minor, ...), or None."""
    if tuple(version[:2]) == NEEDED:
        return None
    return (
        "make setup: {0} is Python {1}; the test environments need Python {2} (the pinned "
        "wheels are cp311): install it and name it to make (make setup PYTHON=python{2})."
    ).format(executable, ".".join(str(v) for v in version[:3]), ".".join(str(v) for v in NEEDED))


def main():
    found = problem(sys.executable, tuple(sys.version_info))
    if found:
        sys.stderr.write(found + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
