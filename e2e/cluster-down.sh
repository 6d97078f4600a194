#!/usr/bin/env bash
# Stop and delete the local control plane and remove .e2e/kubeconfig.
# Safe to run when no cluster exists. The binary cache is kept.
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KWOKCTL="${KWOK_BIN}/kwokctl"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"

"${LOADLINE_E2E_DIR}/lws.sh" down || true # stop the LeaderWorkerSet controller first
if [[ -d "${CLUSTER_DIR}" ]]; then
  if [[ -x "${KWOKCTL}" ]]; then
    log "deleting cluster ${CLUSTER_NAME}"
    # Point --kubeconfig at our own copy: the default would edit ~/.kube/config.
    if ! "${KWOKCTL}" --name "${CLUSTER_NAME}" delete cluster --kubeconfig "${KUBECONFIG_PATH}" >&2; then
      log "kwokctl delete cluster failed; stopping the processes by their pid files"
      stop_cluster_processes "${CLUSTER_DIR}"
    fi
  else
    log "kwokctl is not built (${KWOKCTL}); stopping the cluster's processes by their pid files"
    stop_cluster_processes "${CLUSTER_DIR}"
  fi
  rm -rf "${CLUSTER_DIR}"
else
  log "no cluster ${CLUSTER_NAME} under ${KWOK_WORKDIR}"
fi
rm -f "${KUBECONFIG_PATH}"
