{{- define "loadline.name" -}}loadline{{- end -}}
{{- define "loadline.fullname" -}}{{ printf "%s-%s" .Release.Name "loadline" | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "loadline.labels" -}}
app.kubernetes.io/name: loadline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "loadline.selector" -}}
app.kubernetes.io/name: loadline
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "loadline.serviceAccount" -}}{{ default (include "loadline.fullname" .) .Values.serviceAccount.name }}{{- end -}}

{{/* The watched namespaces as a list (settings.namespaces is comma-separated; empty: all). */}}
{{- define "loadline.namespaces" -}}
{{- $out := list -}}
{{- range (splitList "," .Values.settings.namespaces) -}}
{{- if trim . -}}{{- $out = append $out (trim .) -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
What the operator does inside the namespaces it watches. Every verb is used; docs/operator.md (RBAC)
says by what. Granted by a ClusterRole when it watches every namespace, else by a Role in each.
*/}}
{{- define "loadline.namespacedRules" -}}
# The InferenceModels it reconciles: watched by kopf, which patches its finalizer and annotations.
- apiGroups: [loadline.dev]
  resources: [inferencemodels]
  verbs: [get, list, watch, patch]
- apiGroups: [loadline.dev]
  resources: [inferencemodels/status]
  verbs: [patch]
# blockOwnerDeletion on the children's owner references, where owner-reference permissions are enforced.
- apiGroups: [loadline.dev]
  resources: [inferencemodels/finalizers]
  verbs: [update]
# Children, applied server-side; the workloads of a layout no longer planned are deleted.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# A Deployment's ReplicaSets, read for their revision: a model is Ready once its current template's
# pods are, before the Deployment's controller counts them.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, create, patch, delete]
# spec.autoscaling: the KEDA ScaledObject, applied with the children and deleted when it is unset.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, create, patch, delete]
# Crash detection (pod events, the crashed container's last log lines) and restarts by eviction, which
# honours PodDisruptionBudgets; pods are never deleted directly.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# spec.model.configMapRef: a model's config.json.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# Events on InferenceModels (`kubectl describe`).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if and .Values.settings.hfFetch .Values.settings.hubTokenSecretNames }}
# Hub tokens of gated models: only these names, only `get` (no list or watch).
- apiGroups: [""]
  resources: [secrets]
  resourceNames: {{ toJson .Values.settings.hubTokenSecretNames }}
  verbs: [get]
{{- end }}
{{- end -}}

{{/* sharding.shards, checked: a whole number from 1 to 64 (LOADLINE_SHARDS). */}}
{{- define "loadline.shards" -}}
{{- $shards := (.Values.sharding | default dict).shards -}}
{{- if or (not (kindIs "float64" $shards | or (kindIs "int" $shards) | or (kindIs "int64" $shards))) (lt (float64 $shards) 1.0) (gt (float64 $shards) 64.0) (ne (float64 (int $shards)) (float64 $shards)) -}}
{{- fail (printf "sharding.shards: %v is not a whole number from 1 to 64 (fix: --set sharding.shards=2, or 1 for no sharding)" $shards) -}}
{{- end -}}
{{- int $shards -}}
{{- end -}}
