#!/usr/bin/env bash
# A private Ray head on this machine, on free ports, stopped without touching any other Ray
# running here (`ray stop` would stop them all).
#   eval "$(bash scripts/local_ray.sh start)"      # exports RAY_HEAD_PID, RAY_DASHBOARD, RAY_AUTH_MODE
#   ray job submit --address "$RAY_DASHBOARD" --working-dir . -- python jobs/full_grid.py ...
#   bash scripts/local_ray.sh stop "$RAY_HEAD_PID"
# Extra `ray start` options (e.g. --num-gpus=1 for a logical GPU) go after `start`.
# Token authentication stays on: the head and `ray job submit` read the same token,
# ~/.ray/auth_token (made here if missing, readable by this user only). Ray's ports listen on
# every interface whatever --node-ip-address says; the token is what keeps them closed.
set -euo pipefail
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token

free_port() { python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

case "${1:-}" in
  start)
    shift
    ray get-auth-token --generate >/dev/null
    chmod 600 ~/.ray/auth_token
    dashboard=$(free_port)
    log=$(mktemp -t tabed-ray-head.XXXXXX.log)
    # --block keeps `ray start` in the foreground: signalling it stops exactly what it started
    setsid ray start --head --block --node-ip-address=127.0.0.1 --disable-usage-stats \
      --port="$(free_port)" --dashboard-port="$dashboard" --ray-client-server-port="$(free_port)" \
      --dashboard-agent-listen-port="$(free_port)" --dashboard-agent-grpc-port="$(free_port)" \
      --metrics-export-port="$(free_port)" --runtime-env-agent-port="$(free_port)" "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do
      # any HTTP answer (401 without the token included) means the dashboard is up
      if python -c "import sys, urllib.request, urllib.error
try: urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError: pass" "http://127.0.0.1:$dashboard/api/version" 2>/dev/null; then
        echo "export RAY_HEAD_PID=$pid RAY_DASHBOARD=http://127.0.0.1:$dashboard RAY_AUTH_MODE=token  # log: $log"
        exit 0
      fi
      kill -0 "$pid" 2>/dev/null || { echo "ray start failed; see $log" >&2; exit 1; }
      sleep 1
    done
    echo "the Ray dashboard did not come up in 120 s; see $log" >&2
    kill -TERM "$pid"; exit 1 ;;
  stop)
    pid="${2:?usage: local_ray.sh stop RAY_HEAD_PID}"
    port=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -o -- '--port=[0-9]*' | cut -d= -f2 || true)
    kill -TERM "$pid" 2>/dev/null || exit 0   # `ray start --block` drains its own processes on SIGTERM
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true  # whatever of its session is left
    # `ray start` recorded this head for later `ray.init()` calls to join: forget it
    record=$(python -c "from ray._common.utils import get_ray_address_file as f; print(f(None))" 2>/dev/null || true)
    if [ -n "$port" ] && [ -f "$record" ] && grep -q ":$port\$" "$record"; then rm -f "$record"; fi
    ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
