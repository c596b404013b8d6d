#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
#
# One pinned file of requirements/pinned-files.txt, downloaded once into DIR and checked
# against its sha256; prints its path:
#   tools/fetch_pinned.sh DIR NAME==VERSION
# A download can arrive damaged (pip then stops on the index's hash, and a clean CI machine
# has nothing cached): up to three tries. PYTHON is the interpreter whose pip downloads (an
# sdist's metadata step runs in it, --no-build-isolation); the environment passes through
# (SOC_VERSION for vllm-ascend's sdists).
set -euo pipefail
DIR=$1
SPEC=$2
read -r FILE SHA256 < <(awk -v spec="$SPEC" '$1 == spec { print $2, $3 }' \
  "$(dirname "$0")/../requirements/pinned-files.txt") || true
if [ -z "${SHA256:-}" ]; then
  echo "tools/fetch_pinned.sh: $SPEC is not in requirements/pinned-files.txt" >&2
  exit 2
fi

matches() { echo "$SHA256  $DIR/$FILE" | sha256sum -c --status 2>/dev/null; }

mkdir -p "$DIR"
for try in 1 2 3; do
  if matches; then
    echo "$DIR/$FILE"
    exit 0
  fi
  rm -f "$DIR/$FILE"
  if [ "$try" != 1 ]; then
    echo "tools/fetch_pinned.sh: $SPEC did not arrive as $FILE with sha256 $SHA256: try $try of 3" >&2
    sleep 5
  fi
  "${PYTHON:-python3}" -m pip download -q --no-deps --no-build-isolation -d "$DIR" "$SPEC" >&2 || true
done
if matches; then
  echo "$DIR/$FILE"
  exit 0
fi
echo "tools/fetch_pinned.sh: $SPEC: no $DIR/$FILE with sha256 $SHA256 after 3 tries" >&2
exit 1
