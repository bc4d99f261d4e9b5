#!/bin/sh
# Checks the HTML report's script (analyze/report_assets/report.js) parses:
# node --check. SKIP (77) without node.
set -eu
node=$(command -v node || command -v nodejs || true)
if [ -z "$node" ]; then
  echo "SKIP: no node"
  exit 77
fi
exec "$node" --check "$1"
