#!/usr/bin/env bash
# `make e2e`: bring the local control plane up when needed, run the e2e tests, and stop the cluster
# again when this run is the one that started it. A developer's running cluster (`make cluster-up`,
# `make demo`) is kept as it was; a CI run on a fresh clone leaves no etcd, kube-apiserver, KWOK or
# LeaderWorkerSet process behind. LOADLINE_KEEP_CLUSTER=1 keeps a cluster this run started.
# Arguments replace the default test path for pytest (`e2e/run.sh e2e/test_crd.py -x`).
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${PYTHON:?set PYTHON to the python of the venv, as make e2e does}"

was_running=0
if [[ -f "${KUBECONFIG_PATH}" ]] && KUBECONFIG="${KUBECONFIG_PATH}" "${K8S_BIN}/kubectl" get --raw /readyz >/dev/null 2>&1; then
  was_running=1
fi

status=0
"${LOADLINE_E2E_DIR}/cluster-up.sh" || status=$?
if ((status == 0)); then
  (($#)) || set -- "${LOADLINE_E2E_DIR}"
  "${PYTHON}" -m pytest "$@" || status=$?
fi

if ((was_running)); then
  log "the cluster was running before the tests: left running"
elif [[ -n "${LOADLINE_KEEP_CLUSTER:-}" ]]; then
  log "LOADLINE_KEEP_CLUSTER is set: cluster left running (make cluster-down stops it)"
else
  log "stopping the cluster this run started"
  "${LOADLINE_E2E_DIR}/cluster-down.sh" || log "cluster-down failed; stop it with make cluster-down"
fi
exit "${status}"
