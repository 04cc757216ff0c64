#!/usr/bin/env bash
# Installs requirements into a virtualenv with uv, the way pip would (make setup runs it; its output goes to the
# virtualenv's install.log). Usage: tools/install.sh VENV REQUIREMENT...
#
# uv installs the project's ~200 packages in a fraction of pip's time, but reads no pip configuration. So pip installs
# uv and torch first (torch at pyproject.toml's pin: where pip is configured with a CPU build on disk, it takes that one
# where uv would download PyPI's CUDA build), and uv gets pip's package indexes and find-links. Should uv fail, pip
# installs everything, as it did before.
set -euo pipefail
venv=$1
shift
py=$venv/bin/python
torch=$(grep -o '"torch==[^"]*"' "$(dirname "$0")/../pyproject.toml" | tr -d '"')

"$py" -m pip install --disable-pip-version-check --no-compile uv==0.13.9 "$torch"

# pip's settings, from its config files and PIP_* variables, as uv's options ("global.find-links='/opt/wheels'").
sources=()
while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    case ${key#*.} in
        index-url) sources+=(--index-url "$value") ;;
        extra-index-url) for url in $value; do sources+=(--extra-index-url "$url"); done ;;
        find-links) for url in $value; do sources+=(--find-links "$url"); done ;;
    esac
done < <("$py" -m pip config list 2>/dev/null)

# unsafe-best-match: the newest release on any index, as pip chooses (uv's default stops at the first index that has
# the package).
if ! "$venv/bin/uv" pip install --python "$py" --index-strategy unsafe-best-match "${sources[@]}" "$@"; then
    echo "uv could not install: installing with pip"
    "$py" -m pip install --disable-pip-version-check --no-compile "$@"
fi
