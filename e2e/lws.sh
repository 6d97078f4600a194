#!/usr/bin/env bash
# The LeaderWorkerSet controller (sigs.k8s.io/lws) for the local control plane.
#
#   e2e/lws.sh up       build it if needed (cache), apply its CRDs, start the manager, register its webhooks
#   e2e/lws.sh down     stop the manager and remove its webhook configurations (the CRDs stay)
#   e2e/lws.sh status   print what runs; exit 0 only when the controller is up and its webhooks answer
#
# The manager runs as a local process against .e2e/kubeconfig with leader
# election off; every port it opens (webhook, metrics, health) is on 127.0.0.1.
# Its pod webhook is required (it labels the group's pods and injects the
# LWS_* variables the workers need), so the webhooks stay on: the webhook
# server uses a certificate signed by a CA generated here with openssl, and
# the webhook configurations from the module point the API server at
# https://127.0.0.1:<port>/<path> with that CA. Internal cert management (which
# wants a Service and a Secret in lws-system) is off.
#
# Files: .e2e/lws.pid, .e2e/lws.log, .e2e/lws/ (config, certificates, state).
# up is idempotent: a healthy manager started for the same cluster is kept.
set -euo pipefail

# shellcheck source=e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KUBECTL="${K8S_BIN}/kubectl"
MANAGER="${LWS_BIN}/manager"
LWS_DIR="${STATE_DIR}/lws"
PID_FILE="${STATE_DIR}/lws.pid"
LOG_FILE="${STATE_DIR}/lws.log"
CONFIG="${LWS_DIR}/config.yaml"
CERT_DIR="${LWS_DIR}/certs"
STAMP="${LWS_DIR}/started-for" # what the running manager was started against
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"
WEBHOOK_LABEL="loadline.dev/e2e-lws=true"
TIMEOUT="${LOADLINE_READY_TIMEOUT:-120}"

kubectl() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" --request-timeout=20s "$@"; }

api_ready() { [[ -f "${KUBECONFIG_PATH}" ]] && kubectl get --raw /readyz >/dev/null 2>&1; }

manager_pid() {
  local pid
  [[ -f "${PID_FILE}" ]] || return 1
  pid=$(<"${PID_FILE}")
  [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
  # Only a process running our manager binary counts (pids are reused).
  [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "$(realpath -m "${MANAGER}")" ]] || return 1
  echo "${pid}"
}

# "<kubeconfig sha> <kube-apiserver pid> <manager version>": a manager started
# for another cluster (recreated, restarted) is restarted too.
cluster_identity() {
  local apiserver_pid=""
  [[ -f "${CLUSTER_DIR}/pids/kube-apiserver.pid" ]] && apiserver_pid=$(<"${CLUSTER_DIR}/pids/kube-apiserver.pid")
  echo "$(sha256sum "${KUBECONFIG_PATH}" | cut -d' ' -f1) ${apiserver_pid} ${LWS_VERSION}"
}

port_of() { sed -n "s/^# $1-port: //p" "${CONFIG}" 2>/dev/null; }

healthy() {
  local port
  port=$(port_of health)
  [[ -n "${port}" ]] && curl -fsS --max-time 2 "http://127.0.0.1:${port}/readyz" >/dev/null 2>&1
}

webhook_serving() {
  local port
  port=$(port_of webhook)
  # Any HTTP answer over TLS verified with our CA means the server is up.
  [[ -n "${port}" ]] && curl -sS --max-time 2 -o /dev/null --cacert "${CERT_DIR}/ca.crt" \
    "https://127.0.0.1:${port}/healthz" 2>/dev/null
}

# An LWS object goes through the API server, both webhooks and the CRD schema.
admission_works() {
  kubectl create --dry-run=server -o name -n default -f - >/dev/null 2>&1 <<'EOF'
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: loadline-e2e-probe
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers:
        - name: c
          image: busybox
EOF
}

wait_until() {
  local what=$1 i
  shift
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    if "$@"; then return 0; fi
    if ! manager_pid >/dev/null; then
      tail -n 20 "${LOG_FILE}" >&2 || true
      die "the LWS manager exited while waiting for ${what}; see ${LOG_FILE}"
    fi
    sleep 0.5
  done
  tail -n 20 "${LOG_FILE}" >&2 || true
  die "timed out after ${TIMEOUT}s waiting for ${what}; see ${LOG_FILE}"
}

free_port() {
  # Let the kernel pick a free loopback port.
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

make_certs() {
  # A CA (kept while valid for another day) and a serving certificate for 127.0.0.1.
  mkdir -p "${CERT_DIR}"
  if [[ -f "${CERT_DIR}/tls.crt" ]] && openssl x509 -checkend 86400 -noout -in "${CERT_DIR}/tls.crt" >/dev/null 2>&1 &&
    openssl x509 -checkend 86400 -noout -in "${CERT_DIR}/ca.crt" >/dev/null 2>&1; then
    return 0
  fi
  log "lws: generating the webhook CA and serving certificate (${CERT_DIR})"
  (
    cd "${CERT_DIR}"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=loadline-e2e-lws-ca" \
      -keyout ca.key -out ca.crt >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout tls.key -out tls.csr >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >tls.ext
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile tls.ext \
      -out tls.crt >/dev/null 2>&1
    rm -f tls.csr tls.ext ca.srl
  ) || die "openssl could not create the webhook certificates"
}

write_config() {
  local webhook_port=$1 metrics_port=$2 health_port=$3
  cat >"${CONFIG}" <<EOF
# Generated by e2e/lws.sh at start-up; edit the script, not this file.
# webhook-port: ${webhook_port}
# metrics-port: ${metrics_port}
# health-port: ${health_port}
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: ${webhook_port}
  certDir: ${CERT_DIR}
metrics:
  bindAddress: 127.0.0.1:${metrics_port}
health:
  healthProbeBindAddress: 127.0.0.1:${health_port}
EOF
}

# The module's webhook configurations, with each service reference replaced by
# a URL on 127.0.0.1 and our CA. As upstream's kustomize patches do, the pod
# webhooks only see pods labelled leaderworkerset.sigs.k8s.io/name (so other
# pods never depend on this process).
apply_webhooks() {
  local port=$1 ca_b64 list
  ca_b64=$(base64 -w0 <"${CERT_DIR}/ca.crt")
  list=$(kubectl create --dry-run=client -o json -f "${LWS_BIN}/webhook-manifests.yaml") ||
    die "cannot read ${LWS_BIN}/webhook-manifests.yaml"
  python3 -c '
import json, sys
port, ca = sys.argv[1], sys.argv[2]
# kubectl prints one JSON object per document, one after the other.
text, items, pos, decoder = sys.stdin.read(), [], 0, json.JSONDecoder()
while text[pos:].strip():
    obj, pos = decoder.raw_decode(text, len(text) - len(text[pos:].lstrip()))
    items.extend(obj["items"] if obj.get("kind") == "List" else [obj])
for item in items:
    meta = item["metadata"]
    meta["name"] = "lws-" + meta["name"]
    meta.setdefault("labels", {})["loadline.dev/e2e-lws"] = "true"
    for hook in item["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
        if any("pods" in rule.get("resources", []) for rule in hook.get("rules", [])):
            hook["objectSelector"] = {
                "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
            }
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
' "${port}" "${ca_b64}" <<<"${list}" | kubectl apply -f - >/dev/null || die "could not register the LWS webhooks"
}

apply_crds() {
  # Server-side: the LWS CRD is too large for client-side apply's annotation.
  kubectl apply --server-side --force-conflicts --field-manager=loadline-e2e -f "${LWS_BIN}/crd/" >/dev/null ||
    die "could not apply the LWS CRDs"
  kubectl wait --for=condition=Established --timeout="${TIMEOUT}s" -f "${LWS_BIN}/crd/" >/dev/null ||
    die "the LWS CRDs did not become Established"
}

stop_manager() {
  local pid i
  pid=$(manager_pid) || { rm -f "${PID_FILE}"; return 0; }
  log "lws: stopping the manager (pid ${pid})"
  kill "${pid}" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.5; done
  kill -9 "${pid}" 2>/dev/null || true
  rm -f "${PID_FILE}" "${STAMP}"
}

start_manager() {
  local webhook_port metrics_port health_port pid
  webhook_port=$(free_port)
  metrics_port=$(free_port)
  health_port=$(free_port)
  while [[ "${metrics_port}" == "${webhook_port}" ]]; do metrics_port=$(free_port); done
  while [[ "${health_port}" == "${webhook_port}" || "${health_port}" == "${metrics_port}" ]]; do health_port=$(free_port); done
  write_config "${webhook_port}" "${metrics_port}" "${health_port}"
  log "lws: starting the manager ${LWS_VERSION} (webhook 127.0.0.1:${webhook_port}, log ${LOG_FILE})"
  # setsid: the manager must outlive the caller (make, pytest) and its process group.
  setsid nohup "${MANAGER}" --config "${CONFIG}" --kubeconfig "${KUBECONFIG_PATH}" \
    --zap-devel=false --zap-log-level=info >"${LOG_FILE}" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${PID_FILE}"
  wait_until "the LWS manager's /readyz" healthy
  wait_until "the LWS webhook server" webhook_serving
  cluster_identity >"${STAMP}"
}

up() {
  local start
  start=$(date +%s)
  "${LOADLINE_E2E_DIR}/install-tools.sh" lws
  api_ready || die "the cluster is not running (${KUBECONFIG_PATH}): run 'make cluster-up' first"
  mkdir -p "${LWS_DIR}"
  apply_crds
  make_certs
  if manager_pid >/dev/null && healthy && [[ "$(cat "${STAMP}" 2>/dev/null)" == "$(cluster_identity)" ]]; then
    log "lws: the manager is running (pid $(<"${PID_FILE}"))"
  else
    stop_manager
    start_manager
  fi
  apply_webhooks "$(port_of webhook)"
  wait_until "LeaderWorkerSet admission through the webhooks" admission_works
  log "lws: LeaderWorkerSet controller ${LWS_VERSION} ready in $(($(date +%s) - start))s (pid $(<"${PID_FILE}"))"
}

down() {
  stop_manager
  if api_ready; then
    # Without the manager its webhooks would refuse every LeaderWorkerSet and its pods.
    kubectl delete mutatingwebhookconfigurations,validatingwebhookconfigurations -l "${WEBHOOK_LABEL}" \
      --ignore-not-found >/dev/null || true
  fi
}

status() {
  local pid rc=0
  if pid=$(manager_pid); then
    echo "manager:  running, pid ${pid}, ${LWS_VERSION}, log ${LOG_FILE}"
    if healthy; then echo "health:   ok (127.0.0.1:$(port_of health))"; else echo "health:   NOT ready"; rc=1; fi
    if webhook_serving; then echo "webhook:  serving on 127.0.0.1:$(port_of webhook)"; else echo "webhook:  NOT serving"; rc=1; fi
  else
    echo "manager:  not running"
    rc=1
  fi
  if api_ready; then
    if kubectl get crd leaderworkersets.leaderworkerset.x-k8s.io >/dev/null 2>&1; then
      echo "crd:      leaderworkersets.leaderworkerset.x-k8s.io present"
    else
      echo "crd:      leaderworkersets.leaderworkerset.x-k8s.io MISSING"
      rc=1
    fi
    if ((rc == 0)) && admission_works; then echo "admission: ok"; else echo "admission: NOT working"; rc=1; fi
  else
    echo "cluster:  not running"
    rc=1
  fi
  return "${rc}"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: e2e/lws.sh up|down|status" ;;
esac
