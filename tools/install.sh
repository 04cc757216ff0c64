#!/usr/bin/env bash
# Installs requirements into a virtualenv with uv, the way pip would (make setup runs it; its output goes to the
# virtualenv's install.log). Usage: tools/install.sh VENV REQUIREMENT...
#
# uv installs the project's ~190 packages in a fraction of pip's time, but reads no pip configuration. So pip installs
# uv and torch first (torch at pyproject.toml's pin: where pip is configured with a CPU build on disk, it takes that one
# where uv would download PyPI's CUDA build), and uv is given the indexes, find-links and constraints pip would use.
# Should any of that fail, pip installs everything, as it did before, saying so (`uv could not install`).
set -euo pipefail
venv=$1
shift
py=$venv/bin/python
torch=$(grep -o '"torch==[^"]*"' "$(dirname "$0")/../pyproject.toml" | tr -d '"')

# What pip would use, its config files and PIP_* variables resolved by pip itself (a variable overrides a file), one
# uv option or value a line.
PIP_SOURCES='
from pip._internal.commands import create_command
options, _ = create_command("install").parse_args([])
lines = ["--no-index"] if options.no_index else ["--index-url", options.index_url]
for flag, values in (("--extra-index-url", options.extra_index_urls), ("--find-links", options.find_links),
                     ("--constraint", options.constraints)):
    for value in values:
        lines += [flag, value]
print("\n".join(lines))
'

with_uv() {
    "$py" -m pip install --disable-pip-version-check --no-compile uv==0.13.9 "$torch" || return 1
    local sources
    sources=$("$py" -c "$PIP_SOURCES") || return 1
    local -a options=()
    mapfile -t options <<< "$sources"
    # unsafe-best-match: the newest release on any index, as pip chooses (uv's default stops at the first index that
    # has the package).
    "$venv/bin/uv" pip install --python "$py" --index-strategy unsafe-best-match "${options[@]}" "$@"
}

if ! with_uv "$@"; then
    echo "uv could not install (above): installing with pip" >&2
    "$py" -m pip install --disable-pip-version-check --no-compile "$@"
fi
