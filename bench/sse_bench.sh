#!/usr/bin/env bash
# Server-sent events side by side: Flotilla's proxy, Nchan (nginx module) and
# Pushpin, with the same load generator (bench/src/bin/sse_load.rs).
#
#   bench/sse_bench.sh idle   [targets…]   memory per idle connection
#   bench/sse_bench.sh fanout [targets…]   deliveries/s and latency
#     (SPECS="1000 200,10000 20" sets the cases: subscribers and messages/s)
#   bench/sse_bench.sh auth                subscribe cost with a cached token
#
# targets: flotilla nchan pushpin (default: all three). Needs nginx,
# libnginx-mod-nchan and pushpin from Debian; runs as root (it starts zurl on
# its default socket paths). Each process here may hold 20,000 open files, so
# the generator runs as several processes, each with at most 9,000 connections,
# spread over source addresses 127.0.0.2-127.0.0.9.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p flotilla -p flotilla-bench
BIN=$PWD/target/release/flotilla
LOAD=$PWD/target/release/sse_load
work=$(mktemp -d)
SOURCES=127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6,127.0.0.7,127.0.0.8,127.0.0.9
declare -a SERVER_PIDS=()
declare -a EXTRA_PIDS=()

cleanup() {
  stop_server
  pkill -f "$LOAD subscribe" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

descendants() { # pid → pid and all its descendants
  local pid=$1
  echo "$pid"
  for child in $(pgrep -P "$pid" 2>/dev/null); do descendants "$child"; done
}

server_pids() {
  for pid in "${SERVER_PIDS[@]}"; do descendants "$pid"; done | sort -u
}

rss_kib() { # sum of VmRSS of the server's processes
  local total=0
  for pid in $(server_pids); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

cpu_ticks() { # utime + stime of the server's processes
  local total=0
  for pid in $(server_pids); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

wait_port() {
  for _ in $(seq 1 200); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "port $1 did not open" >&2
  return 1
}

# Starts `flotilla proxy` on config $1 (listening on 18081) as the server.
run_flotilla_proxy() {
  RUST_LOG=warn "$BIN" proxy --config "$1" > "$work/flotilla.log" 2>&1 &
  SERVER_PIDS=($!)
  wait_port 18081
  BASE=http://127.0.0.1:18081
  RAMP=10000
}

start_flotilla() {
  cat > "$work/proxy.toml" <<EOF
[http]
bind_address = "127.0.0.1:18081"
max_connections = 19900
keepalive_interval_sec = 15
connection_timeout_sec = 0
[jwt_verifier]
require_authentication = false
[publisher]
api_keys = ["bench-key"]
[rate_limit]
rate_limit_per_ip = 10000000
EOF
  run_flotilla_proxy "$work/proxy.toml"
  PUBLISH_BASE=$BASE
}

start_nchan() {
  mkdir -p "$work/nginx/logs"
  cat > "$work/nginx/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ngx_nchan_module.so;
worker_processes 2;
worker_rlimit_nofile 20000;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 19000; multi_accept on; }
http {
  access_log off;
  nchan_shared_memory_size 256M;
  server {
    listen 127.0.0.1:18082 backlog=4096;
    location ~ ^/pub/(\w+)$ { nchan_publisher; nchan_channel_id \$1; nchan_message_buffer_length 1000; }
    location ~ ^/sub/(\w+)$ { nchan_subscriber eventsource; nchan_channel_id \$1; }
  }
}
EOF
  nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' &
  SERVER_PIDS=($!)
  wait_port 18082
  BASE=http://127.0.0.1:18082 PUBLISH_BASE=http://127.0.0.1:18082
  RAMP=10000
}

start_pushpin() {
  mkdir -p "$work/pushpin/run" "$work/pushpin/log" /var/run/zurl
  # zurl carries Pushpin's requests to its origin; its shipped config refuses 127.*.
  sed -e 's/^deny=.*/deny=/' /etc/zurl.conf > "$work/zurl.conf"
  zurl --config="$work/zurl.conf" > "$work/zurl.log" 2>&1 &
  EXTRA_PIDS+=($!)
  "$LOAD" origin --listen 127.0.0.1:18084 > "$work/origin.log" 2>&1 &
  EXTRA_PIDS+=($!)
  echo "* 127.0.0.1:18084" > "$work/pushpin/routes"
  cat > "$work/pushpin/pushpin.conf" <<EOF
[global]
include=/usr/lib/pushpin/internal.conf
rundir=$work/pushpin/run
ipc_prefix=pushpin-
port_offset=0
[runner]
services=condure,pushpin-proxy,pushpin-handler
http_port=18083
logdir=$work/pushpin/log
log_level=1
client_buffer_size=8192
client_maxconn=50000
condure_bin=condure
[proxy]
routesfile=routes
sig_key=bench
updates_check=off
[handler]
push_in_spec=tcp://127.0.0.1:5560
push_in_sub_specs=tcp://127.0.0.1:5562
push_in_http_addr=127.0.0.1
push_in_http_port=5561
stats_spec=ipc://{rundir}/{ipc_prefix}stats
command_spec=tcp://127.0.0.1:5563
# The shipped 2500 messages/s cap per subscriber would throttle the fan-out.
message_rate=-1
message_hwm=10000000
message_wait=5000
EOF
  (ulimit -n 20000; pushpin --config="$work/pushpin/pushpin.conf" > "$work/pushpin.log" 2>&1) &
  SERVER_PIDS=($!)
  wait_port 18083
  wait_port 5561
  BASE=http://127.0.0.1:18083 PUBLISH_BASE=http://127.0.0.1:5561
  # Pushpin answers 502 to bursts of new connections: ramp up slowly.
  RAMP=500
}

stop_server() {
  for pid in $(server_pids 2>/dev/null) "${EXTRA_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}" "${EXTRA_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
  EXTRA_PIDS=()
  sleep 1
}

# subscribers TARGET COUNT EXPECT REPORT_PREFIX → starts generator processes, waits until ready
declare -a GEN_PIDS=()
subscribers() {
  local target=$1 count=$2 expect=$3 prefix=$4
  local per=9000 n=0 i=0
  GEN_PIDS=()
  [ "$count" -le 2000 ] && per=$(((count + 1) / 2))
  while [ "$n" -lt "$count" ]; do
    local take=$((count - n < per ? count - n : per))
    (ulimit -n 20000; exec "$LOAD" subscribe --target "$target" --base "$BASE" --topic bench \
      --connections "$take" --sources "$SOURCES" --expect "$expect" --hold 600 --ramp "$RAMP" \
      --report "$prefix.$i.json" ${TOKEN:+--token "$TOKEN"}) > "$prefix.$i.log" 2>&1 &
    GEN_PIDS+=($!)
    n=$((n + take)); i=$((i + 1))
  done
  # The logs are created by the background processes: name them, never glob them.
  for ((j = 0; j < i; j++)); do
    for _ in $(seq 1 6000); do grep -q '^ready' "$prefix.$j.log" 2>/dev/null && break; sleep 0.05; done
  done
  grep -h '^ready' "$prefix".*.log | awk '{s += $2} END {print "connected", s}'
}

idle_case() {
  local target=$1 count=$2
  "start_$target"
  sleep 2
  local before
  before=$(rss_kib)
  subscribers "$target" "$count" 0 "$work/idle-$target-$count" > "$work/idle.ready"
  sleep 5
  local after
  after=$(rss_kib)
  local connected
  connected=$(awk '{print $2}' "$work/idle.ready")
  echo "| $target | $count | $connected | $((before / 1024)) | $((after / 1024)) | $(awk -v a="$after" -v b="$before" -v n="$connected" 'BEGIN {printf "%.2f", (a - b) / n}') |"
  for pid in "${GEN_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait "${GEN_PIDS[@]}" 2>/dev/null || true
  stop_server
}

fanout_case() {
  local target=$1 subs=$2 rate=$3 seconds=${4:-10}
  local count=$((rate * seconds))
  "start_$target"
  sleep 1
  subscribers "$target" "$subs" "$count" "$work/fan-$target-$subs-$rate" > /dev/null
  sleep 1
  local cpu_before
  cpu_before=$(cpu_ticks)
  "$LOAD" publish --target "$target" --base "$PUBLISH_BASE" --topic bench --count "$count" --rate "$rate" --key bench-key > "$work/publish.log"
  wait "${GEN_PIDS[@]}" 2>/dev/null || true
  local cpu_after
  cpu_after=$(cpu_ticks)
  local summary
  summary=$("$LOAD" merge "$work/fan-$target-$subs-$rate".*.json)
  python3 - "$target" "$subs" "$rate" "$seconds" "$summary" "$(( (cpu_after - cpu_before) ))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
target, subs, rate, seconds, summary, ticks, hz = sys.argv[1:]
s = json.loads(summary)
# Every published message to every subscriber (messages nobody received count too).
lost = int(rate) * int(seconds) * int(subs) - s["deliveries"]
rate_per_s = s["deliveries"] / float(seconds)
print(f"| {target} | {subs} | {int(rate) * int(subs):,} | {rate_per_s:,.0f} | {lost:,} | {s['delivery_p50_ms']:.1f} | {s['delivery_p99_ms']:.1f} | {s['last_subscriber_p99_ms']:.1f} | {int(ticks) / int(hz):.1f} | {s['generator_cpu_seconds']:.1f} |")
PY
  stop_server
}

auth_case() {
  # Subscribe cost with a cached token: a webhook that accepts everything, one
  # token, many sequential subscriptions; server CPU per subscription.
  "$LOAD" origin --listen 127.0.0.1:18084 > /dev/null 2>&1 &
  EXTRA_PIDS+=($!)
  python3 -c '
import http.server, json, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"valid": True, "user_id": "bench", "expires_at": int(time.time()) + 3600}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 18085), H).serve_forever()' &
  EXTRA_PIDS+=($!)
  wait_port 18085
  cat > "$work/proxy-auth.toml" <<EOF
[http]
bind_address = "127.0.0.1:18081"
max_connections = 19900
[jwt_verifier]
webhook_url = "http://127.0.0.1:18085/verify"
require_authentication = true
[rate_limit]
rate_limit_per_ip = 10000000
EOF
  run_flotilla_proxy "$work/proxy-auth.toml"
  local before
  before=$(cpu_ticks)
  TOKEN=bench-token subscribers flotilla 5000 0 "$work/auth" > "$work/auth.ready"
  local after
  after=$(cpu_ticks)
  awk -v a="$after" -v b="$before" -v hz="$(getconf CLK_TCK)" '{printf "| 5000 subscriptions, one cached token | %s connected | server CPU %.1f µs per subscription |\n", $2, (a - b) / hz / $2 * 1e6}' "$work/auth.ready"
  for pid in "${GEN_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  stop_server
}

mode=${1:-fanout}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(flotilla nchan pushpin)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%F)"
case "$mode" in
  idle)
    echo "| server | subscribers asked | connected | server RSS before MiB | after MiB | KiB per connection |"
    echo "|---|---|---|---|---|---|"
    for target in "${targets[@]}"; do
      idle_case "$target" 10000
      [ "$target" = flotilla ] && idle_case flotilla 19800
    done
    ;;
  fanout)
    echo "| server | subscribers | offered deliveries/s | delivered/s | lost | p50 ms | p99 ms | last subscriber p99 ms | server CPU s | generator CPU s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for target in "${targets[@]}"; do
      IFS=, read -r -a specs <<< "${SPECS:-1000 200,1000 300,1000 400,10000 20,10000 30}"
      for spec in "${specs[@]}"; do
        set -- $spec
        fanout_case "$target" "$1" "$2" 10
      done
    done
    ;;
  auth) auth_case ;;
  *) echo "usage: $0 idle|fanout|auth [targets…]" >&2; exit 2 ;;
esac
