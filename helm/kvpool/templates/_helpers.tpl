{{/* Names, labels and derived settings of the kvpool chart. */}}

{{- define "kvpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvpool.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kvpool.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kvpool.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: daemon
{{- end -}}

{{- define "kvpool.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvpool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kvpool
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvpool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kvpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvpool.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding TLS material and tokens: the chart's own or an existing one. */}}
{{- define "kvpool.secretName" -}}
{{- default (printf "%s-secrets" (include "kvpool.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The etcd subchart's objects are named <release>-etcd unless overridden. */}}
{{- define "kvpool.etcdFullname" -}}
{{- if .Values.etcd.fullnameOverride -}}
{{- .Values.etcd.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default "etcd" .Values.etcd.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* etcd client URLs, comma separated: the subchart's Service or the external endpoints. */}}
{{- define "kvpool.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "kvpool.etcdFullname" .) .Release.Namespace (int .Values.etcd.ports.client) -}}
{{- else if .Values.externalEtcd.endpoints -}}
{{- join "," .Values.externalEtcd.endpoints -}}
{{- else -}}
{{- fail "etcd: set etcd.enabled=true (the bundled etcd) or externalEtcd.endpoints (a list of http://host:2379)" -}}
{{- end -}}
{{- end -}}

{{/* The daemon's YAML config (keys are kvpool-server's settings), as a dict. */}}
{{- define "kvpool.daemonConfig" -}}
{{- $fixed := dict
      "host" .Values.bindAddress
      "grpc_port" (int .Values.ports.grpc)
      "data_port" (int .Values.ports.data)
      "metrics_port" (int .Values.ports.metrics)
      "shm_dir" "/dev/shm" -}}
{{- if .Values.ssd.enabled -}}
{{- $_ := set $fixed "ssd_dir" .Values.ssd.mountPath -}}
{{- $_ := set $fixed "ssd_capacity" .Values.ssd.capacity -}}
{{- $_ := set $fixed "ssd_segment_size" .Values.ssd.segmentSize -}}
{{- $_ := set $fixed "ssd_fsync" .Values.ssd.fsync -}}
{{- end -}}
{{- toYaml (merge $fixed .Values.config) -}}
{{- end -}}

{{/* Seconds the daemon may take to stop: the preStop drain, the daemon's own grace,
     the SSD flush at shutdown, a margin. */}}
{{- define "kvpool.terminationGrace" -}}
{{- $drain := ternary (int .Values.drain.timeoutSeconds) 0 .Values.drain.enabled -}}
{{- $grace := int (ceil (default 10 .Values.config.shutdown_grace_s)) -}}
{{- $flush := ternary (int .Values.ssd.shutdownFlushSeconds) 0 .Values.ssd.enabled -}}
{{- add $drain $grace $flush (int .Values.drain.extraGraceSeconds) -}}
{{- end -}}
