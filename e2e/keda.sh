#!/usr/bin/env bash
# KEDA (github.com/kedacore/keda/v2) for the local control plane: its operator and metrics adapter.
#
#   e2e/keda.sh up       build them if needed (cache), apply KEDA's CRDs, start both, register the adapter
#   e2e/keda.sh down     stop both and remove the APIService (the CRDs stay)
#   e2e/keda.sh status   print what runs; exit 0 only when external.metrics.k8s.io answers
#
# Both run as local processes against .e2e/kubeconfig, every port on 127.0.0.1, leader election and
# KEDA's own certificate rotation off. The operator turns a ScaledObject into an HPA (and activates
# 0 <-> 1); the adapter serves external.metrics.k8s.io, asking the operator over gRPC (TLS with a CA
# generated here with openssl), to the HPA controller of kube-controller-manager through the API
# server's aggregation layer. The APIService points at a Service of type ExternalName naming 127.0.0.1
# (the API server resolves an ExternalName Service to that host and the APIService's port), as kwokctl
# does for the metrics-server it runs as a binary; KEDA's admission webhooks are not run.
#
# Files: .e2e/keda-{operator,adapter}.{pid,log}, .e2e/keda/ (certificates, ports, state).
# up is idempotent: healthy processes started for the same cluster are kept.
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KUBECTL="${K8S_BIN}/kubectl"
KEDA_DIR="${STATE_DIR}/keda"
CERT_DIR="${KEDA_DIR}/certs"
PORTS="${KEDA_DIR}/ports"
STAMP="${KEDA_DIR}/started-for"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"
NAMESPACE="keda"
APISERVICE="v1beta1.external.metrics.k8s.io"
TIMEOUT="${LOADLINE_READY_TIMEOUT:-120}"

kubectl() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" --request-timeout=20s "$@"; }
api_ready() { [[ -f "${KUBECONFIG_PATH}" ]] && kubectl get --raw /readyz >/dev/null 2>&1; }

pid_of() {
  local name=$1 pid
  [[ -f "${STATE_DIR}/keda-${name}.pid" ]] || return 1
  pid=$(<"${STATE_DIR}/keda-${name}.pid")
  [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
  local binary="${KEDA_BIN}/keda"
  [[ "${name}" == adapter ]] && binary="${KEDA_BIN}/keda-adapter"
  [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "$(realpath -m "${binary}")" ]] || return 1
  echo "${pid}"
}

# Alive by pid alone: right after the start the pid may still run setsid or nohup before they exec
# KEDA's binary, so pid_of (which checks the binary) would take a starting process for a dead one.
alive() {
  local pid
  pid=$(cat "${STATE_DIR}/keda-$1.pid" 2>/dev/null) && [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null
}

port_of() { sed -n "s/^$1=//p" "${PORTS}" 2>/dev/null; }

cluster_identity() {
  local apiserver_pid=""
  [[ -f "${CLUSTER_DIR}/pids/kube-apiserver.pid" ]] && apiserver_pid=$(<"${CLUSTER_DIR}/pids/kube-apiserver.pid")
  echo "$(sha256sum "${KUBECONFIG_PATH}" | cut -d' ' -f1) ${apiserver_pid} ${KEDA_VERSION}"
}

operator_healthy() {
  local port
  port=$(port_of health)
  [[ -n "${port}" ]] && curl -fsS --max-time 2 "http://127.0.0.1:${port}/readyz" >/dev/null 2>&1
}

# The API server answers for the adapter's group: the whole path (aggregation, the adapter) works.
external_metrics_served() {
  kubectl get --raw "/apis/external.metrics.k8s.io/v1beta1" >/dev/null 2>&1
}

wait_until() {
  local what=$1 i
  shift
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    if "$@"; then return 0; fi
    if ! alive operator || ! alive adapter; then
      tail -n 20 "${STATE_DIR}/keda-operator.log" "${STATE_DIR}/keda-adapter.log" >&2 || true
      die "a KEDA process exited while waiting for ${what}; see ${STATE_DIR}/keda-*.log"
    fi
    sleep 0.5
  done
  tail -n 20 "${STATE_DIR}/keda-operator.log" "${STATE_DIR}/keda-adapter.log" >&2 || true
  die "timed out after ${TIMEOUT}s waiting for ${what}; see ${STATE_DIR}/keda-*.log"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

make_certs() {
  # The gRPC channel between adapter and operator: both present tls.crt, both trust ca.crt (mutual TLS,
  # as KEDA's own certificate manager sets it up).
  make_local_certs keda "${CERT_DIR}" serverAuth,clientAuth
}

apply_crds() {
  kubectl apply --server-side --force-conflicts --field-manager=loadline-e2e -f "${KEDA_BIN}/crd/" >/dev/null ||
    die "could not apply KEDA's CRDs"
  kubectl wait --for=condition=Established --timeout="${TIMEOUT}s" -f "${KEDA_BIN}/crd/" >/dev/null ||
    die "KEDA's CRDs did not become Established"
}

stop() {
  local name pid i
  for name in adapter operator; do
    pid=$(pid_of "${name}") || { rm -f "${STATE_DIR}/keda-${name}.pid"; continue; }
    log "keda: stopping the ${name} (pid ${pid})"
    kill "${pid}" 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.5; done
    kill -9 "${pid}" 2>/dev/null || true
    rm -f "${STATE_DIR}/keda-${name}.pid"
  done
  rm -f "${STAMP}"
}

start() {
  local grpc metrics health secure adapter_metrics pid
  grpc=$(free_port); metrics=$(free_port); health=$(free_port); secure=$(free_port); adapter_metrics=$(free_port)
  printf 'grpc=%s\nmetrics=%s\nhealth=%s\nsecure=%s\nadapter-metrics=%s\n' \
    "${grpc}" "${metrics}" "${health}" "${secure}" "${adapter_metrics}" >"${PORTS}"
  log "keda: starting the operator ${KEDA_VERSION} (gRPC 127.0.0.1:${grpc}, log ${STATE_DIR}/keda-operator.log)"
  # setsid: both must outlive the caller (make, pytest) and its process group.
  KUBECONFIG="${KUBECONFIG_PATH}" WATCH_NAMESPACE="" KEDA_CLUSTER_OBJECT_NAMESPACE="${NAMESPACE}" \
    POD_NAMESPACE="${NAMESPACE}" setsid nohup "${KEDA_BIN}/keda" \
    --leader-elect=false --enable-cert-rotation=false --cert-dir="${CERT_DIR}" --ca-dir="${CERT_DIR}" \
    --enable-webhook-patching=false --enable-apiservice-patching=false \
    --metrics-bind-address="127.0.0.1:${metrics}" --health-probe-bind-address="127.0.0.1:${health}" \
    --metrics-service-bind-address="127.0.0.1:${grpc}" --zap-log-level=info \
    >"${STATE_DIR}/keda-operator.log" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${STATE_DIR}/keda-operator.pid"
  log "keda: starting the metrics adapter (https://127.0.0.1:${secure}, log ${STATE_DIR}/keda-adapter.log)"
  KUBECONFIG="${KUBECONFIG_PATH}" WATCH_NAMESPACE="" KEDA_CLUSTER_OBJECT_NAMESPACE="${NAMESPACE}" \
    POD_NAMESPACE="${NAMESPACE}" \
    setsid nohup "${KEDA_BIN}/keda-adapter" \
    --secure-port="${secure}" --bind-address=127.0.0.1 --cert-dir="${CERT_DIR}" \
    --tls-cert-file="${CERT_DIR}/tls.crt" --tls-private-key-file="${CERT_DIR}/tls.key" \
    --client-ca-file="${CLUSTER_DIR}/pki/ca.crt" \
    --lister-kubeconfig="${KUBECONFIG_PATH}" --authentication-kubeconfig="${KUBECONFIG_PATH}" \
    --authorization-kubeconfig="${KUBECONFIG_PATH}" \
    --metrics-service-address="127.0.0.1:${grpc}" --port="${adapter_metrics}" --zap-log-level=info \
    >"${STATE_DIR}/keda-adapter.log" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${STATE_DIR}/keda-adapter.pid"
  wait_until "the KEDA operator's /readyz" operator_healthy
  cluster_identity >"${STAMP}"
}

register() {
  kubectl apply -f - >/dev/null <<YAML || die "could not register KEDA's metrics adapter"
apiVersion: v1
kind: Namespace
metadata: {name: ${NAMESPACE}}
---
apiVersion: v1
kind: Service
metadata: {name: keda-metrics-apiserver, namespace: ${NAMESPACE}, labels: {loadline.dev/e2e-keda: "true"}}
spec: {type: ExternalName, externalName: 127.0.0.1}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: ${APISERVICE}, labels: {loadline.dev/e2e-keda: "true"}}
spec:
  service: {name: keda-metrics-apiserver, namespace: ${NAMESPACE}, port: $(port_of secure)}
  group: external.metrics.k8s.io
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
}

up() {
  local start_s
  start_s=$(date +%s)
  "${LOADLINE_E2E_DIR}/install-tools.sh" keda
  api_ready || die "the cluster is not running (${KUBECONFIG_PATH}): run 'make cluster-up' first"
  mkdir -p "${KEDA_DIR}"
  apply_crds
  make_certs
  kubectl create namespace "${NAMESPACE}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  if pid_of operator >/dev/null && pid_of adapter >/dev/null && operator_healthy &&
    [[ "$(cat "${STAMP}" 2>/dev/null)" == "$(cluster_identity)" ]]; then
    log "keda: running (operator pid $(pid_of operator), adapter pid $(pid_of adapter))"
  else
    stop
    start
  fi
  register
  wait_until "external.metrics.k8s.io through the API server" external_metrics_served
  log "keda: ${KEDA_VERSION} ready in $(($(date +%s) - start_s))s"
}

down() {
  stop
  if api_ready; then
    # Without the adapter the API server would keep reporting the group unavailable (discovery errors).
    kubectl delete apiservice "${APISERVICE}" --ignore-not-found >/dev/null || true
  fi
}

status() {
  local rc=0 name pid
  for name in operator adapter; do
    if pid=$(pid_of "${name}"); then echo "${name}: running, pid ${pid}, ${KEDA_VERSION}"; else echo "${name}: not running"; rc=1; fi
  done
  if ((rc == 0)) && api_ready && external_metrics_served; then
    echo "external.metrics.k8s.io: served"
  else
    echo "external.metrics.k8s.io: NOT served"
    rc=1
  fi
  return "${rc}"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: e2e/keda.sh up|down|status" ;;
esac
