{{/* Names, labels and the container environment of kafka-mirror-proxy. */}}

{{- define "kmp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kmp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kmp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kmp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kmp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kmp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The Secret holding the admin token, and its key. */}}
{{- define "kmp.adminSecretName" -}}
{{- default (printf "%s-admin" (include "kmp.fullname" .)) .Values.admin.existingSecret -}}
{{- end -}}

{{- define "kmp.adminSecretKey" -}}
{{- if .Values.admin.existingSecret -}}{{ .Values.admin.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* Refuse what the chart cannot render, before anything is applied. */}}
{{- define "kmp.validate" -}}
{{- if not (has .Values.routing.mode (list "nodePorts" "sni")) -}}
{{- fail (printf "routing.mode %q: nodePorts (a port per broker node) or sni (one TLS port, routed by host name)" .Values.routing.mode) -}}
{{- end -}}
{{- if eq .Values.routing.mode "sni" -}}
{{- if not .Values.tls.client.secretName -}}
{{- fail "routing.mode sni needs tls.client.secretName: SNI routing reads the host name from the TLS ClientHello" -}}
{{- end -}}
{{- if not .Values.routing.sni.hostPattern -}}
{{- fail "routing.mode sni needs routing.sni.hostPattern (e.g. broker-$(nodeId).kafka.example.com)" -}}
{{- end -}}
{{- if not (contains "$(nodeId)" .Values.routing.sni.hostPattern) -}}
{{- fail (printf "routing.sni.hostPattern %q must hold $(nodeId)" .Values.routing.sni.hostPattern) -}}
{{- end -}}
{{- if not .Values.routing.sni.bootstrapHost -}}
{{- fail "routing.mode sni needs routing.sni.bootstrapHost (e.g. bootstrap.kafka.example.com)" -}}
{{- end -}}
{{- if .Values.config.ADVERTISED_HOST -}}
{{- fail "config.ADVERTISED_HOST is for routing.mode nodePorts: with sni, nodes are advertised by routing.sni.hostPattern" -}}
{{- end -}}
{{- else if le (int .Values.routing.brokerPortBase) (int .Values.routing.bootstrapPort) -}}
{{- fail "routing.brokerPortBase must be above routing.bootstrapPort (the proxy refuses a node port on the bootstrap listener)" -}}
{{- end -}}
{{- $managed := dict
    "LISTEN" "routing.bootstrapPort"
    "BROKER_PORT_BASE" "routing.brokerPortBase"
    "SNI_HOST_PATTERN" "routing.sni.hostPattern"
    "SNI_BOOTSTRAP_HOST" "routing.sni.bootstrapHost"
    "SNI_ADVERTISED_PORT" "routing.sni.advertisedPort"
    "ADMIN_LISTEN" "admin.port"
    "ADMIN_TOKEN" "admin.existingSecret or admin.token"
    "ADMIN_URL" "admin.port"
    "INSTANCE_ID" "nothing: each pod is named by its pod name"
    "TLS_CERT" "tls.client.secretName"
    "TLS_KEY" "tls.client.secretName"
    "TLS_CLIENT_CA" "tls.client.clientCaKey"
    "UPSTREAM_TLS" "tls.upstream.secretName"
    "UPSTREAM_TLS_CA" "tls.upstream.caKey"
    "UPSTREAM_TLS_CERT" "tls.upstream.certKey"
    "UPSTREAM_TLS_KEY" "tls.upstream.keyKey"
    "LINKS" "links"
    "UPSTREAM_SASL_PASSWORD" "secretEnv (a secret)"
    "STATE_KEY" "secretEnv (a secret)" -}}
{{- range $key, $_ := .Values.config -}}
{{- if hasKey $managed $key -}}
{{- fail (printf "config.%s is set by the chart: use %s" $key (get $managed $key)) -}}
{{- else if hasPrefix "LINK_" $key -}}
{{- fail (printf "config.%s: configure links under links" $key) -}}
{{- else if hasPrefix "MIRROR_PROXY_" $key -}}
{{- fail (printf "config.%s: name variables without the MIRROR_PROXY_ prefix" $key) -}}
{{- end -}}
{{- end -}}
{{- range $key, $_ := .Values.secretEnv -}}
{{- if and (hasKey $managed $key) (not (has $key (list "UPSTREAM_SASL_PASSWORD" "STATE_KEY"))) -}}
{{- fail (printf "secretEnv.%s is set by the chart: use %s" $key (get $managed $key)) -}}
{{- end -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "%s is set in both config and secretEnv" $key) -}}
{{- end -}}
{{- end -}}
{{- range .Values.links -}}
{{- if not (regexMatch "^[a-z0-9-]+$" (toString .name)) -}}
{{- fail (printf "links: name %q must be [a-z0-9-]+" (toString .name)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.tls.client.clientCaKey (not .Values.tls.client.secretName) -}}
{{- fail "tls.client.clientCaKey needs tls.client.secretName" -}}
{{- end -}}
{{- end -}}

{{/* The proxy's MIRROR_PROXY_* variables. */}}
{{- define "kmp.env" -}}
{{- $_ := required "config.BOOTSTRAP_SERVERS is required (the destination brokers, host:port,...)" .Values.config.BOOTSTRAP_SERVERS -}}
- name: MIRROR_PROXY_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.routing.bootstrapPort) | quote }}
{{- if eq .Values.routing.mode "sni" }}
{{- /* $$ keeps Kubernetes from reading $(nodeId) as a reference to another variable */}}
- name: MIRROR_PROXY_SNI_HOST_PATTERN
  value: {{ .Values.routing.sni.hostPattern | replace "$(" "$$(" | quote }}
- name: MIRROR_PROXY_SNI_BOOTSTRAP_HOST
  value: {{ .Values.routing.sni.bootstrapHost | quote }}
{{- with .Values.routing.sni.advertisedPort }}
- name: MIRROR_PROXY_SNI_ADVERTISED_PORT
  value: {{ . | int | toString | quote }}
{{- end }}
{{- else }}
{{- $_ := required "config.ADVERTISED_HOST is required with routing.mode nodePorts (the host name clients reach the Service at)" .Values.config.ADVERTISED_HOST }}
- name: MIRROR_PROXY_BROKER_PORT_BASE
  value: {{ .Values.routing.brokerPortBase | int | toString | quote }}
{{- end }}
- name: MIRROR_PROXY_ADMIN_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.admin.port) | quote }}
- name: MIRROR_PROXY_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "kmp.adminSecretName" . }}
      key: {{ include "kmp.adminSecretKey" . }}
# For the CLI in the container: kubectl exec ... -- kafka-mirror-proxy links
- name: MIRROR_PROXY_ADMIN_URL
  value: {{ printf "http://127.0.0.1:%d" (int .Values.admin.port) | quote }}
- name: MIRROR_PROXY_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- $sni := eq .Values.routing.mode "sni" }}
{{- range $key, $value := .Values.config }}
{{- /* values.yaml's empty ADVERTISED_HOST is for nodePorts only */}}
{{- if not (or (kindIs "invalid" $value) (and $sni (eq $key "ADVERTISED_HOST"))) }}
- name: MIRROR_PROXY_{{ $key }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- range $key, $ref := .Values.secretEnv }}
- name: MIRROR_PROXY_{{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "secretEnv.%s.name is required" $key) $ref.name }}
      key: {{ required (printf "secretEnv.%s.key is required" $key) $ref.key }}
{{- end }}
{{- with .Values.tls.client }}
{{- if .secretName }}
- name: MIRROR_PROXY_TLS_CERT
  value: /etc/kafka-mirror-proxy/tls/client/tls.crt
- name: MIRROR_PROXY_TLS_KEY
  value: /etc/kafka-mirror-proxy/tls/client/tls.key
{{- if .clientCaKey }}
- name: MIRROR_PROXY_TLS_CLIENT_CA
  value: /etc/kafka-mirror-proxy/tls/client/{{ .clientCaKey }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.tls.upstream }}
{{- if .secretName }}
- name: MIRROR_PROXY_UPSTREAM_TLS
  value: "true"
- name: MIRROR_PROXY_UPSTREAM_TLS_CA
  value: /etc/kafka-mirror-proxy/tls/upstream/{{ .caKey }}
{{- if .certKey }}
- name: MIRROR_PROXY_UPSTREAM_TLS_CERT
  value: /etc/kafka-mirror-proxy/tls/upstream/{{ .certKey }}
{{- end }}
{{- if .keyKey }}
- name: MIRROR_PROXY_UPSTREAM_TLS_KEY
  value: /etc/kafka-mirror-proxy/tls/upstream/{{ .keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.links }}
{{- $names := list }}
{{- range . }}{{ $names = append $names (toString .name) }}{{ end }}
- name: MIRROR_PROXY_LINKS
  value: {{ join "," $names | quote }}
{{- range . }}
{{- $link := upper (replace "-" "_" (toString .name)) }}
{{- range $key, $value := . }}
{{- if ne $key "name" }}
- name: MIRROR_PROXY_LINK_{{ $link }}_{{ $key | snakecase | upper }}
  value: {{ if kindIs "slice" $value }}{{ join "," $value | quote }}{{ else }}{{ $value | toString | quote }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
An exec probe: GET a path of the admin endpoint with the bearer token from
the container's environment; succeeds on 200. Arguments: path, port.
*/}}
{{- define "kmp.probeScript" -}}
exec 3<>"/dev/tcp/127.0.0.1/$2" || exit 1
printf 'GET %s HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' "$1" "$MIRROR_PROXY_ADMIN_TOKEN" >&3 || exit 1
IFS= read -r -t 4 status <&3 || { echo "GET $1: no answer" >&2; exit 1; }
case $status in "HTTP/1.1 200"*) exit 0 ;; esac
echo "GET $1: $status" >&2
exit 1
{{- end -}}

{{- define "kmp.probe" -}}
exec:
  command: {{ list "bash" "-c" (include "kmp.probeScript" .root) "admin-probe" .path (toString (int .root.Values.admin.port)) | toJson }}
{{- with .settings }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The replicator (`kafka-mirror-proxy replicate`). Its pods carry their own
app.kubernetes.io/name (<name>-replicator): the proxy's selectors (its
Deployment, Services, PodDisruptionBudget) match on name and instance, so
with the proxy's name they would take the replicator's pods for proxies.
*/}}
{{- define "kmp.replicatorFullname" -}}
{{- printf "%s-replicator" (include "kmp.fullname" . | trunc 46 | trimSuffix "-") -}}
{{- end -}}

{{- define "kmp.replicatorSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-replicator" (include "kmp.name" . | trunc 52 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kmp.replicatorLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kmp.replicatorSelectorLabels" . }}
app.kubernetes.io/part-of: {{ include "kmp.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The entry of `links` the replicator writes as (empty if none). */}}
{{- define "kmp.replicatorLink" -}}
{{- range .Values.links -}}
{{- if eq (toString .name) (toString $.Values.replicator.link) -}}{{ toJson . }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* Refuse a replicator the chart cannot render, before anything is applied. */}}
{{- define "kmp.replicatorValidate" -}}
{{- $r := .Values.replicator -}}
{{- if not $r.sourceBootstrapServers -}}
{{- fail "replicator.sourceBootstrapServers is required (the source cluster, host:port,...)" -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9-]+$" (toString $r.link)) -}}
{{- fail (printf "replicator.link %q: the name of a link, [a-z0-9-]+" (toString $r.link)) -}}
{{- end -}}
{{- $json := include "kmp.replicatorLink" . -}}
{{- $link := dict -}}
{{- if $json }}{{ $link = fromJson $json }}{{ end -}}
{{- if and (not $json) (not $r.destinationBootstrapServers) -}}
{{- fail (printf "replicator.link %q is not under links, so this chart's proxy would refuse its writes: add the link, or set replicator.destinationBootstrapServers to the proxy that has it" (toString $r.link)) -}}
{{- end -}}
{{- if not (or $r.topics $link.topics) -}}
{{- fail "replicator.topics is required (the link's topics are the default, and it has none here)" -}}
{{- end -}}
{{- if and $r.clientId $link.clientId (ne (toString $r.clientId) (toString $link.clientId)) -}}
{{- fail (printf "replicator.clientId %q differs from the link's clientId %q: the proxy knows the link by its client id" (toString $r.clientId) (toString $link.clientId)) -}}
{{- end -}}
{{- if and (not $r.destinationBootstrapServers) .Values.tls.client.secretName (not $r.tls.destination.secretName) -}}
{{- fail "the proxy serves TLS (tls.client.secretName): replicator.tls.destination.secretName must hold the CA that signed its certificate" -}}
{{- end -}}
{{- if and $link.tlsSubject (not (and $r.tls.destination.certKey $r.tls.destination.keyKey)) -}}
{{- fail (printf "link %q has a tlsSubject: replicator.tls.destination needs secretName, certKey and keyKey (a client certificate with that subject)" (toString $r.link)) -}}
{{- end -}}
{{- range $side := list "source" "destination" -}}
{{- $tls := get $r.tls $side -}}
{{- if and (or $tls.certKey $tls.keyKey) (not $tls.secretName) -}}
{{- fail (printf "replicator.tls.%s.certKey and keyKey need replicator.tls.%s.secretName" $side $side) -}}
{{- end -}}
{{- end -}}
{{- $managed := dict
    "SOURCE_BOOTSTRAP_SERVERS" "replicator.sourceBootstrapServers"
    "DESTINATION_BOOTSTRAP_SERVERS" "replicator.destinationBootstrapServers"
    "LINK" "replicator.link"
    "TOPICS" "replicator.topics"
    "CLIENT_ID" "replicator.clientId"
    "GROUP_ID" "replicator.groupId"
    "ADMIN_LISTEN" "replicator.admin.port"
    "SOURCE_TLS" "replicator.tls.source.secretName"
    "SOURCE_TLS_CA" "replicator.tls.source.caKey"
    "SOURCE_TLS_CERT" "replicator.tls.source.certKey"
    "SOURCE_TLS_KEY" "replicator.tls.source.keyKey"
    "SOURCE_TLS_SERVER_NAME" "replicator.tls.source.serverName"
    "DESTINATION_TLS" "replicator.tls.destination.secretName"
    "DESTINATION_TLS_CA" "replicator.tls.destination.caKey"
    "DESTINATION_TLS_CERT" "replicator.tls.destination.certKey"
    "DESTINATION_TLS_KEY" "replicator.tls.destination.keyKey"
    "DESTINATION_TLS_SERVER_NAME" "replicator.tls.destination.serverName"
    "SOURCE_SASL_PASSWORD" "replicator.secretEnv (a secret)"
    "DESTINATION_SASL_PASSWORD" "replicator.secretEnv (a secret)"
    "UNTIL_CAUGHT_UP" "nothing: a Deployment restarts a pod that exits, so the replicator here runs until stopped" -}}
{{- range $key, $_ := $r.config -}}
{{- if hasKey $managed $key -}}
{{- fail (printf "replicator.config.%s is set by the chart: use %s" $key (get $managed $key)) -}}
{{- else if hasPrefix "MIRROR_" $key -}}
{{- fail (printf "replicator.config.%s: name variables without the MIRROR_REPLICATOR_ prefix" $key) -}}
{{- end -}}
{{- end -}}
{{- range $key, $_ := $r.secretEnv -}}
{{- if and (hasKey $managed $key) (not (hasSuffix "_SASL_PASSWORD" $key)) -}}
{{- fail (printf "replicator.secretEnv.%s is set by the chart: use %s" $key (get $managed $key)) -}}
{{- end -}}
{{- if hasKey $r.config $key -}}
{{- fail (printf "replicator: %s is set in both config and secretEnv" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The replicator's MIRROR_REPLICATOR_* variables (flags of the contract). */}}
{{- define "kmp.replicatorEnv" -}}
{{- $r := .Values.replicator -}}
{{- $json := include "kmp.replicatorLink" . -}}
{{- $link := dict -}}
{{- if $json }}{{ $link = fromJson $json }}{{ end -}}
{{- $sni := eq .Values.routing.mode "sni" -}}
{{- $destination := $r.destinationBootstrapServers -}}
{{- $serverName := $r.tls.destination.serverName -}}
{{- if not $destination -}}
{{- if $sni -}}
{{- $destination = printf "%s:%d" .Values.routing.sni.bootstrapHost (int (.Values.routing.sni.advertisedPort | default .Values.routing.bootstrapPort)) -}}
{{- else -}}
{{- $destination = printf "%s.%s.svc:%d" (include "kmp.fullname" .) .Release.Namespace (int .Values.routing.bootstrapPort) -}}
{{- /* The bootstrap is the Service's name, every node ADVERTISED_HOST's. */}}
{{- if and $r.tls.destination.secretName (not $serverName) -}}
{{- $serverName = .Values.config.ADVERTISED_HOST -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $topics := $r.topics | default $link.topics -}}
- name: MIRROR_REPLICATOR_SOURCE_BOOTSTRAP_SERVERS
  value: {{ $r.sourceBootstrapServers | quote }}
- name: MIRROR_REPLICATOR_DESTINATION_BOOTSTRAP_SERVERS
  value: {{ $destination | quote }}
- name: MIRROR_REPLICATOR_LINK
  value: {{ $r.link | toString | quote }}
- name: MIRROR_REPLICATOR_TOPICS
  value: {{ if kindIs "slice" $topics }}{{ join "," $topics | quote }}{{ else }}{{ $topics | toString | quote }}{{ end }}
{{- with ($r.clientId | default $link.clientId) }}
- name: MIRROR_REPLICATOR_CLIENT_ID
  value: {{ . | toString | quote }}
{{- end }}
{{- with $r.groupId }}
- name: MIRROR_REPLICATOR_GROUP_ID
  value: {{ . | toString | quote }}
{{- end }}
- name: MIRROR_REPLICATOR_ADMIN_LISTEN
  value: {{ printf "0.0.0.0:%d" (int $r.admin.port) | quote }}
{{- range $key, $value := $r.config }}
{{- if not (kindIs "invalid" $value) }}
- name: MIRROR_REPLICATOR_{{ $key }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- range $key, $ref := $r.secretEnv }}
- name: MIRROR_REPLICATOR_{{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "replicator.secretEnv.%s.name is required" $key) $ref.name }}
      key: {{ required (printf "replicator.secretEnv.%s.key is required" $key) $ref.key }}
{{- end }}
{{- range $side := list "source" "destination" }}
{{- $tls := get $r.tls $side }}
{{- if $tls.secretName }}
{{- $prefix := printf "MIRROR_REPLICATOR_%s_TLS" (upper $side) }}
{{- $dir := printf "/etc/kafka-mirror-proxy/tls/%s" $side }}
- name: {{ $prefix }}
  value: "true"
{{- if $tls.caKey }}
- name: {{ $prefix }}_CA
  value: {{ printf "%s/%s" $dir $tls.caKey | quote }}
{{- end }}
{{- if $tls.certKey }}
- name: {{ $prefix }}_CERT
  value: {{ printf "%s/%s" $dir $tls.certKey | quote }}
{{- end }}
{{- if $tls.keyKey }}
- name: {{ $prefix }}_KEY
  value: {{ printf "%s/%s" $dir $tls.keyKey | quote }}
{{- end }}
{{- with (ternary $serverName $tls.serverName (eq $side "destination")) }}
- name: {{ $prefix }}_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
