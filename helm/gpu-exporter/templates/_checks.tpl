{{/*
What the daemon refuses at start, refused at render time instead: otherwise the chart renders,
installs, and the exporter on every node exits 2 and restarts for ever. Each message names the
values to change. What the schema can say it says (values.schema.json); these need several
values at once, or a check the schema's messages would not explain.
*/}}

{{/*
The configuration file the chart writes (`config`, camelCase values already turned into the
daemon's snake_case settings, config.extra merged), checked as the daemon checks it at start:

- dcgm.mode standalone or embedded without libdcgm.so.4 in the image: the daemon exits ("dcgm.mode
  is embedded, but libdcgm.so.4 is not installed", gpu_exporter/collect/dcgm.py `configured`).
  Only image.dcgm can say that the image has it; auto is allowed, it turns DCGM off without it.
- an Alertmanager with basic auth and a bearer token, or a client certificate without its key
  (AlertmanagerConfig.check in gpu_exporter/alerting/settings.py).
- an Alertmanager credential or TLS file outside every volume the pod mounts: the daemon refuses
  a missing password or token file at start (AlertmanagerConfig.check) and so does building the
  Alertmanager client with missing TLS files (alerting/notify/alertmanager.py `_ssl_context`).
  Mounted: alerting.secretMounts (at <secretsDir>/<name>/) and extraVolumeMounts.
*/}}
{{- define "gpu-exporter.checkConfig" -}}
{{- $c := .config }}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $extra := $v.config.extra }}

{{- $mode := dig "dcgm" "mode" "off" $c }}
{{- if and (has $mode (list "standalone" "embedded")) (not $v.image.dcgm) }}
{{- $key := ternary "config.extra.dcgm.mode" "dcgm.mode" (hasKey (dig "dcgm" (dict) $extra) "mode") }}
{{- $instead := ternary "off" "auto (DCGM then stays off without the library)" (eq $mode "embedded") }}
{{- fail (printf "%s=%s needs DCGM's libdcgm.so.4 in the image, and image.dcgm=false says %s has none (the default image carries no DCGM; the exporter on every node would exit at start): build an image with the Dockerfile's DCGM_DEB argument (docs/kubernetes.md \"An image with DCGM\"), point image.repository/image.tag at it and set image.dcgm=true; or set %s=%s" $key $mode (include "gpu-exporter.image" $root) $key $instead) }}
{{- end }}

{{- $fromExtra := hasKey (dig "alerting" (dict) $extra) "alertmanagers" }}
{{- $list := ternary "config.extra.alerting.alertmanagers" "alerting.alertmanagers" $fromExtra }}
{{- /* How the user spelled each setting: the chart's camelCase values, or the daemon's names. */}}
{{- $names := dict "basic_auth" "basicAuth" "bearer_token_file" "bearerTokenFile" "password_file" "basicAuth.passwordFile" "ca_file" "tls.caFile" "cert_file" "tls.certFile" "key_file" "tls.keyFile" }}
{{- if $fromExtra }}
{{- $names = dict "basic_auth" "basic_auth" "bearer_token_file" "bearer_token_file" "password_file" "basic_auth.password_file" "ca_file" "tls.ca_file" "cert_file" "tls.cert_file" "key_file" "tls.key_file" }}
{{- end }}
{{- $secretsDir := include "gpu-exporter.secretsDir" $root }}
{{- $mounted := list }}
{{- range $v.alerting.secretMounts }}{{ $mounted = append $mounted (printf "%s/%s" $secretsDir .name) }}{{ end }}
{{- range $v.extraVolumeMounts }}{{ $mounted = append $mounted (trimSuffix "/" .mountPath) }}{{ end }}

{{- range $i, $am := dig "alerting" "alertmanagers" (list) $c }}
{{- $at := printf "%s[%d] (%s)" $list $i (toString $am.url) }}
{{- $bearer := ternary "bearer_token" (get $names "bearer_token_file") (not (empty $am.bearer_token)) }}
{{- if and $am.basic_auth (or $am.bearer_token $am.bearer_token_file) }}
{{- fail (printf "%s sets both %s and %s: one request carries one Authorization header, and the daemon refuses both at start; remove one, keeping the kind this Alertmanager (or the proxy in front of it) checks" $at (get $names "basic_auth") $bearer) }}
{{- end }}
{{- $tls := default (dict) $am.tls }}
{{- if ne (empty $tls.cert_file) (empty $tls.key_file) }}
{{- fail (printf "%s: set %s and %s together (a client certificate and its key), or neither" $at (get $names "cert_file") (get $names "key_file")) }}
{{- end }}
{{- $files := dict "bearer_token_file" $am.bearer_token_file "password_file" (dig "password_file" "" (default (dict) $am.basic_auth)) "ca_file" $tls.ca_file "cert_file" $tls.cert_file "key_file" $tls.key_file }}
{{- range $setting := list "password_file" "bearer_token_file" "ca_file" "cert_file" "key_file" }}
{{- $path := toString (default "" (get $files $setting)) }}
{{- if hasPrefix "/" $path }}
{{- $inside := false }}
{{- range $mounted }}
{{- if or (eq $path .) (hasPrefix (printf "%s/" .) $path) }}{{ $inside = true }}{{ end }}
{{- end }}
{{- if not $inside }}
{{- $how := "mount it with extraVolumes and extraVolumeMounts, or keep it in a Secret listed in alerting.secretMounts (mounted at " }}
{{- $how = printf "%s%s/<name>/)" $how $secretsDir }}
{{- if hasPrefix (printf "%s/" $secretsDir) $path }}
{{- $name := first (splitList "/" (trimPrefix (printf "%s/" $secretsDir) $path)) }}
{{- $how = printf "add {name: %s, secretName: <the Secret holding %s>} to alerting.secretMounts" $name (base $path) }}
{{- end }}
{{- fail (printf "%s: %s %s is in no volume the pod mounts, and the daemon refuses a missing file at start: %s" $at (get $names $setting) $path $how) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Every resources.requests and resources.limits value is a Kubernetes quantity (a number with an
optional suffix): "256MB" is refused by the API server, and is an easy slip for 256M or 256Mi.
The grammar is k8s.io/apimachinery pkg/api/resource/quantity.go's (the pattern controller-gen
writes for resource.Quantity), without the sign: a resource amount is never negative. Numbers
are checked by the schema (minimum 0).
*/}}
{{- define "gpu-exporter.checkResources" -}}
{{- $quantity := `^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+))?$` }}
{{- range $kind := list "requests" "limits" }}
{{- range $resource, $amount := get (default (dict) $.Values.resources) $kind | default (dict) }}
{{- if and (kindIs "string" $amount) (not (regexMatch $quantity $amount)) }}
{{- fail (printf "resources.%s.%s: %q is not a Kubernetes quantity: write a number with one of the suffixes Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), m for thousandths, e.g. 256Mi or 500m" $kind $resource $amount) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
