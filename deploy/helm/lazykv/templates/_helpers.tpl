{{/*
Names. Component names stay within 63 characters with their longest suffix
("-cache-headless"), and the StatefulSet's within the 52 its pods' revision label allows.
*/}}
{{- define "lazykv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lazykv.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lazykv.cacheName" -}}{{ include "lazykv.fullname" . }}-cache{{- end -}}
{{- define "lazykv.cacheHeadlessName" -}}{{ include "lazykv.fullname" . }}-cache-headless{{- end -}}
{{- define "lazykv.workerName" -}}{{ include "lazykv.fullname" . }}-worker{{- end -}}

{{- define "lazykv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels; pass (dict "root" $ "component" "cache-server"|"worker"). */}}
{{- define "lazykv.labels" -}}
helm.sh/chart: {{ include "lazykv.chart" .root }}
{{ include "lazykv.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: lazykv
{{- end -}}

{{- define "lazykv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lazykv.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "lazykv.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}

{{/*
The cache servers' stable DNS names in ordinal order, as --cache-servers wants them:
<cache>-0.<headless>.<namespace>.svc.<domain>:PORT,... Rendezvous hashing picks a key's
owner from this list, so every worker must see the same list in the same order.
*/}}
{{- define "lazykv.cacheServerList" -}}
{{- $servers := list -}}
{{- range $i := until (int .Values.cacheServer.replicas) -}}
{{- $servers = append $servers (printf "%s-%d.%s.%s.svc.%s:%d" (include "lazykv.cacheName" $) $i (include "lazykv.cacheHeadlessName" $) $.Release.Namespace $.Values.clusterDomain (int $.Values.cacheServer.port)) -}}
{{- end -}}
{{- join "," $servers -}}
{{- end -}}

{{/*
A Kubernetes quantity ("8Gi", "100G", "1.5Ti", "8589934592") in bytes, as an integer
string. Fails on what it cannot read.
*/}}
{{- define "lazykv.quantityBytes" -}}
{{- $q := .quantity -}}
{{- if kindIs "float64" $q -}}{{- $q = printf "%.0f" $q -}}{{- end -}}
{{- $q = toString $q | trim -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $q) -}}
{{- fail (printf "%s: cannot read the quantity %q (use e.g. 8Gi, 100G or a number of bytes), or set the capacity explicitly" .what $q) -}}
{{- end -}}
{{- $units := dict "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 -}}
{{- $suffix := regexFind "[A-Za-z]+$" $q -}}
{{- $number := trimSuffix $suffix $q | float64 -}}
{{- $scale := 1.0 -}}
{{- if $suffix -}}{{- $scale = get $units $suffix -}}{{- end -}}
{{- printf "%.0f" (mulf $number $scale) -}}
{{- end -}}

{{/*
A capacity flag's value: the explicit value when given, else fraction x quantity in whole
MiB, else empty (the server's default). Pass (dict "explicit" "fraction" "quantity" "what").
*/}}
{{- define "lazykv.capacity" -}}
{{- if not (eq (toString .explicit) "") -}}
{{- toString .explicit -}}
{{- else if .quantity -}}
{{- $bytes := include "lazykv.quantityBytes" (dict "quantity" .quantity "what" .what) | float64 -}}
{{- $mib := floor (divf (mulf $bytes .fraction) 1048576.0) | int64 -}}
{{- if lt $mib 1 -}}
{{- fail (printf "%s: %v x %v is under 1MiB" .what .fraction .quantity) -}}
{{- end -}}
{{- printf "%dMiB" $mib -}}
{{- end -}}
{{- end -}}

{{- define "lazykv.cacheHostCapacity" -}}
{{- $limits := .Values.cacheServer.resources.limits | default dict -}}
{{- include "lazykv.capacity" (dict "explicit" .Values.cacheServer.hostCapacity "fraction" .Values.cacheServer.hostCapacityFraction "quantity" (get $limits "memory") "what" "cacheServer.resources.limits.memory") -}}
{{- end -}}

{{- define "lazykv.cacheDiskCapacity" -}}
{{- include "lazykv.capacity" (dict "explicit" .Values.cacheServer.diskCapacity "fraction" .Values.cacheServer.diskCapacityFraction "quantity" .Values.cacheServer.persistence.size "what" "cacheServer.persistence.size") -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: --shutdown-grace-ms rounded up, plus the extra. */}}
{{- define "lazykv.terminationGrace" -}}
{{- add (div (add (int64 .shutdownGraceMs) 999) 1000) (int64 .terminationGracePeriodExtraSeconds) -}}
{{- end -}}

{{/* Secret names; each fails with what to set when nothing names one. */}}
{{- define "lazykv.devSecretName" -}}{{ include "lazykv.fullname" .root }}-dev-{{ .what }}{{- end -}}

{{- define "lazykv.tlsSecret" -}}
{{- $tls := .root.Values.security.tls -}}
{{- $own := ternary $tls.cacheServerSecretName $tls.workerSecretName (eq .component "cache") -}}
{{- if $own -}}{{- $own -}}
{{- else if $tls.secretName -}}{{- $tls.secretName -}}
{{- else if $tls.certManager.enabled -}}{{- include "lazykv.fullname" .root }}-{{ .component }}-tls
{{- else if .root.Values.security.devSecrets.create -}}{{- include "lazykv.devSecretName" (dict "root" .root "what" "tls") -}}
{{- else -}}
{{- fail "security.tls.enabled needs a certificate: set security.tls.secretName (a Secret with tls.crt, tls.key, ca.crt), or security.tls.certManager.enabled, or security.devSecrets.create (development only)" -}}
{{- end -}}
{{- end -}}

{{- define "lazykv.authSecret" -}}
{{- $auth := .Values.security.auth -}}
{{- if $auth.secretName -}}{{- $auth.secretName -}}
{{- else if .Values.security.devSecrets.create -}}{{- include "lazykv.devSecretName" (dict "root" . "what" "auth") -}}
{{- else -}}
{{- fail "security.auth.enabled needs security.auth.secretName (a Secret with the tokens file and the worker's token), or security.devSecrets.create (development only)" -}}
{{- end -}}
{{- end -}}

{{- define "lazykv.chunkMacSecret" -}}
{{- $mac := .Values.security.chunkMac -}}
{{- if $mac.secretName -}}{{- $mac.secretName -}}
{{- else if .Values.security.devSecrets.create -}}{{- include "lazykv.devSecretName" (dict "root" . "what" "chunk-mac") -}}
{{- else -}}
{{- fail "security.chunkMac.enabled needs security.chunkMac.secretName (a Secret with the fleet's chunk key), or security.devSecrets.create (development only)" -}}
{{- end -}}
{{- end -}}

{{/* The DNS names each component's certificate needs (cert-manager and dev certificates). */}}
{{- define "lazykv.cacheDnsNames" -}}
{{- $h := printf "%s.%s.svc" (include "lazykv.cacheHeadlessName" .) .Release.Namespace -}}
{{- toYaml (list (printf "*.%s.%s" $h .Values.clusterDomain) (printf "%s.%s" $h .Values.clusterDomain) (printf "*.%s" $h) $h) -}}
{{- end -}}

{{- define "lazykv.workerDnsNames" -}}
{{- $w := include "lazykv.workerName" . -}}
{{- $ns := .Release.Namespace -}}
{{- toYaml (list (printf "%s.%s.svc.%s" $w $ns .Values.clusterDomain) (printf "%s.%s.svc" $w $ns) (printf "%s.%s" $w $ns) $w) -}}
{{- end -}}

{{/*
gRPC probes need no token (the standard health service) but cannot speak TLS: with TLS on,
probe the port with tcpSocket. Pass (dict "port" "probe" "tls").
*/}}
{{- define "lazykv.probe" -}}
{{- if .tls -}}
tcpSocket:
  port: {{ .port }}
{{- else -}}
grpc:
  port: {{ .port }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{- define "lazykv.podAntiAffinity" -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "lazykv.selectorLabels" (dict "root" .root "component" .component) | fromYaml)) -}}
{{- if eq .mode "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list $term) | nindent 4 }}
{{- else if eq .mode "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        {{- toYaml $term | nindent 8 }}
{{- end -}}
{{- end -}}

{{/*
A pod's annotations as a YAML map: prometheus.io scrape annotations (when metrics and
metrics.podAnnotations are on), then .extra, then the user's .pod ones.
Pass (dict "root" "port" "extra" "pod").
*/}}
{{- define "lazykv.podAnnotations" -}}
{{- $a := dict -}}
{{- if and .root.Values.metrics.enabled .root.Values.metrics.podAnnotations -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" (toString .port) -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- $_ := set $a "prometheus.io/scheme" (ternary "https" "http" .root.Values.security.tls.enabled) -}}
{{- end -}}
{{- $a = merge (deepCopy (default dict .pod)) (default dict .extra) $a -}}
{{- if $a -}}{{- toYaml $a -}}{{- end -}}
{{- end -}}

{{/*
Optional flags: a YAML list of "--flag=value" for each key of .values that is set (not
null, not ""), or nothing. Pass (dict "values" MAP "flags" (list "--flag" "key" ...)).
Numbers come from YAML as floats: they are printed as integers.
*/}}
{{- define "lazykv.optionalFlags" -}}
{{- $values := .values -}}
{{- $out := list -}}
{{- range $i, $flag := .flags -}}
{{- if eq (mod $i 2) 0 -}}
{{- $v := get $values (index $.flags (add1 $i)) -}}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}
{{- if kindIs "float64" $v -}}{{- $v = int64 $v -}}{{- end -}}
{{- $out = append $out (printf "%s=%v" $flag $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $out -}}{{- toYaml $out -}}{{- end -}}
{{- end -}}
