# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are used by the scripts that source this file
# Shared settings for the e2e control-plane scripts. Source it; do not run it.
#
# Every component is pinned here and built into a cache outside the repository:
#   ${LOADLINE_CACHE:-$HOME/.cache/loadline}/bin/<component>-<version>/
# A directory counts as built only when its ".complete" stamp exists.

LOADLINE_E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOADLINE_REPO="$(cd "${LOADLINE_E2E_DIR}/.." && pwd)"
LOADLINE_CACHE="${LOADLINE_CACHE:-${HOME}/.cache/loadline}"

K8S_VERSION="v1.36.3"      # k8s.io/kubernetes (kube-apiserver, controller-manager, scheduler, kubectl)
K8S_STAGING_VERSION="v0.36.3"
ETCD_VERSION="v3.6.16"     # go.etcd.io/etcd/server/v3
KWOK_VERSION="v0.8.0"      # sigs.k8s.io/kwok (kwok, kwokctl)
HELM_VERSION="v3.22.0"     # helm.sh/helm/v3
LWS_VERSION="v0.9.0"       # sigs.k8s.io/lws (LeaderWorkerSet manager + CRDs; v0.10.0 is not served by the proxy)
KEDA_VERSION="v2.21.0"     # github.com/kedacore/keda/v2 (operator + metrics adapter + CRDs)
PROMETHEUS_OPERATOR_VERSION="v0.85.0" # github.com/prometheus-operator/prometheus-operator (its CRDs only)
PROMETHEUS_DEB="prometheus" # Debian's package, unpacked into the cache (never installed system-wide)

K8S_BIN="${LOADLINE_CACHE}/bin/kubernetes-${K8S_VERSION}"
ETCD_BIN="${LOADLINE_CACHE}/bin/etcd-${ETCD_VERSION}"
KWOK_BIN="${LOADLINE_CACHE}/bin/kwok-${KWOK_VERSION}"
HELM_BIN="${LOADLINE_CACHE}/bin/helm-${HELM_VERSION}"
LWS_BIN="${LOADLINE_CACHE}/bin/lws-${LWS_VERSION}"
KEDA_BIN="${LOADLINE_CACHE}/bin/keda-${KEDA_VERSION}"
PROMCRDS_DIR="${LOADLINE_CACHE}/bin/promcrds-${PROMETHEUS_OPERATOR_VERSION}"
PROMETHEUS_BIN="${LOADLINE_CACHE}/bin/prometheus"   # prometheus and promtool, from ${PROMETHEUS_DEB}

SERVICE_CIDR="10.96.0.0/16"  # 65,534 Service IPs (kube-apiserver's default /24 holds 254)
CLUSTER_NAME="${LOADLINE_CLUSTER_NAME:-loadline-e2e}"
STATE_DIR="${LOADLINE_REPO}/.e2e"
KUBECONFIG_PATH="${LOADLINE_KUBECONFIG:-${STATE_DIR}/kubeconfig}"
# kwokctl keeps the cluster's files (pki, etcd data, logs) under KWOK_WORKDIR.
export KWOK_WORKDIR="${KWOK_WORKDIR:-${STATE_DIR}/kwok}"

GO="${GO:-}"
if [[ -z "${GO}" ]]; then
  if command -v go >/dev/null 2>&1; then
    GO="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  fi
fi

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Stop exactly the processes kwokctl recorded for a cluster (its pids/*.pid):
# SIGTERM, up to 10 s to exit, then SIGKILL. Used when kwokctl cannot stop them
# itself and to make sure nothing of an old run is left before a restart.
stop_cluster_processes() {
  local dir=$1 pidfile pid i alive
  local pids=()
  for pidfile in "${dir}"/pids/*.pid; do
    [[ -f "${pidfile}" ]] || continue
    pid=$(<"${pidfile}")
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill "${pid}" 2>/dev/null && pids+=("${pid}")
  done
  for ((i = 0; i < 20 && ${#pids[@]} > 0; i++)); do
    sleep 0.5
    alive=()
    for pid in "${pids[@]}"; do kill -0 "${pid}" 2>/dev/null && alive+=("${pid}"); done
    pids=("${alive[@]}")
  done
  for pid in "${pids[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
}

# make_local_certs NAME DIR USAGES: a CA and a certificate for 127.0.0.1 signed by it, in DIR (ca.crt,
# ca.key, tls.crt, tls.key), with extendedKeyUsage USAGES (serverAuth, or serverAuth,clientAuth for
# mutual TLS). Kept while both are valid for another day.
make_local_certs() {
  local name="$1" dir="$2" usages="$3"
  mkdir -p "${dir}"
  if [[ -f "${dir}/tls.crt" && -f "${dir}/ca.crt" ]] &&
    openssl x509 -checkend 86400 -noout -in "${dir}/tls.crt" >/dev/null 2>&1 &&
    openssl x509 -checkend 86400 -noout -in "${dir}/ca.crt" >/dev/null 2>&1; then
    return 0
  fi
  log "${name}: generating a CA and a certificate for 127.0.0.1 (${dir})"
  (
    cd "${dir}"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=loadline-e2e-${name}-ca" \
      -keyout ca.key -out ca.crt >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout tls.key -out tls.csr >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\nkeyUsage=digitalSignature,keyEncipherment\n' \
      "${usages}" >tls.ext
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile tls.ext \
      -out tls.crt >/dev/null 2>&1
    rm -f tls.csr tls.ext ca.srl
  ) || die "openssl could not create ${name}'s certificates"
}
