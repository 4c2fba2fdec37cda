#!/usr/bin/env bash
# Runs INSIDE the image (make docker-smoke): the pipeline on the embedded data, then
# queries through the CLI and through the search service. Exits non-zero on any failure.
set -euo pipefail
cd /app
question="how tall is the eiffel tower"

# DVC needs a git repository; the image holds the project files, not a checkout.
git init -q
git add -A
git commit -q -m "image contents"

start=$(date +%s)
qpr data ensure            # regenerates the embedded logs offline, byte for byte as data.dvc pins
dvc repro
echo "smoke: dvc repro took $(( $(date +%s) - start )) s"
dvc status
cat metrics/register.json   # the register stage's decision (the first model: champion)

qpr search "$question" -k 5 --json | tee /tmp/search.json
python3 - <<'PY'
import json

result = json.load(open("/tmp/search.json"))
assert len(result["hits"]) == 5, result
print(f"smoke: qpr search ok, best hit {result['hits'][0]['text']!r}")
PY

# The search service on the bundle the pipeline just built.
qpr serve --models-dir models --host 127.0.0.1 --port 8000 > /tmp/serve.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
python3 - "$question" <<'PY'
import json
import sys
import time
import urllib.error
import urllib.request

base = "http://127.0.0.1:8000"
for _ in range(120):
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
            if response.status == 200:
                break
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass
    time.sleep(1)
else:
    sys.exit("smoke: the service never became ready: " + open("/tmp/serve.log").read()[-2000:])
request = urllib.request.Request(
    f"{base}/search",
    data=json.dumps({"question": sys.argv[1], "k": 3}).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=10) as response:
    body = json.load(response)
print(json.dumps(body, indent=1)[:1500])
hits = body.get("hits") or body.get("results") or []
assert response.status == 200 and len(hits) == 3, body
print("smoke: POST /search ok")
PY
echo "smoke: all passed"
