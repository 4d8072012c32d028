#!/usr/bin/env bash
# Render the HTML report of a small demo experiment and take a full-page screenshot of it in
# headless Chromium (Debian's `chromium` package), for a person to look at.
#
#   benchmarks/report_screenshot.sh [DIR] [OUT.png]
#
# DIR defaults to /tmp/enkflow-report-demo (emptied by `enkflow demo`), OUT.png to DIR/report.png.
set -euo pipefail
dir=${1:-/tmp/enkflow-report-demo}
out=${2:-$dir/report.png}
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
"$py" -m enkflow demo --dir "$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
page=$(tail -1 "$dir.log" | sed -n 's/^report: //p')
[ -n "$page" ] || page=$("$py" -m enkflow report "$dir" --html --truth "$dir/truth/truth_{cycle:04d}.nc")
browser=$(command -v chromium || command -v chromium-browser)
"$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,3600 \
  --screenshot="$out" "file://$page" 2>/dev/null
echo "$out"
