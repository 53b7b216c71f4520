#!/usr/bin/env bash
# API load with N instances in the store (sim runtime: records without browsers).
# Load comes from wrk, a separate process, on the same machine.
#
#   bench/api_load.sh            # N=1000, 15 s per case
#   N=10000 DURATION=30s bench/api_load.sh
#
# Prints wrk's reports for: GET /v2/instances/{random id} and a 100-item list
# page, each at 32, 8 and 1 connection(s).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/flotilla}
N=${N:-1000}
DURATION=${DURATION:-15s}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release -p flotilla

work=$(mktemp -d)
trap 'kill $serve_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/bench.toml" <<EOF
[agent]
runtime = "sim"
max_instances = $((N + 10))
port_range = "1024-65535"
EOF
RUST_LOG=warn "$BIN" serve --listen 127.0.0.1:0 --data-dir "$work/data" --config "$work/bench.toml" > "$work/out" &
serve_pid=$!
for _ in $(seq 1 200); do grep -q "control plane listening" "$work/out" 2>/dev/null && break; sleep 0.05; done
url=$(awk '/control plane listening on/ {print $NF}' "$work/out")
echo "flotilla serve at $url (pid $serve_pid), seeding $N instances"

seq 1 "$N" | xargs -P 8 -I% curl -sf -o /dev/null -XPOST "$url/v2/instances" -d '{}'
offset=0
: > "$work/ids"
while :; do
  page=$(curl -sf "$url/v2/instances?limit=1000&offset=$offset")
  count=$(echo "$page" | python3 -c 'import json,sys; d=json.load(sys.stdin); [print(i["id"]) for i in d["instances"]]; print(len(d["instances"]), file=sys.stderr)' 2>&1 >> "$work/ids")
  [ "$count" -lt 1000 ] && break
  offset=$((offset + 1000))
done
echo "store holds $(wc -l < "$work/ids") instances"

cat > "$work/get.lua" <<EOF
local ids = {}
for line in io.lines("$work/ids") do ids[#ids + 1] = line end
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/v2/instances/" .. ids[math.random(#ids)])
end
EOF

run() {
  local name=$1; shift
  echo
  echo "### $name"
  local before after
  before=$(awk '{print $14+$15}' /proc/$serve_pid/stat)
  wrk "$@" --latency
  after=$(awk '{print $14+$15}' /proc/$serve_pid/stat)
  echo "server CPU during the run: $(( (after - before) / $(getconf CLK_TCK) )) s"
}
run "GET /v2/instances/{id}, 2 threads x 32 connections" -t2 -c32 -d"$DURATION" -s "$work/get.lua" "$url"
run "GET /v2/instances?limit=100, 2 threads x 32 connections" -t2 -c32 -d"$DURATION" "$url/v2/instances?limit=100"
run "GET /v2/instances/{id}, 2 threads x 8 connections" -t2 -c8 -d"$DURATION" -s "$work/get.lua" "$url"
run "GET /v2/instances?limit=100, 2 threads x 8 connections" -t2 -c8 -d"$DURATION" "$url/v2/instances?limit=100"
run "GET /v2/instances/{id}, 1 connection" -t1 -c1 -d"$DURATION" -s "$work/get.lua" "$url"
run "GET /v2/instances?limit=100, 1 connection" -t1 -c1 -d"$DURATION" "$url/v2/instances?limit=100"
