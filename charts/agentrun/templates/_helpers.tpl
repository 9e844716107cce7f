{{- define "agentrun.labels" -}}
app.kubernetes.io/name: agentrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The run store's URL as an env var of the operator and the store API, the only two
processes that hold it: database.existingSecret, else the Secret made from database.url,
else the trial Postgres's Secret (postgres.yaml).
*/}}
{{- define "agentrun.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- if .Values.database.existingSecret }}
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.existingSecretKey }}
      {{- else if .Values.database.url }}
      name: agentrun-database
      key: url
      {{- else }}
      name: agentrun-postgres
      key: url
      {{- end }}
{{- end }}

{{- define "agentrun.storeAPIURL" -}}
https://agentrun-store.{{ .Release.Namespace }}.svc:8080
{{- end }}

{{/*
The operator's ServiceAccount, named here once for the whole chart. Not a value: the
admission policies of crds/ (which the chart ships unchanged, and `make install` applies
without Helm) exempt the operator by this name in agentrun-system, so another name would
have every replay run it creates refused. A locally run operator is exempt through the
group agentrun:operators instead.
*/}}
{{- define "agentrun.operatorServiceAccount" -}}
agentrun-operator
{{- end }}

{{/*
"yes" unless the object (list . apiVersion kind name, cluster-scoped) exists and this
release does not own it. The admission policies and ClusterRoles are also what
`make install` applies from crds/; when it already has, the chart leaves them to it (it
keeps them current with the CRDs) instead of refusing to install over them.
*/}}
{{- define "agentrun.ours" -}}
{{- $root := index . 0 -}}
{{- $found := lookup (index . 1) (index . 2) "" (index . 3) -}}
{{- if or (not $found) (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $found) $root.Release.Name) -}}
yes
{{- end -}}
{{- end }}

{{/*
The operator's rights inside the namespaces of runs (operator.yaml binds them with a Role
per namespace of operator.namespaces, or a ClusterRole when it is empty).
*/}}
{{- define "agentrun.operatorNamespacedRules" -}}
# Watched by every replica; create: a replay's new run and a schedule's runs (and the
# start-up dry run, which needs the same verb); patch: the finalizer (a JSON patch with a
# resourceVersion test) and a replaced run's agentrun.dev/cancel (Replace).
- apiGroups: [agentrun.dev]
  resources: [agentruns, agentrunreplays, agentrunschedules]
  verbs: [get, list, watch, create, patch, update]
# A schedule's settled runs beyond its history limits, and a settled run past its time
# to live with its replays and approvals (always with the object's uid as a precondition;
# a run's finalizer keeps it until the store holds its record).
- apiGroups: [agentrun.dev]
  resources: [agentruns, agentrunreplays, agentrunapprovals]
  verbs: [delete]
# The status is written whole (update, with the resourceVersion as precondition); patch
# for a replay's status when no resourceVersion is at hand.
- apiGroups: [agentrun.dev]
  resources: [agentruns/status, agentrunreplays/status, agentrunschedules/status]
  verbs: [get, patch, update]
# Triggers: watched, and their status written (url, conditions); their runs are the
# receiver's. Its runs' time to live waits for the trigger's dedupe window.
- apiGroups: [agentrun.dev]
  resources: [agentruntriggers]
  verbs: [get, list, watch]
- apiGroups: [agentrun.dev]
  resources: [agentruntriggers/status]
  verbs: [get, update]
# Agents: watched (and listed at a run's launch), and their status written; never created
# or changed: people define them.
- apiGroups: [agentrun.dev]
  resources: [agents]
  verbs: [get, list, watch]
- apiGroups: [agentrun.dev]
  resources: [agents/status]
  verbs: [get, update]
# Approvals: watched, and their verdict written (never created: people decide).
- apiGroups: [agentrun.dev]
  resources: [agentrunapprovals]
  verbs: [get, list, watch]
- apiGroups: [agentrun.dev]
  resources: [agentrunapprovals/status]
  verbs: [get, update]
# Runner pods: the informer lists and watches them (filtered by the label agentrun.dev/run
# on the server); create (and its start-up dry run), delete (a stopped attempt, a
# cancelled run, a settled run's pods past podTTLAfterFinishedSeconds; always with the
# pod's uid as a precondition, so only the run's own pod).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# The runners' ServiceAccount, created in a run's namespace when it is missing.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
# Events on runs and replays (source agentrun-operator).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# Input files are copied out of Secrets and ConfigMaps when a run starts (who may name
# which one is decided at admission, run-references-policy.yaml).
- apiGroups: [""]
  resources: [configmaps, secrets]
  verbs: [get]
# Kueue's Workloads (runs labelled kueue.x-k8s.io/queue-name): read to show why an
# attempt waits in its queue (their QuotaReserved condition); watched only where Kueue is
# installed.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch]
{{- end }}

{{/*
The APIService of the transcript API (store.agentrun.dev/v1alpha1 transcripts, served by
the store API on its Service's port transcripts): the API server proxies users' requests to
it with its front-proxy certificate, verifying the store API's certificate with caBundle
(base64 PEM; empty with cert-manager, whose CA injector fills it from the Secret
agentrun-store-tls).
*/}}
{{- define "agentrun.transcriptAPIService" -}}
{{- $root := .root }}
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1alpha1.store.agentrun.dev
  labels: {{- include "agentrun.labels" $root | nindent 4 }}
  {{- if not .caBundle }}
  annotations:
    cert-manager.io/inject-ca-from: {{ $root.Release.Namespace }}/agentrun-store-tls
  {{- end }}
spec:
  group: store.agentrun.dev
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service:
    name: agentrun-store
    namespace: {{ $root.Release.Namespace }}
    port: 443
  {{- if .caBundle }}
  caBundle: {{ .caBundle }}
  {{- end }}
{{- end }}

{{/*
The trigger receiver's rights inside the namespaces of runs (receiver.yaml binds them with
a Role per namespace of operator.namespaces, or a ClusterRole when it is empty): read a
trigger and the Secret its spec.auth names (only that one: the receiver reads no other, and
admission let the trigger name only a Secret its author may get), add to the trigger's
counters, create the event's run and ConfigMap and hand the ConfigMap to the run. No store
credential, no pods, no list: nothing else.
*/}}
{{- define "agentrun.receiverRules" -}}
- apiGroups: [agentrun.dev]
  resources: [agentruntriggers]
  verbs: [get]
- apiGroups: [agentrun.dev]
  resources: [agentruntriggers/status]
  verbs: [get, patch]
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}

{{/*
Where senders reach the receiver: receiver.url (an ingress's address), else its Service.
The operator writes it, and /v1/triggers/<namespace>/<name>, into each trigger's
status.url.
*/}}
{{- define "agentrun.receiverURL" -}}
{{- if .Values.receiver.url -}}
{{ .Values.receiver.url }}
{{- else -}}
https://agentrun-receiver.{{ .Release.Namespace }}.svc
{{- end -}}
{{- end }}
