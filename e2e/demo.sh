#!/usr/bin/env bash
# `make demo`: the local control plane, the CRDs, the operator, and the examples, end to end.
# Leaves the cluster and the operator running; `make demo-down` stops both.
set -euo pipefail
# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VENV_BIN="${LOADLINE_REPO}/.venv/bin"
KUBECTL="${K8S_BIN}/kubectl"
PID_FILE="${STATE_DIR}/operator.pid"
LOG_FILE="${STATE_DIR}/operator.log"
WAIT="${LOADLINE_DEMO_TIMEOUT:-180}"
kubectl() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

log "installing the CRDs"
kubectl apply --server-side -f "${LOADLINE_REPO}/crds" >/dev/null
kubectl wait --for=condition=Established crd/inferencemodels.loadline.dev --timeout=60s >/dev/null

if [[ -f "${PID_FILE}" ]] && kill -0 "$(cat "${PID_FILE}")" 2>/dev/null; then
  log "the operator is already running (pid $(cat "${PID_FILE}"))"
else
  log "starting the operator: loadline run (log: ${LOG_FILE})"
  KUBECONFIG="${KUBECONFIG_PATH}" LOADLINE_LIVENESS_PORT=0 \
    nohup "${VENV_BIN}/loadline" run --standalone >"${LOG_FILE}" 2>&1 &
  echo $! >"${PID_FILE}"
fi

log "applying the examples"
for file in "${LOADLINE_REPO}"/examples/*.yaml; do
  ns=$("${VENV_BIN}/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"].get("namespace", "default"))' "${file}")
  kubectl create namespace "${ns}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl apply -f "${file}"
done

log "waiting up to ${WAIT}s for every InferenceModel to be Ready (or Failed)"
deadline=$(( $(date +%s) + WAIT ))
while true; do
  phases=$(kubectl get inferencemodels -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')
  pending=$(grep -cvE '^(Ready|Failed)$' <<<"${phases}" || true)
  [[ "${pending}" == "0" ]] && break
  if (( $(date +%s) > deadline )); then
    log "still not settled after ${WAIT}s (see ${LOG_FILE})"
    break
  fi
  sleep 2
done

echo
kubectl get inferencemodels -A -o wide
echo
echo "Where each model's pods run:"
kubectl get pods -A -l app.kubernetes.io/managed-by!=nonexistent,loadline.dev/inferencemodel \
  -o custom-columns='NAMESPACE:.metadata.namespace,POD:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,GPUS:.spec.containers[0].resources.limits.nvidia\.com/gpu'
echo
kubectl get nodes -L nvidia.com/gpu.product,node.kubernetes.io/instance-type
cat <<EOF

The cluster and the operator keep running. To talk to them:
  export KUBECONFIG=${KUBECONFIG_PATH}
  ${KUBECTL} get inferencemodels -A                 # or: kubectl get lim -A
  ${KUBECTL} describe inferencemodel chat -n team-a # plan, conditions, events
  tail -f ${LOG_FILE}                               # the operator's log
Stop everything with: make demo-down
EOF
