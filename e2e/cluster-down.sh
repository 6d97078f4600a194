#!/usr/bin/env bash
# Stop and delete the local control plane and remove .e2e/kubeconfig.
# Safe to run when no cluster exists. The binary cache is kept.
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KWOKCTL="${KWOK_BIN}/kwokctl"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"

# Fallback when kwokctl cannot stop the cluster: signal exactly the processes it
# recorded, then make sure they are gone before their files are removed.
stop_by_pid_files() {
  local pidfile pid pids=()
  for pidfile in "${CLUSTER_DIR}"/pids/*.pid; do
    [[ -f "${pidfile}" ]] || continue
    pid=$(<"${pidfile}")
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill "${pid}" 2>/dev/null && pids+=("${pid}")
  done
  local i
  for ((i = 0; i < 20 && ${#pids[@]} > 0; i++)); do
    sleep 0.5
    local alive=()
    for pid in "${pids[@]}"; do kill -0 "${pid}" 2>/dev/null && alive+=("${pid}"); done
    pids=("${alive[@]}")
  done
  for pid in "${pids[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
}

if [[ -d "${CLUSTER_DIR}" ]]; then
  if [[ -x "${KWOKCTL}" ]]; then
    log "deleting cluster ${CLUSTER_NAME}"
    # Point --kubeconfig at our own copy: the default would edit ~/.kube/config.
    if ! "${KWOKCTL}" --name "${CLUSTER_NAME}" delete cluster --kubeconfig "${KUBECONFIG_PATH}" >&2; then
      log "kwokctl delete cluster failed; stopping the processes by their pid files"
      stop_by_pid_files
    fi
  else
    log "kwokctl is not built (${KWOKCTL}); stopping the cluster's processes by their pid files"
    stop_by_pid_files
  fi
  rm -rf "${CLUSTER_DIR}"
else
  log "no cluster ${CLUSTER_NAME} under ${KWOK_WORKDIR}"
fi
rm -f "${KUBECONFIG_PATH}" "${STATE_DIR}/kwokctl.yaml"
