{{- define "sandhub-router.labels" -}}
app.kubernetes.io/name: sandbox-router
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "sandhub-router.selector" -}}
app.kubernetes.io/name: sandbox-router
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
