#!/usr/bin/env bash
# The app's own packages (requirements.txt) for the lent GPU machine's Python 3.12, as one folder to unpack
# beside the vLLM bundle: .gpu/app/appsite.tar.xz, for `bash scripts/gpu_run.sh chat` (see there).
# Needs the package index (run it here, not on the GPU machine). Left out: what the vLLM bundle already has
# (the app finds it on the path after its own folder), the plotting library (benchmark plots only), and
# packages that only other packages' optional integrations name (model SDKs, the hub client).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/pip}"
W=$(mktemp -d /tmp/appsite-build.XXXX)
trap 'rm -rf "$W"' EXIT
grep -v -E '^\s*(#|$)|^matplotlib' requirements.txt > "$W/req.txt"
PLATFORM=(--only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --python-version 3.12 --implementation cp)
mkdir -p "$W/wheels"
# A few of Chainlit's dependencies exist only as source: build those as (pure-Python) wheels, then download.
for _ in $(seq 1 20); do
  if out=$("$PIP" download -q -d "$W/wheels" -r "$W/req.txt" --find-links "$W/wheels" "${PLATFORM[@]}" 2>&1); then
    break
  fi
  missing=$(grep -o 'No matching distribution found for [^ ]*' <<<"$out" | awk '{print $6}') || true
  [ -n "$missing" ] || { echo "$out" >&2; exit 1; }
  "$PIP" wheel -q --no-deps -w "$W/wheels" "$missing"
done
BUNDLE=.gpu/gpubundle.tar.xz
in_bundle=$(tar tf "$BUNDLE" | sed -n 's#.*/wheels/\([^-]*\)-.*#\1#p' | tr 'A-Z.-' 'a-z__' | sort -u)
unused="anthropic tiktoken tokenizers hf_xet huggingface_hub regex fsspec filelock posthog"
keep=()
for whl in "$W"/wheels/*.whl; do
  name=$(basename "$whl" | sed 's/-.*//' | tr 'A-Z.-' 'a-z__')
  grep -qx "$name" <<<"$in_bundle" && continue
  [[ " $unused " == *" $name "* ]] && continue
  keep+=("$whl")
done
"$PIP" install -q --no-deps --no-compile --disable-pip-version-check --target "$W/site" "${PLATFORM[@]}" "${keep[@]}"
rm -rf "$W/site/bin"  # console scripts with this machine's interpreter path: the GPU machine runs python3 -m
mkdir -p .gpu/app
tar cf - -C "$W/site" . | xz -T2 -6 > .gpu/app/appsite.tar.xz
echo "${#keep[@]} packages: $(du -h .gpu/app/appsite.tar.xz | cut -f1) in .gpu/app/appsite.tar.xz"
