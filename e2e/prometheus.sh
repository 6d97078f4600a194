#!/usr/bin/env bash
# A throw-away Prometheus on loopback for the e2e tests of loadline.traffic.
#
#   e2e/prometheus.sh up                 start it (free port on 127.0.0.1), wait until ready, print its URL
#   e2e/prometheus.sh down               stop it (only the process recorded in .e2e/prometheus.pid)
#   e2e/prometheus.sh backfill FILE      OpenMetrics FILE -> TSDB blocks in its data dir, then (re)start
#   e2e/prometheus.sh url                print the URL of the running instance
#   e2e/prometheus.sh reset              down, then delete the data dir
#
# Series come from backfills (promtool tsdb create-blocks-from openmetrics), or from loopback exporters a
# test lists in .e2e/<instance>/targets/*.json (file-based discovery, scraped every 2 s).
# Files: config and data under .e2e/prometheus/, pid/log/url in .e2e/prometheus.{pid,log,url}.
#
# How Prometheus sees backfilled blocks: the TSDB opens the block directories in its data dir at start,
# and a running server only re-reads the directory on its next compaction cycle (about once a minute).
# So `backfill` restarts a running server on the same port instead of waiting. Blocks that overlap in
# time (two backfills, or a backfill and the head) need --storage.tsdb.allow-overlapping-blocks up to
# Prometheus 2.38; from 2.39 overlapping blocks are always accepted (Debian 12 ships 2.42), so the flag
# is only passed to older versions.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="$(cd "${E2E_DIR}/.." && pwd)/.e2e"
# One instance per name: the session's (the operator reads it) and any a test wants for itself, so a
# test that resets its own Prometheus never takes the operator's away (LOADLINE_PROMETHEUS_INSTANCE).
INSTANCE="${LOADLINE_PROMETHEUS_INSTANCE:-prometheus}"
[[ "${INSTANCE}" =~ ^[a-z0-9-]+$ ]] || { echo "error: bad LOADLINE_PROMETHEUS_INSTANCE ${INSTANCE}" >&2; exit 2; }
PROM_DIR="${STATE_DIR}/${INSTANCE}"
DATA_DIR="${PROM_DIR}/data"
CONFIG="${PROM_DIR}/prometheus.yml"
PID_FILE="${STATE_DIR}/${INSTANCE}.pid"
LOG_FILE="${STATE_DIR}/${INSTANCE}.log"
URL_FILE="${STATE_DIR}/${INSTANCE}.url"
# shellcheck source=e2e/lib.sh
source "${E2E_DIR}/lib.sh"
PROMETHEUS="${PROMETHEUS:-${PROMETHEUS_BIN}/prometheus}"
PROMTOOL="${PROMTOOL:-${PROMETHEUS_BIN}/promtool}"
READY_TIMEOUT="${LOADLINE_PROMETHEUS_READY_TIMEOUT:-60}"

log() { printf '[%s] prometheus: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Installs Prometheus into the cache on first use, so no step of a fresh machine is left to a person.
need_tools() {
  if [[ ! -x "${PROMETHEUS}" || ! -x "${PROMTOOL}" ]]; then
    "${E2E_DIR}/install-tools.sh" prometheus
  fi
  [[ -x "${PROMETHEUS}" && -x "${PROMTOOL}" ]] || die "prometheus/promtool not found at ${PROMETHEUS}, ${PROMTOOL}"
}

running_pid() {
  local pid
  [[ -f "${PID_FILE}" ]] || return 1
  pid=$(<"${PID_FILE}")
  [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
  # Only ever our own server: the pid must still be a prometheus using our data dir.
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q -- "--storage.tsdb.path=${DATA_DIR}" || return 1
  echo "${pid}"
}

# A free port below the kernel's ephemeral range: a backfill restarts Prometheus on the same port, and a
# port in the ephemeral range can meanwhile be taken as the local end of any outgoing connection (kubectl,
# the operator), which would move Prometheus and leave the URL handed out to the operator dead.
free_port() {
  python3 - <<'PY'
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
for port in random.sample(range(20000, max(low, 20200)), 200):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
PY
}

# Major*1000+minor of the prometheus binary, e.g. 2042.
prometheus_version() {
  local major minor
  read -r major minor < <("${PROMETHEUS}" --version 2>&1 |
    sed -n 's/^prometheus, version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1) || true
  echo $((${major:-0} * 1000 + ${minor:-0}))
}

write_config() {
  mkdir -p "${DATA_DIR}" "${PROM_DIR}/targets"
  cat >"${CONFIG}" <<'EOF'
# loadline e2e: series are backfilled, or scraped from loopback exporters a test lists in targets/*.json
# (file-based discovery, read as the files change). honor_labels: an exporter's series name the
# namespace and pod they stand for.
global:
  scrape_interval: 15s
  evaluation_interval: 15s
scrape_configs:
  - job_name: e2e
    scrape_interval: 2s
    honor_labels: true
    file_sd_configs:
      - files: [targets/*.json]
EOF
}

wait_ready() {
  local url=$1 pid=$2 deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    kill -0 "${pid}" 2>/dev/null || { tail -n 20 "${LOG_FILE}" >&2; die "prometheus exited; see ${LOG_FILE}"; }
    if curl -fsS --max-time 2 "${url}/-/ready" >/dev/null 2>&1; then return 0; fi
    sleep 0.3
  done
  tail -n 20 "${LOG_FILE}" >&2
  die "prometheus not ready after ${READY_TIMEOUT}s; see ${LOG_FILE}"
}

cmd_up() {
  need_tools
  local pid port url
  if pid=$(running_pid); then
    cat "${URL_FILE}"
    return 0
  fi
  write_config
  # Reuse the previous port when restarting (a backfill), so a URL handed out stays valid. The check
  # binds like Prometheus does (SO_REUSEADDR), so a port in TIME_WAIT after the stop still counts as free.
  port=""
  [[ -f "${URL_FILE}" ]] && port=$(sed -n 's#^http://127.0.0.1:\([0-9]*\)$#\1#p' "${URL_FILE}")
  if [[ -z "${port}" ]] || ! python3 -c "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1])))" "${port}" 2>/dev/null; then
    port=$(free_port)
  fi
  url="http://127.0.0.1:${port}"
  local flags=(
    "--config.file=${CONFIG}"
    "--storage.tsdb.path=${DATA_DIR}"
    "--storage.tsdb.retention.time=30d"
    "--web.listen-address=127.0.0.1:${port}"
    "--web.enable-lifecycle"
  )
  if (($(prometheus_version) < 2039)); then
    flags+=("--storage.tsdb.allow-overlapping-blocks")
  fi
  mkdir -p "${STATE_DIR}"
  nohup "${PROMETHEUS}" "${flags[@]}" >>"${LOG_FILE}" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${PID_FILE}"
  echo "${url}" >"${URL_FILE}"
  wait_ready "${url}" "${pid}"
  log "ready at ${url} (pid ${pid}, data ${DATA_DIR})"
  echo "${url}"
}

cmd_down() {
  local pid i
  if ! pid=$(running_pid); then
    rm -f "${PID_FILE}"
    return 0
  fi
  kill "${pid}"
  for ((i = 0; i < 100; i++)); do
    kill -0 "${pid}" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "${pid}" 2>/dev/null && kill -9 "${pid}"
  rm -f "${PID_FILE}"
  log "stopped (pid ${pid})"
}

cmd_backfill() {
  need_tools
  local file=${1:-}
  [[ -f "${file}" ]] || die "usage: $0 backfill OPENMETRICS_FILE"
  write_config
  local was_running=0
  running_pid >/dev/null && was_running=1
  log "backfilling ${file}"
  "${PROMTOOL}" tsdb create-blocks-from openmetrics --quiet "${file}" "${DATA_DIR}" >&2
  if ((was_running)); then
    cmd_down
  fi
  cmd_up
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  backfill) shift; cmd_backfill "$@" ;;
  url) running_pid >/dev/null || die "prometheus is not running"; cat "${URL_FILE}" ;;
  reset) cmd_down; rm -rf "${PROM_DIR}"; rm -f "${URL_FILE}" ;;
  *) die "usage: $0 up|down|backfill FILE|url|reset" ;;
esac
