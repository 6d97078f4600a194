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
