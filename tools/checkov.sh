#!/usr/bin/env bash
# Scan rendered manifests (and the effective pods of TrainJobs) with checkov, in its own
# virtualenv: checkov pins packaging 23.x, which conflicts with pulumi.
set -euo pipefail
manifests="${1:?usage: tools/checkov.sh out/<stack>/manifests}"
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/.venv-checkov"
if [ ! -x "$venv/bin/checkov" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$here/tools/checkov-requirements.txt"
fi
effective="$(dirname "$manifests")/effective"
"$here/.venv/bin/python" -m tools.effective_pods "$manifests" "$effective"
# one directory per run: with several -d flags checkov reports only the first one correctly
status=0
for dir in "$manifests" "$effective"; do
  echo "checkov: $dir"
  "$venv/bin/checkov" --config-file "$here/.checkov.yaml" -d "$dir" || status=1
done
exit $status
