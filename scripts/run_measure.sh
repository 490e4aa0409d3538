#!/usr/bin/env bash
# Measures a server the way every change is measured: `dsv4 bench sweep` (the 17*23 gate, then
# concurrency 1, 8, 16 with 8, 32, 48 prompts) into bench-results/LABEL/, starting `dsv4 serve`
# with the given arguments first when nothing answers on the port (and stopping it afterwards).
#
#   scripts/run_measure.sh LABEL [dsv4 serve args...]
#   nohup scripts/run_measure.sh flash-fp4 --model /models/flash --backend cuda >/dev/null 2>&1 &
#   tail -f bench-results/flash-fp4/sweep.log     # done when the last line is ALL_DONE_flash-fp4
#
# The last line of bench-results/LABEL/sweep.log is always ALL_DONE_LABEL (after a failure too);
# the line before it is "status: ok" or "status: failed: ...". The exit status says the same.
# Environment: DSV4 (the binary; default build/src/dsv4), RESULTS (the folder of the LABEL
# folders; bench-results), HOST (127.0.0.1), PORT (8000),
# READY_TIMEOUT (seconds to wait for a started server; 1800), SWEEP_ARGS (more `bench sweep`
# options, e.g. "--endpoint /v1/chat/completions --random-input-len 1024 --random-output-len 256").
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: $0 LABEL [dsv4 serve args...]" >&2
  exit 2
fi
label=$1
shift
dsv4=${DSV4:-build/src/dsv4}
host=${HOST:-127.0.0.1}
port=${PORT:-8000}
out=${RESULTS:-bench-results}/$label
mkdir -p "$out"
log=$out/sweep.log
: >"$log"

finish() {  # a last word in the log when the sweep itself could not write one
  if [ "$(tail -n 1 "$log" 2>/dev/null)" != "ALL_DONE_$label" ]; then
    echo "status: failed: $1" >>"$log"
    echo "ALL_DONE_$label" >>"$log"
  fi
}

answers() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }

server_pid=""
sweep_pid=""
stop_server() {
  [ -n "$sweep_pid" ] && kill "$sweep_pid" 2>/dev/null
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null
  fi
}
trap stop_server EXIT
trap 'finish "interrupted"; exit 130' INT TERM

if [ ! -x "$dsv4" ]; then
  finish "no dsv4 binary at $dsv4 (set DSV4=...)"
  exit 1
fi
ready_timeout=0
if answers; then
  echo "run_measure: a server answers on $host:$port; measuring it" >&2
else
  if [ $# -eq 0 ]; then
    finish "nothing answers on $host:$port and no server arguments were given"
    exit 1
  fi
  echo "run_measure: starting $dsv4 serve $* (log: $out/server.log)" >&2
  "$dsv4" serve --host "$host" --port "$port" "$@" >"$out/server.log" 2>&1 &
  server_pid=$!
  ready_timeout=${READY_TIMEOUT:-1800}
fi

# The sweep waits for the server's /v1/models; if the server dies meanwhile, stop waiting.
# shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
"$dsv4" bench sweep --base-url "http://$host:$port" --label "$label" --result-dir "$out" \
  --ready-timeout "$ready_timeout" ${SWEEP_ARGS:-} >"$out/bench.log" 2>&1 &
sweep_pid=$!
server_died=0
while kill -0 "$sweep_pid" 2>/dev/null; do
  if [ -n "$server_pid" ] && ! kill -0 "$server_pid" 2>/dev/null; then
    kill "$sweep_pid" 2>/dev/null
    wait "$sweep_pid" 2>/dev/null
    finish "the server exited (see $out/server.log)"
    server_died=1
    break
  fi
  sleep 1
done
wait "$sweep_pid" 2>/dev/null
status=$?
[ "$server_died" = 1 ] && status=1
sweep_pid=""
finish "bench sweep exited with status $status (see $out/bench.log)"
[ "$(tail -n 2 "$log" | head -n 1)" = "status: ok" ] || [ "$status" -ne 0 ] || status=1
echo "run_measure: $(tail -n 2 "$log" | head -n 1) ($out)" >&2
exit $status
