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
{{- fail "etcd: set etcd.enabled=true (the bundled etcd) or externalEtcd.endpoints (a list of http://host:2379, or https:// with security.etcdTls)" -}}
{{- end -}}
{{- end -}}

{{/* Where the Secrets are mounted in the pods. */}}
{{- define "kvpool.secretsDir" -}}/etc/kvpool/secrets{{- end -}}
{{- define "kvpool.tenantsDir" -}}/etc/kvpool/tenants{{- end -}}
{{- define "kvpool.etcdTlsDir" -}}
{{- if .Values.security.etcdTls.existingSecret -}}/etc/kvpool/etcd{{- else -}}{{ include "kvpool.secretsDir" . }}{{- end -}}
{{- end -}}

{{/* Whether the chart makes the kvpool Secret: "true" or "". It does unless secrets.existingSecret
     names one, whenever it has a token to put in it (security.token) or secrets.create asks. */}}
{{- define "kvpool.ownSecret" -}}
{{- if and (not .Values.secrets.existingSecret) (or .Values.secrets.create .Values.security.token) -}}true{{- end -}}
{{- end -}}

{{/* Whether the pods mount the kvpool Secret (secrets.*): "true" or "". */}}
{{- define "kvpool.secretsMounted" -}}
{{- if or .Values.secrets.existingSecret (include "kvpool.ownSecret" .) -}}true{{- end -}}
{{- end -}}

{{/* The token the chart's Secret holds (empty: none). secrets.token if given; else the token of
     the Secret already in the cluster, so that an upgrade or a reinstall keeps what the daemons
     and engines hold; else a new random one. secrets.create with security.token off makes one
     too: engines can mount it before the daemons require it. Under `helm template` and
     --dry-run (no cluster) lookup finds nothing and every render draws anew, so include this
     once per render (templates/secret.yaml). */}}
{{- define "kvpool.token" -}}
{{- if .Values.secrets.token -}}
{{- .Values.secrets.token -}}
{{- else if include "kvpool.ownSecret" . -}}
{{- $live := lookup "v1" "Secret" .Release.Namespace (include "kvpool.secretName" .) -}}
{{- $kept := dig "data" "token" "" $live -}}
{{- if $kept -}}{{- b64dec $kept -}}{{- else -}}{{- randAlphaNum 48 -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The suffix of the DNS names the daemons advertise with TLS: <pod IP, dashed>.<suffix> is the
     headless Service's record of each pod, and tls.crt must carry *.<suffix>. */}}
{{- define "kvpool.tlsNameSuffix" -}}
{{- printf "%s.%s.svc.%s" (include "kvpool.fullname" .) .Release.Namespace .Values.security.tls.clusterDomain -}}
{{- end -}}

{{/* Checks security.* against secrets.* and the etcd values; fails with what to change. */}}
{{- define "kvpool.validateSecurity" -}}
{{- $sec := .Values.security -}}
{{- $s := .Values.secrets -}}
{{- $mounted := include "kvpool.secretsMounted" . -}}
{{- $own := include "kvpool.ownSecret" . -}}
{{- if and $sec.tenants.existingSecret (not $sec.token) -}}
{{- fail "security.tenants.existingSecret needs security.token=true: the daemons prove the cluster's token to each other, and it stays the tenant with every right" -}}
{{- end -}}
{{- if and $sec.tls.clientAuth (not $sec.tls.enabled) -}}
{{- fail "security.tls.clientAuth=true needs security.tls.enabled=true: client certificates are checked in the TLS handshake" -}}
{{- end -}}
{{- if and $sec.tls.dataPlane (not $sec.tls.enabled) -}}
{{- fail "security.tls.dataPlane=true needs security.tls.enabled=true: the data port uses the gRPC port's certificate (tls.crt, tls.key)" -}}
{{- end -}}
{{- if and $sec.tls.enabled (not $mounted) -}}
{{- fail "security.tls.enabled reads the kvpool Secret: set secrets.existingSecret, or secrets.create=true with secrets.tls.*" -}}
{{- end -}}
{{- if $own -}}
{{- if and $s.token (or (lt (len (trim $s.token)) 16) (gt (len (trim $s.token)) 1024) (regexMatch "[^!-~]" (trim $s.token))) -}}
{{- fail "secrets.token must be 16..1024 printable ASCII characters without spaces (e.g. the output of: openssl rand -hex 32), or empty: the chart then generates one" -}}
{{- end -}}
{{- if and $sec.tls.enabled (not (and $s.tls.cert $s.tls.key $s.tls.ca)) -}}
{{- fail "security.tls.enabled=true needs secrets.tls.cert, secrets.tls.key and secrets.tls.ca (the CA that issued the certificate: the pods verify each other with it)" -}}
{{- end -}}
{{- end -}}
{{- $etcdTls := $sec.etcdTls -}}
{{- if $etcdTls.enabled -}}
{{- if .Values.etcd.enabled -}}
{{- fail "security.etcdTls.enabled=true needs an external etcd: the bundled one (etcd.enabled=true) serves plaintext; set etcd.enabled=false and externalEtcd.endpoints (https://...)" -}}
{{- end -}}
{{- range .Values.externalEtcd.endpoints -}}
{{- if not (hasPrefix "https://" .) -}}
{{- fail (printf "security.etcdTls.enabled=true: externalEtcd.endpoints must all be https:// URLs, not %s" .) -}}
{{- end -}}
{{- end -}}
{{- if not (or $etcdTls.existingSecret $mounted) -}}
{{- fail "security.etcdTls.enabled=true needs etcd's CA: set security.etcdTls.existingSecret (keys ca.crt, tls.crt, tls.key), or put ca.crt in the kvpool Secret (secrets.*)" -}}
{{- end -}}
{{- if and $own (not $etcdTls.existingSecret) (not $s.tls.ca) -}}
{{- fail "security.etcdTls.enabled=true without security.etcdTls.existingSecret takes etcd's CA from secrets.tls.ca: set it" -}}
{{- end -}}
{{- if and $own (not $etcdTls.existingSecret) $etcdTls.clientCert (not (and $s.tls.cert $s.tls.key)) -}}
{{- fail "security.etcdTls.clientCert=true without security.etcdTls.existingSecret presents secrets.tls.cert and secrets.tls.key: set them" -}}
{{- end -}}
{{- else if or $etcdTls.clientCert $etcdTls.existingSecret -}}
{{- fail "security.etcdTls.clientCert and security.etcdTls.existingSecret need security.etcdTls.enabled=true" -}}
{{- else if not .Values.etcd.enabled -}}
{{- $https := 0 -}}
{{- range .Values.externalEtcd.endpoints -}}
{{- if hasPrefix "https://" . -}}{{- $https = add1 $https -}}{{- end -}}
{{- end -}}
{{- if and (gt $https 0) (lt $https (len .Values.externalEtcd.endpoints)) -}}
{{- fail "externalEtcd.endpoints mix https:// and plaintext URLs: use one scheme for all members" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The daemon's security settings (paths in the mounted Secrets), as YAML; checks the values first. */}}
{{- define "kvpool.securitySettings" -}}
{{- include "kvpool.validateSecurity" . -}}
{{- $sec := .Values.security -}}
{{- $dir := include "kvpool.secretsDir" . -}}
{{- $settings := dict -}}
{{- if $sec.token -}}
{{- $_ := set $settings "auth_token_file" (printf "%s/token" $dir) -}}
{{- end -}}
{{- if $sec.tenants.existingSecret -}}
{{- $_ := set $settings "auth_tenants_file" (printf "%s/%s" (include "kvpool.tenantsDir" .) $sec.tenants.key) -}}
{{- end -}}
{{- if $sec.tls.enabled -}}
{{- $_ := set $settings "tls_cert_file" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $settings "tls_key_file" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- if $sec.tls.clientAuth -}}
{{- $_ := set $settings "tls_client_ca_file" (printf "%s/ca.crt" $dir) -}}
{{- end -}}
{{- if $sec.tls.dataPlane -}}
{{- $_ := set $settings "data_tls" true -}}
{{- end -}}
{{- if $sec.etcdTls.enabled -}}
{{- $etcdDir := include "kvpool.etcdTlsDir" . -}}
{{- $_ := set $settings "etcd_ca_file" (printf "%s/ca.crt" $etcdDir) -}}
{{- if $sec.etcdTls.clientCert -}}
{{- $_ := set $settings "etcd_cert_file" (printf "%s/tls.crt" $etcdDir) -}}
{{- $_ := set $settings "etcd_key_file" (printf "%s/tls.key" $etcdDir) -}}
{{- end -}}
{{- end -}}
{{- if $settings -}}{{- toYaml $settings -}}{{- end -}}
{{- end -}}

{{/* Client-side environment of kvpool_client and kvpoolctl in the chart's pods (the preStop drain,
     the daemon's own hand-offs and repairs, helm test): the same files as the daemon's settings. */}}
{{- define "kvpool.clientSecurityEnv" -}}
{{- $sec := .Values.security -}}
{{- $dir := include "kvpool.secretsDir" . -}}
{{- if $sec.token }}
- name: KVPOOL_AUTH_TOKEN_FILE
  value: {{ $dir }}/token
{{- end }}
{{- if $sec.tls.enabled }}
- name: KVPOOL_TLS_CA_FILE
  value: {{ $dir }}/ca.crt
{{- end }}
{{- if $sec.tls.clientAuth }}
- name: KVPOOL_TLS_CLIENT_CERT_FILE
  value: {{ $dir }}/tls.crt
- name: KVPOOL_TLS_CLIENT_KEY_FILE
  value: {{ $dir }}/tls.key
{{- end }}
{{- if $sec.etcdTls.enabled }}
{{- $etcdDir := include "kvpool.etcdTlsDir" . }}
- name: KVPOOL_ETCD_CA_FILE
  value: {{ $etcdDir }}/ca.crt
{{- if $sec.etcdTls.clientCert }}
- name: KVPOOL_ETCD_CERT_FILE
  value: {{ $etcdDir }}/tls.crt
- name: KVPOOL_ETCD_KEY_FILE
  value: {{ $etcdDir }}/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Volume mounts and volumes of the Secrets, for the daemon and the helm test. */}}
{{- define "kvpool.secretMounts" -}}
{{- if include "kvpool.secretsMounted" . }}
- name: secrets
  mountPath: {{ include "kvpool.secretsDir" . }}
  readOnly: true
{{- end }}
{{- if and .Values.security.etcdTls.enabled .Values.security.etcdTls.existingSecret }}
- name: etcd-tls
  mountPath: {{ include "kvpool.etcdTlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.security.tenants.existingSecret }}
# The whole Secret, not a subPath: a subPath mount would never see the Secret change.
- name: tenants
  mountPath: {{ include "kvpool.tenantsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "kvpool.secretVolumes" -}}
{{- if include "kvpool.secretsMounted" . }}
- name: secrets
  secret:
    secretName: {{ include "kvpool.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- if and .Values.security.etcdTls.enabled .Values.security.etcdTls.existingSecret }}
- name: etcd-tls
  secret:
    secretName: {{ .Values.security.etcdTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.security.tenants.existingSecret }}
- name: tenants
  secret:
    secretName: {{ .Values.security.tenants.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* Checks dataPlane.* against the ports, security.* and extraEnv; fails with what to change. */}}
{{- define "kvpool.validateDataPlane" -}}
{{- $ucx := .Values.dataPlane.ucx -}}
{{- $owned := dict "UCX_TLS" "dataPlane.ucx.tls" "UCX_NET_DEVICES" "dataPlane.ucx.netDevices"
      "UCX_TCP_PORT_RANGE" "dataPlane.ucx.tcpPortRange" "KVPOOL_UCX_PORT" "dataPlane.ucx.port"
      "KVPOOL_UCX_TLS" "dataPlane.ucx.tls" "KVPOOL_UCX_PROGRESS_MODE" "dataPlane.ucx.progressMode"
      "KVPOOL_UCX_NET_DEVICES" "dataPlane.ucx.netDevices" -}}
{{- range .Values.extraEnv -}}
{{- $value := get $owned .name -}}
{{- if $value -}}
{{- fail (printf "extraEnv %s: the chart sets it from %s; set that value instead" .name $value) -}}
{{- end -}}
{{- end -}}
{{- if $ucx.enabled -}}
{{- if .Values.security.tls.dataPlane -}}
{{- fail "dataPlane.ucx.enabled=true cannot be combined with security.tls.dataPlane=true: UCX has no TLS (the daemon refuses data_tls with ucx_port); turn one of them off" -}}
{{- end -}}
{{- $ports := dict "ports.grpc" (int .Values.ports.grpc) "ports.data" (int .Values.ports.data) "ports.metrics" (int .Values.ports.metrics) -}}
{{- range $name, $port := $ports -}}
{{- if eq $port (int $ucx.port) -}}
{{- fail (printf "dataPlane.ucx.port %d: must differ from %s" (int $ucx.port) $name) -}}
{{- end -}}
{{- end -}}
{{- $range := splitList "-" $ucx.tcpPortRange -}}
{{- $first := atoi (first $range) -}}
{{- $last := atoi (last $range) -}}
{{- if or (lt $first 1) (gt $last 65535) (gt $first $last) -}}
{{- fail (printf "dataPlane.ucx.tcpPortRange %s: must be FIRST-LAST with 1 <= FIRST <= LAST <= 65535" $ucx.tcpPortRange) -}}
{{- end -}}
{{- $_ := set $ports "dataPlane.ucx.port" (int $ucx.port) -}}
{{- range $name, $port := $ports -}}
{{- if and (ge $port $first) (le $port $last) -}}
{{- fail (printf "dataPlane.ucx.tcpPortRange %s holds %s (%d): UCX's TCP transport would take it; move the range" $ucx.tcpPortRange $name $port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The daemon's UCX settings, as YAML (empty with dataPlane.ucx off); checks the values first. */}}
{{- define "kvpool.ucxSettings" -}}
{{- include "kvpool.validateDataPlane" . -}}
{{- $ucx := .Values.dataPlane.ucx -}}
{{- if $ucx.enabled -}}
{{- $settings := dict "ucx_port" (int $ucx.port) "ucx_tls" (join "," $ucx.tls) "ucx_progress_mode" $ucx.progressMode -}}
{{- with $ucx.netDevices -}}
{{- $_ := set $settings "ucx_net_devices" (join "," .) -}}
{{- end -}}
{{- toYaml $settings -}}
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
{{- $_ := merge $fixed (fromYaml (include "kvpool.securitySettings" .)) -}}
{{- $_ := merge $fixed (fromYaml (include "kvpool.ucxSettings" .)) -}}
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
