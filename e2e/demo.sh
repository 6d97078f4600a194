#!/usr/bin/env bash
# `make demo`: the local control plane, loadline installed by its Helm chart, and the examples, end to end.
# Leaves the cluster and the operator running; `make demo-down` stops both.
set -euo pipefail
# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VENV_BIN="${LOADLINE_REPO}/.venv/bin"
KUBECTL="${K8S_BIN}/kubectl"
LOG_FILE="${STATE_DIR}/operator-loadline-*.log"
WAIT="${LOADLINE_DEMO_TIMEOUT:-180}"
kubectl() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

log "installing loadline with its Helm chart (CRDs, ServiceAccount, RBAC, Deployment of 2 replicas)"
# KWOK nodes run no containers: the Deployment's replicas run here as processes, each with the env the
# chart gives its pod and a token of the chart's ServiceAccount (e2e/chart.py).
"${VENV_BIN}/python" "${LOADLINE_E2E_DIR}/chart.py" up
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

log "applying the example FleetPolicy (examples/policies/): the models it governs say so in status"
kubectl apply -f "${LOADLINE_REPO}/examples/policies/fleet-policy.yaml"
for _ in $(seq 1 15); do
  [[ -n "$(kubectl get fleetpolicies -o jsonpath='{.items[*].status.modelsGoverned}')" ]] && break
  sleep 1
done
kubectl get fleetpolicies -o wide
kubectl get inferencemodels -A -o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,POLICIES:.status.policies,BREAKS:.status.violatedPolicies'

log "the admission webhooks at work: a model in team-a asking for more than team-a-budget allows"
refused=$(sed -e 's/name: chat$/name: chat-long/' -e 's/maxModelLen: 8192/maxModelLen: 131072/' \
  "${LOADLINE_REPO}/examples/chat-llama-8b.yaml" | kubectl apply -f - 2>&1) && {
  echo "${refused}"; log "expected a refusal from the webhook"; exit 1; }
echo "${refused}"
cat <<EOF

The cluster and the operator keep running. To talk to them:
  export KUBECONFIG=${KUBECONFIG_PATH}
  ${KUBECTL} get inferencemodels -A                 # or: kubectl get lim -A
  ${KUBECTL} describe inferencemodel chat -n team-a # plan, conditions, events
  ${KUBECTL} get lease loadline -n loadline-system  # which replica is active
  ${KUBECTL} get fleetpolicies -o wide              # policies, the models they govern and violations
  ${KUBECTL} apply -f my-model.yaml                 # refused at once if a FleetPolicy forbids it
  tail -f ${LOG_FILE}             # the replicas' logs
Stop everything with: make demo-down
EOF
