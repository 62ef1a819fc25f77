{{/* Names, labels and the pieces shared by several templates. */}}

{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-exporter.fullname" -}}
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

{{- define "gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Recommended labels (app.kubernetes.io/*) on every resource; `component` is per resource. */}}
{{- define "gpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpu-exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpu-exporter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Mount points inside the container. */}}
{{- define "gpu-exporter.configDir" -}}/etc/gpu-exporter/config{{- end }}
{{- define "gpu-exporter.rulesDir" -}}/etc/gpu-exporter/rules{{- end }}
{{- define "gpu-exporter.secretsDir" -}}/etc/gpu-exporter/secrets{{- end }}
{{- define "gpu-exporter.webDir" -}}/etc/gpu-exporter/web{{- end }}
{{- define "gpu-exporter.podResourcesDir" -}}/var/lib/kubelet/pod-resources{{- end }}
{{- define "gpu-exporter.runtimeSocket" -}}/host/cri.sock{{- end }}

{{/*
The DRA ClusterRole and its binding are cluster-wide: the release's namespace is in their name,
so that two releases of one name in two namespaces do not take each other's.
*/}}
{{- define "gpu-exporter.draRbacName" -}}
{{- printf "%s-%s-dra" (include "gpu-exporter.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}
{{- /* The in-cluster clients' standard place (the daemon's kubernetes.dra defaults). */}}
{{- define "gpu-exporter.apiTokenDir" -}}/var/run/secrets/kubernetes.io/serviceaccount{{- end }}

{{/*
Per-process attribution: "on" when it is on, "" when off. It maps GPU processes to the containers the kubelet says hold the GPU: without pod
attribution there are no holders to share the GPU among, so the render fails.
*/}}
{{- define "gpu-exporter.processAttribution" -}}
{{- $p := .Values.processAttribution }}
{{- if $p.enabled }}
{{- if not .Values.podAttribution.enabled }}
{{- fail "processAttribution.enabled needs podAttribution.enabled: per-pod GPU use is shared among the pods the kubelet says hold each GPU" }}
{{- end }}
{{- "on" }}
{{- end }}
{{- end }}

{{/*
DRA attribution: "on" when it is on, "" when off. The kubelet's PodResources API says which
container holds which DRA device, so without pod attribution there is nothing to attribute and
the render fails. The ClusterRole is bound to the chart's ServiceAccount: with
serviceAccount.create=false it must be named, or the namespace's "default" ServiceAccount, which
every pod there runs as unless told otherwise, would get it.
*/}}
{{- define "gpu-exporter.dra" -}}
{{- if .Values.podAttribution.dra.enabled }}
{{- if not .Values.podAttribution.enabled }}
{{- fail "podAttribution.dra.enabled needs podAttribution.enabled: the kubelet's PodResources API says which container holds each DRA device" }}
{{- end }}
{{- if not (or .Values.serviceAccount.create .Values.serviceAccount.name) }}
{{- fail "podAttribution.dra.enabled with serviceAccount.create=false needs serviceAccount.name: the ResourceSlice reader would be bound to the namespace's default ServiceAccount" }}
{{- end }}
{{- "on" }}
{{- end }}
{{- end }}

{{/*
Security contexts: the defaults, with the user's values merged over them. Pod attribution needs
UID 0 because the kubelet creates its pod-resources directory 0750 and the socket 0755, both
root:root; without it the pod runs as the image's UID 65532 and meets Pod Security "restricted".
DCGM embedded runs a host engine inside the exporter, which needs root and CAP_SYS_ADMIN ("In
both modes the DCGM library should be run as root", DCGM documentation): UID 0 and SYS_ADMIN
added (every other capability still dropped). allowPrivilegeEscalation stays false: the API
server refuses that only with the capability spelled CAP_SYS_ADMIN, and no_new_privs takes
nothing from a root process that already holds the capability.
*/}}
{{- define "gpu-exporter.podSecurityContext" -}}
{{- $root := or .Values.podAttribution.enabled (eq (include "gpu-exporter.dcgmMode" .) "embedded") }}
{{- $uid := ternary 0 65532 $root }}
{{- $defaults := dict "runAsUser" $uid "runAsGroup" $uid "runAsNonRoot" (not $root) "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- toYaml (mergeOverwrite $defaults (deepCopy .Values.podSecurityContext)) }}
{{- end }}

{{- define "gpu-exporter.securityContext" -}}
{{- $capabilities := dict "drop" (list "ALL") }}
{{- if eq (include "gpu-exporter.dcgmMode" .) "embedded" }}
{{- $_ := set $capabilities "add" (list "SYS_ADMIN") }}
{{- end }}
{{- $defaults := dict "allowPrivilegeEscalation" false "privileged" false "readOnlyRootFilesystem" true "capabilities" $capabilities }}
{{- toYaml (mergeOverwrite $defaults (deepCopy .Values.securityContext)) }}
{{- end }}

{{/*
The DCGM mode the daemon runs with: dcgm.mode, or config.extra.dcgm.mode, which wins, as it
does in the configuration file.
*/}}
{{- define "gpu-exporter.dcgmMode" -}}
{{- dig "dcgm" "mode" "off" (include "gpu-exporter.config" . | fromYaml) }}
{{- end }}

{{/*
Seconds in a Prometheus duration (`1h30m`, `15s`, `250ms`), as the daemon's rule loader reads a
group's interval (gpu_exporter/alerting/rules/loader.py parse_duration).
*/}}
{{- define "gpu-exporter.durationSeconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|[smhdwy])" (toString .) -1 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $total = addf $total (mulf (trimSuffix $unit . | float64) (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Where the shipped alerts' runbook_url points, for the daemon and Prometheus alike:
rules.runbookBaseUrl, or the runbook every exporter serves at /runbook, through the Service.
*/}}
{{- define "gpu-exporter.runbookBaseUrl" -}}
{{- if .Values.rules.runbookBaseUrl }}
{{- trimSuffix "/" .Values.rules.runbookBaseUrl }}
{{- else }}
{{- printf "%s://%s.%s.svc:%d/runbook" (ternary "https" "http" (eq (include "gpu-exporter.https" .) "true")) (include "gpu-exporter.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}
{{- end }}

{{/*
The rule files of the shipped pack (files/rules/*.yaml, copies of the repository's rules/) after
rules.disabledGroups, rules.disabledAlerts, rules.alertOverrides and rules.runbookBaseUrl, plus
rules.extraGroups as extra.rules.yaml: YAML `{<file name>: {groups: [...]}}`, files left without
groups omitted. Unknown group or alert names in those settings fail the render.
*/}}
{{- define "gpu-exporter.ruleFiles" -}}
{{- $r := .Values.rules }}
{{- $files := dict }}
{{- if $r.shippedPack }}
{{- $pack := dict }}
{{- range $path, $_ := .Files.Glob "files/rules/*.yaml" }}
{{- $_ := set $pack (base $path) ($.Files.Get $path | fromYaml) }}
{{- end }}
{{- if not $pack }}
{{- fail "files/rules/ holds no rule files: run scripts/gen-prometheusrule.sh" }}
{{- end }}
{{- $groupNames := list }}
{{- $alertNames := list }}
{{- range $file, $content := $pack }}
{{- range $content.groups }}
{{- $groupNames = append $groupNames .name }}
{{- range .rules }}
{{- if .alert }}{{ $alertNames = append $alertNames .alert }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $r.disabledGroups }}
{{- if not (has . $groupNames) }}
{{- fail (printf "rules.disabledGroups: no group %q in the shipped pack (groups: %s)" . (join ", " $groupNames)) }}
{{- end }}
{{- end }}
{{- range $r.disabledAlerts }}
{{- if not (has . $alertNames) }}
{{- fail (printf "rules.disabledAlerts: no alert %q in the shipped pack" .) }}
{{- end }}
{{- end }}
{{- range $name, $_ := $r.alertOverrides }}
{{- if not (has $name $alertNames) }}
{{- fail (printf "rules.alertOverrides: no alert %q in the shipped pack" $name) }}
{{- end }}
{{- end }}
{{- range $file, $content := $pack }}
{{- $groups := list }}
{{- range $group := $content.groups }}
{{- if not (has $group.name $r.disabledGroups) }}
{{- $rules := list }}
{{- range $rule := $group.rules }}
{{- if not (and $rule.alert (has $rule.alert $r.disabledAlerts)) }}
{{- $rule = deepCopy $rule }}
{{- $override := get $r.alertOverrides (default "" $rule.alert) }}
{{- if $override }}
{{- range $key := list "expr" "for" "keep_firing_for" }}
{{- if hasKey $override $key }}{{ $_ := set $rule $key (get $override $key) }}{{ end }}
{{- end }}
{{- range $key := list "labels" "annotations" }}
{{- if hasKey $override $key }}
{{- $_ := set $rule $key (mergeOverwrite (default (dict) (get $rule $key)) (get $override $key)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $rule.annotations }}
{{- $url := default "" $rule.annotations.runbook_url }}
{{- if hasPrefix "docs/runbook.md" $url }}
{{- $_ := set $rule.annotations "runbook_url" (printf "%s%s" (include "gpu-exporter.runbookBaseUrl" $) (trimPrefix "docs/runbook.md" $url)) }}
{{- end }}
{{- end }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- end }}
{{- if $rules }}
{{- $groups = append $groups (set (deepCopy (omit $group "rules")) "rules" $rules) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $groups }}
{{- $_ := set $files $file (dict "groups" $groups) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $r.extraGroups }}
{{- $_ := set $files "extra.rules.yaml" (dict "groups" $r.extraGroups) }}
{{- end }}
{{- toYaml $files }}
{{- end }}

{{/*
The daemon's configuration file. Numbers go through float64/int: `helm --set` gives `0.5` as a
string (values.schema.json admits numeric strings for that), the daemon's file must say 0.5.
config.nvml, config.metrics and config.extra are passed as given (the daemon reads numeric strings as numbers).
`dcgm:` is written only when dcgm.mode is not "off", its address only when set: with the
defaults the file is what it was before the chart knew DCGM. `kubernetes.processes` likewise
only with processAttribution on: its proc_root and runtime_socket are where the DaemonSet mounts
them; `kubernetes.dra` only with podAttribution.dra on: token_file and ca_file are where the
DaemonSet projects them (node_name is left "": the daemon takes $NODE_NAME, from the downward
API; api_server stays auto, the in-cluster address).
*/}}
{{- define "gpu-exporter.config" -}}
{{- $v := .Values }}
{{- $config := dict "listen_address" (printf "0.0.0.0:%d" (int $v.config.port)) "interval_seconds" (float64 $v.config.intervalSeconds) "log_level" $v.config.logLevel }}
{{- with $v.config.nvml }}{{ $_ := set $config "nvml" (deepCopy .) }}{{ end }}
{{- with $v.config.metrics }}{{ $_ := set $config "metrics" (deepCopy .) }}{{ end }}
{{- $k8s := dict "enabled" $v.podAttribution.enabled }}
{{- if $v.podAttribution.enabled }}
{{- $_ := set $k8s "socket_path" (printf "%s/kubelet.sock" (include "gpu-exporter.podResourcesDir" .)) }}
{{- $_ := set $k8s "refresh_seconds" (float64 $v.podAttribution.refreshSeconds) }}
{{- $_ := set $k8s "timeout_seconds" (float64 $v.podAttribution.timeoutSeconds) }}
{{- $_ := set $k8s "resource_names" $v.podAttribution.resourceNames }}
{{- $_ := set $k8s "resource_prefixes" $v.podAttribution.resourcePrefixes }}
{{- $_ := set $k8s "mode" $v.podAttribution.mode }}
{{- end }}
{{- with include "gpu-exporter.processAttribution" . }}
{{- $_ := set $k8s "processes" (dict "enabled" true "proc_root" "/proc" "runtime_socket" (include "gpu-exporter.runtimeSocket" $) "refresh_seconds" (float64 $v.processAttribution.refreshSeconds) "timeout_seconds" (float64 $v.processAttribution.timeoutSeconds)) }}
{{- end }}
{{- with include "gpu-exporter.dra" . }}
{{- $tokens := include "gpu-exporter.apiTokenDir" $ }}
{{- $_ := set $k8s "dra" (dict "enabled" true "token_file" (printf "%s/token" $tokens) "ca_file" (printf "%s/ca.crt" $tokens) "drivers" $v.podAttribution.dra.drivers "timeout_seconds" (float64 $v.podAttribution.dra.timeoutSeconds)) }}
{{- end }}
{{- $_ := set $config "kubernetes" $k8s }}
{{- $rules := dict "enabled" $v.rules.enabled }}
{{- if $v.rules.enabled }}
{{- $_ := set $rules "files" (list (printf "%s/*.yaml" (include "gpu-exporter.rulesDir" .))) }}
{{- if not (kindIs "invalid" $v.rules.evaluationIntervalSeconds) }}
{{- $_ := set $rules "evaluation_interval_seconds" (float64 $v.rules.evaluationIntervalSeconds) }}
{{- end }}
{{- $_ := set $rules "semantics" $v.rules.semantics }}
{{- end }}
{{- $_ := set $config "rules" $rules }}
{{- $ams := list }}
{{- range $v.alerting.alertmanagers }}
{{- $am := dict "url" .url }}
{{- if hasKey . "timeoutSeconds" }}{{ $_ := set $am "timeout_seconds" (float64 .timeoutSeconds) }}{{ end }}
{{- with .bearerTokenFile }}{{ $_ := set $am "bearer_token_file" . }}{{ end }}
{{- with .basicAuth }}
{{- $_ := set $am "basic_auth" (dict "username" .username "password_file" .passwordFile) }}
{{- end }}
{{- with .tls }}
{{- $tls := dict }}
{{- with .caFile }}{{ $_ := set $tls "ca_file" . }}{{ end }}
{{- with .certFile }}{{ $_ := set $tls "cert_file" . }}{{ end }}
{{- with .keyFile }}{{ $_ := set $tls "key_file" . }}{{ end }}
{{- if hasKey . "insecureSkipVerify" }}{{ $_ := set $tls "insecure_skip_verify" .insecureSkipVerify }}{{ end }}
{{- $_ := set $am "tls" $tls }}
{{- end }}
{{- $ams = append $ams $am }}
{{- end }}
{{- $alerting := dict "alertmanagers" $ams "external_labels" $v.alerting.externalLabels "resend_delay_seconds" (float64 $v.alerting.resendDelaySeconds) "queue_capacity" (int $v.alerting.queueCapacity) }}
{{- with $v.alerting.externalUrl }}{{ $_ := set $alerting "external_url" . }}{{ end }}
{{- $_ := set $config "alerting" $alerting }}
{{- if $v.webConfig.enabled }}
{{- $_ := set $config "web_config_file" (printf "%s/config/web-config.yml" (include "gpu-exporter.webDir" .)) }}
{{- $_ := set $config "web" (dict "probes_without_auth" $v.webConfig.probesWithoutAuth) }}
{{- end }}
{{- if $v.dcgmCompat.enabled }}
{{- $compat := dict "enabled" true "hostname_label" $v.dcgmCompat.hostnameLabel }}
{{- if gt (int $v.dcgmCompat.port) 0 }}
{{- if has (int $v.dcgmCompat.port) (list (int $v.config.port) (int $v.service.port)) }}
{{- fail "dcgmCompat.port must differ from config.port and service.port" }}
{{- end }}
{{- $_ := set $compat "listen_address" (printf "0.0.0.0:%d" (int $v.dcgmCompat.port)) }}
{{- end }}
{{- $_ := set $config "dcgm_compat" $compat }}
{{- end }}
{{- if ne $v.dcgm.mode "off" }}
{{- $dcgm := dict "mode" $v.dcgm.mode }}
{{- with $v.dcgm.address }}{{ $_ := set $dcgm "address" . }}{{ end }}
{{- $_ := set $config "dcgm" $dcgm }}
{{- end }}
{{- $config = mergeOverwrite $config (deepCopy $v.config.extra) }}
{{- include "gpu-exporter.checkConfig" (dict "config" $config "root" .) }}
{{- toYaml $config }}
{{- end }}

{{/* "true" when the web config turns TLS on: probes, the ServiceMonitor and helm test use https. */}}
{{- define "gpu-exporter.https" -}}
{{- $w := .Values.webConfig }}
{{- if and $w.enabled (ternary $w.existingSecretTls (hasKey $w.inline "tls_server_config") (ne $w.existingSecret "")) }}true{{ end }}
{{- end }}

{{/* A probe from values, with scheme HTTPS when the web config turns TLS on. */}}
{{- define "gpu-exporter.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and (include "gpu-exporter.https" .root) (hasKey $probe "httpGet") }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}
