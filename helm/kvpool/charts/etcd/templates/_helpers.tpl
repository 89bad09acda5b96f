{{/* Names of the etcd subchart's objects. */}}

{{- define "etcd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "etcd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "etcd.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that gives each member its DNS name. */}}
{{- define "etcd.peerService" -}}
{{- printf "%s-headless" (include "etcd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "etcd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "etcd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "etcd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "etcd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: membership
app.kubernetes.io/part-of: kvpool
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The member DNS name of ordinal $i: <fullname>-<i>.<headless>.<namespace>.svc.<domain>. */}}
{{- define "etcd.memberHost" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "etcd.fullname" $root) (index . 1) (include "etcd.peerService" $root) $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end -}}

{{/* --initial-cluster: every member's name=peer URL. */}}
{{- define "etcd.initialCluster" -}}
{{- $root := . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- $host := include "etcd.memberHost" (list $root $i) -}}
{{- $members = append $members (printf "%s-%d=http://%s:%d" (include "etcd.fullname" $root) $i $host (int $root.Values.ports.peer)) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}
