{{- define "agentrun.labels" -}}
app.kubernetes.io/name: agentrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agentrun.databaseURL" -}}
{{- if .Values.database.url -}}
{{ .Values.database.url }}
{{- else if .Values.postgres.enabled -}}
postgresql+psycopg://agentrun:{{ .Values.postgres.password }}@agentrun-postgres.{{ .Release.Namespace }}.svc:5432/agentrun
{{- end -}}
{{- end }}
