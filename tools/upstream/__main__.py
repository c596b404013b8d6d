# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""``python -m tools.upstream patch`` writes the patch and the same change as a series of pull
requests (``make upstream-patch``); ``python -m tools.upstream tree DIR`` writes a patched
vllm-ascend source tree (the pristine sdist's ``vllm_ascend`` and ``tests``, the patch, or
with ``--parts N`` the series' first N parts, applied with ``git apply``)."""

import argparse
import sys
from pathlib import Path

from tools.upstream.patch import PARTS, RELEASE, patched_tree, write_patch, write_series


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.upstream")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("patch", help=f"write dist/vllm-ascend-{RELEASE}-draft-window.patch")
    tree = sub.add_parser("tree", help="write a patched vllm-ascend source tree")
    tree.add_argument("directory", type=Path)
    tree.add_argument("--pristine", action="store_true", help="without the patch")
    tree.add_argument(
        "--parts",
        type=int,
        choices=range(1, len(PARTS) + 1),
        help="the series' first PARTS pull requests instead of the whole patch",
    )
    args = parser.parse_args()
    if args.command == "patch":
        path, stat = write_patch()
        print(stat)
        print(f"wrote {path}")
        for path in write_series():
            print(f"wrote {path}")
    else:
        patched_tree(args.directory, apply=not args.pristine, parts=args.parts)
        print(f"wrote {args.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
