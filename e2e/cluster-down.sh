#!/usr/bin/env bash
# Stop and delete the local control plane and remove .e2e/kubeconfig.
# Safe to run when no cluster exists. The binary cache is kept.
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KWOKCTL="${KWOK_BIN}/kwokctl"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"

# stop_leftovers DIR "PID..." : SIGKILL each listed pid whose command line names DIR (a reused pid
# that is some other process is left alone).
stop_leftovers() {
  local dir=$1 pid cmdline
  for pid in $2; do
    [[ "${pid}" =~ ^[0-9]+$ ]] || continue
    cmdline=$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null) || continue
    if [[ "${cmdline}" == *"${dir}"* ]]; then
      log "pid ${pid} outlived kwokctl delete; killing it"
      kill -9 "${pid}" 2>/dev/null || true
    fi
  done
}

"${LOADLINE_E2E_DIR}/keda.sh" down || true # KEDA, when a test started it (e2e/test_autoscaling.py)
"${LOADLINE_E2E_DIR}/lws.sh" down || true # stop the LeaderWorkerSet controller first
if [[ -d "${CLUSTER_DIR}" ]]; then
  pids_before=""
  for pidfile in "${CLUSTER_DIR}"/pids/*.pid; do # one pid per file, no newline after it
    [[ -f "${pidfile}" ]] && pids_before+=" $(<"${pidfile}")"
  done
  if [[ -x "${KWOKCTL}" ]]; then
    log "deleting cluster ${CLUSTER_NAME}"
    # Point --kubeconfig at our own copy: the default would edit ~/.kube/config.
    if ! "${KWOKCTL}" --name "${CLUSTER_NAME}" delete cluster --kubeconfig "${KUBECONFIG_PATH}" >&2; then
      log "kwokctl delete cluster failed; stopping the processes by their pid files"
      stop_cluster_processes "${CLUSTER_DIR}"
    fi
    # kwokctl may return before a component it signalled has exited: what its pid files named and
    # still runs from this cluster's directory goes too.
    stop_leftovers "${CLUSTER_DIR}" "${pids_before}"
  else
    log "kwokctl is not built (${KWOKCTL}); stopping the cluster's processes by their pid files"
    stop_cluster_processes "${CLUSTER_DIR}"
  fi
  rm -rf "${CLUSTER_DIR}"
else
  log "no cluster ${CLUSTER_NAME} under ${KWOK_WORKDIR}"
fi
rm -f "${KUBECONFIG_PATH}"
