{{/*
Names and labels shared by every object of the chart.
*/}}

{{/* The chart's name, or .Values.nameOverride. */}}
{{- define "fusevol.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The name of every object: the release name, with the chart name appended unless it already holds
it; .Values.fullnameOverride replaces both. At most 63 characters (a DNS label).
*/}}
{{- define "fusevol.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels that select the DaemonSet's pods; they never change across upgrades. */}}
{{- define "fusevol.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fusevol.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels that select the holder's pods: never the agent's DaemonSet's. */}}
{{- define "fusevol.holderSelectorLabels" -}}
app.kubernetes.io/name: {{ include "fusevol.name" . }}-holder
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object but the holder's. */}}
{{- define "fusevol.labels" -}}
{{ include "fusevol.commonLabels" . }}
{{ include "fusevol.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/* Labels of the holder's objects. */}}
{{- define "fusevol.holderLabels" -}}
{{ include "fusevol.commonLabels" . }}
{{ include "fusevol.holderSelectorLabels" . }}
app.kubernetes.io/component: holder
{{- end }}

{{- define "fusevol.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the agent runs as. */}}
{{- define "fusevol.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fusevol.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "fusevol.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The source of pods and objects, checked: exactly one of source.manifests.hostPath and
source.kubernetes.
*/}}
{{- define "fusevol.checkSource" -}}
{{- if and .Values.source.kubernetes .Values.source.manifests.hostPath }}
{{- fail "source.kubernetes: set source.manifests.hostPath to \"\" as well: fusevol has one source" }}
{{- end }}
{{- if not (or .Values.source.kubernetes .Values.source.manifests.hostPath) }}
{{- fail "source.manifests.hostPath: set the host directory of manifests to serve (or source.kubernetes)" }}
{{- end }}
{{- end }}

{{/* The CSI plugin socket on the node: where kubelet and the registrar reach the agent. */}}
{{- define "fusevol.csiSocket" -}}
{{- printf "%s/plugins/fusevol.io/csi.sock" .Values.csi.kubeletDir }}
{{- end }}

{{/*
"true" when the agent talks to the API server as its node (rbac.mode node with source.kubernetes;
with the manifests source the agent has no API identity at all), else "".
*/}}
{{- define "fusevol.asNode" -}}
{{- if and .Values.source.kubernetes (eq .Values.rbac.mode "node") }}true{{ end }}
{{- end }}

{{/*
"true" when, as its node, the agent finds kubelet's credentials itself (rbac.node.kubeconfig ""):
below kubelet's directory, with the API server and CA an in-cluster client is given.
*/}}
{{- define "fusevol.findsKubelet" -}}
{{- if and (include "fusevol.asNode" .) (not .Values.rbac.node.kubeconfig) }}true{{ end }}
{{- end }}

{{/*
Whose identity reads what, checked: csi.readAs pod is a CSI setting of the API source.
*/}}
{{- define "fusevol.checkIdentity" -}}
{{- if and (eq .Values.csi.readAs "pod") (not (and .Values.csi.enabled .Values.source.kubernetes)) }}
{{- fail "csi.readAs: pod reads CSI volumes' objects from the Kubernetes API: set csi.enabled and source.kubernetes as well" }}
{{- end }}
{{- end }}

{{/*
The CSIDriver's tokenRequests: csi.tokenRequests, and with csi.readAs pod the API server's own
audience (""), the token a CSI volume's objects are read with, unless listed already. A YAML list.
*/}}
{{- define "fusevol.tokenRequests" -}}
{{- $requests := .Values.csi.tokenRequests }}
{{- $listed := false }}
{{- range $requests }}
{{- if eq .audience "" }}
{{- $listed = true }}
{{- end }}
{{- end }}
{{- if and (eq .Values.csi.readAs "pod") (not $listed) }}
{{- $requests = append $requests (dict "audience" "") }}
{{- end }}
{{- toYaml $requests }}
{{- end }}

{{/* The ServiceAccount that scrapes the agents with metrics.scrapeAuth serviceAccount. */}}
{{- define "fusevol.metricsReader" -}}
{{- printf "%s-metrics-reader" (include "fusevol.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Whether Prometheus can scrape the agents, checked: they must listen where it reaches them, and
answer it (with the manifests source they have no API server to check its token with).
*/}}
{{- define "fusevol.checkScrape" -}}
{{- $host := .Values.httpHost }}
{{- if or (hasPrefix "127." $host) (eq $host "::1") (eq $host "localhost") }}
{{- fail (printf "metrics.serviceMonitor, metrics.podMonitor: the agents listen on httpHost %s, where Prometheus cannot reach them: set httpHost \"\" (the pod's IP)" $host) }}
{{- end }}
{{- if and (not .Values.source.kubernetes) (eq .Values.httpAuth "kubernetes") }}
{{- fail "metrics.serviceMonitor, metrics.podMonitor: with the manifests source the agents answer /metrics to root on the node only (no API server to check a token with): set httpAuth none, or use source.kubernetes" }}
{{- end }}
{{- end }}

{{/*
One endpoint of the agents' ServiceMonitor or PodMonitor, after its port: (dict "root" $
"monitor" <its values> "address" <true: a PodMonitor's, the target's address made from the
pod's IP and httpPort>). The bearer token of metrics.scrapeAuth when httpAuth is kubernetes.
*/}}
{{- define "fusevol.agentEndpoint" -}}
{{- $ := .root }}
path: /metrics
scheme: http
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
honorLabels: true
{{- if eq $.Values.httpAuth "kubernetes" }}
{{- if eq $.Values.metrics.scrapeAuth "serviceAccount" }}
authorization:
  type: Bearer
  credentials:
    name: {{ include "fusevol.metricsReader" $ }}-token
    key: token
{{- else if .address }}
{{- fail "metrics.podMonitor: a PodMonitor cannot send Prometheus' own token (bearerTokenFile is a ServiceMonitor's only): set metrics.scrapeAuth serviceAccount" }}
{{- else }}
bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
{{- end }}
{{- end }}
relabelings:
  {{- if .address }}
  - sourceLabels: [__meta_kubernetes_pod_ip]
    regex: "([^:]+)"
    targetLabel: __address__
    replacement: "${1}:{{ $.Values.httpPort }}"
  - sourceLabels: [__meta_kubernetes_pod_ip]
    regex: "(.+:.+)"
    targetLabel: __address__
    replacement: "[${1}]:{{ $.Values.httpPort }}"
  {{- end }}
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  - targetLabel: job
    replacement: fusevol
  {{- with .monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
One endpoint of the webhook's ServiceMonitor or PodMonitor, after its port: its /metrics (open,
like its probes) over its TLS, checked with the CA of its certificate's Secret.
*/}}
{{- define "fusevol.webhookEndpoint" -}}
{{- $ := .root }}
{{- $name := include "fusevol.webhookName" $ }}
path: /metrics
scheme: https
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
honorLabels: true
tlsConfig:
  serverName: {{ printf "%s.%s.svc" $name $.Release.Namespace }}
  ca:
    secret:
      name: {{ $name }}-tls
      key: ca.crt
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  - targetLabel: job
    replacement: fusevol-webhook
  {{- with .monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
