{{/* Chart name (for labels). */}}
{{- define "raypd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The RayService name, also the prefix of every object here. KubeRay derives the RayCluster name
(+6 characters) and "<name>-serve-svc" from it, so it must be a DNS-1035 label of at most 47
characters; fail rather than truncate, since a truncated name could collide.
*/}}
{{- define "raypd.fullname" -}}
{{- $name := .Values.fullnameOverride -}}
{{- if not $name -}}
{{- $base := default .Chart.Name .Values.nameOverride -}}
{{- $name = ternary .Release.Name (printf "%s-%s" .Release.Name $base) (contains $base .Release.Name) -}}
{{- end -}}
{{- if gt (len $name) 47 -}}
{{- fail (printf "RayService name %q has %d characters; KubeRay allows at most 47: use a shorter release name or set fullnameOverride" $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "RayService name %q must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "raypd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raypd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raypd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "raypd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "raypd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Name of the Secret holding the API key; empty when no key is configured. */}}
{{- define "raypd.apiKeySecretName" -}}
{{- if .Values.apiKey.existingSecret -}}
{{- .Values.apiKey.existingSecret -}}
{{- else if .Values.apiKey.value -}}
{{- printf "%s-api-key" (include "raypd.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Summed replicas of the enabled worker groups of one role: include ... (list $ "prefill"). */}}
{{- define "raypd.roleNodes" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $n := 0 -}}
{{- range $name, $g := $root.Values.workerGroups -}}
{{- if and $g.enabled (eq $g.role $role) -}}
{{- $n = add $n (int $g.replicas) -}}
{{- end -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* A role's node range for --autoscale, "MIN:MAX": its enabled groups' minReplicas and maxReplicas summed (one node per pod). */}}
{{- define "raypd.roleRange" -}}
{{- $root := index . 0 -}}
{{- $roles := index . 1 -}}
{{- $min := 0 -}}{{- $max := 0 -}}
{{- range $name, $g := $root.Values.workerGroups -}}
{{- if and $g.enabled (has $g.role $roles) -}}
{{- $r := int $g.replicas -}}
{{- $min = add $min (ternary $r (int $g.minReplicas) (kindIs "invalid" $g.minReplicas)) -}}
{{- $max = add $max (ternary $r (int $g.maxReplicas) (kindIs "invalid" $g.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- printf "%d:%d" $min $max -}}
{{- end -}}

{{/* The --autoscale value: a range per scaled role (flex: prefill and decode groups together with serve.adaptive). */}}
{{- define "raypd.autoscaleRanges" -}}
{{- if gt (include "raypd.roleNodes" (list . "mixed") | int) 0 -}}
{{- printf "mixed=%s" (include "raypd.roleRange" (list . (list "mixed"))) -}}
{{- else if .Values.serve.adaptive -}}
{{- printf "flex=%s" (include "raypd.roleRange" (list . (list "prefill" "decode"))) -}}
{{- else -}}
{{- printf "prefill=%s,decode=%s" (include "raypd.roleRange" (list . (list "prefill"))) (include "raypd.roleRange" (list . (list "decode"))) -}}
{{- end -}}
{{- end -}}

{{/* Guards that the values schema cannot express. Included once, from rayservice.yaml. */}}
{{- define "raypd.validate" -}}
{{- $p := include "raypd.roleNodes" (list . "prefill") | int -}}
{{- $d := include "raypd.roleNodes" (list . "decode") | int -}}
{{- $m := include "raypd.roleNodes" (list . "mixed") | int -}}
{{- if and (eq $m 0) (or (eq $p 0) (eq $d 0)) -}}
{{- fail (printf "raypd needs at least one prefill and one decode replica, or a mixed replica (enabled groups give prefill=%d decode=%d mixed=%d)" $p $d $m) -}}
{{- end -}}
{{- if or (and (gt $p 0) (eq $d 0)) (and (eq $p 0) (gt $d 0)) -}}
{{- fail (printf "prefill and decode replicas come together: prefill=%d decode=%d" $p $d) -}}
{{- end -}}
{{- if and (gt $m 0) (gt $p 0) -}}
{{- fail (printf "run either prefill + decode replicas or mixed replicas, not both (prefill=%d decode=%d mixed=%d)" $p $d $m) -}}
{{- end -}}
{{- range $name, $g := .Values.workerGroups -}}
{{- if $g.enabled -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "worker group name %q must be lowercase letters, digits and '-'" $name) -}}
{{- end -}}
{{- $r := int $g.replicas -}}
{{- $min := ternary $r (int $g.minReplicas) (kindIs "invalid" $g.minReplicas) -}}
{{- $max := ternary $r (int $g.maxReplicas) (kindIs "invalid" $g.maxReplicas) -}}
{{- if or (gt $min $r) (lt $max $r) -}}
{{- fail (printf "worker group %q: need minReplicas <= replicas <= maxReplicas, got %d <= %d <= %d" $name $min $r $max) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* KubeRay rejects these in rayStartParams once a group has top-level labels/resources. */ -}}
{{- $groups := dict "head" .Values.head -}}
{{- range $name, $g := .Values.workerGroups }}{{ if $g.enabled }}{{ $_ := set $groups $name $g }}{{ end }}{{ end -}}
{{- range $name, $g := $groups -}}
{{- range $key := list "labels" "resources" "num-cpus" "num-gpus" "memory" -}}
{{- if hasKey (default dict $g.rayStartParams) $key -}}
{{- fail (printf "%s: rayStartParams.%s is not allowed here; use rayLabels/rayResources and the pod resources" $name $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.apiKey.value .Values.apiKey.existingSecret -}}
{{- fail "set apiKey.value or apiKey.existingSecret, not both" -}}
{{- end -}}
{{- $vol := .Values.model.volume -}}
{{- if and (eq $vol.type "hostPath") (not $vol.hostPath.path) -}}
{{- fail "model.volume.type=hostPath needs model.volume.hostPath.path" -}}
{{- end -}}
{{- if and (eq $vol.type "existingClaim") (not $vol.existingClaim) -}}
{{- fail "model.volume.type=existingClaim needs model.volume.existingClaim (the PVC's name)" -}}
{{- end -}}
{{- if .Values.model.download.enabled -}}
{{- if eq $vol.type "none" -}}
{{- fail "model.download.enabled needs a model volume to fill: set model.volume.type (emptyDir, persistentVolumeClaim, existingClaim or hostPath)" -}}
{{- end -}}
{{- if not .Values.model.download.command -}}
{{- fail "model.download.enabled needs model.download.command" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.model.path (ne $vol.type "none") (not (hasPrefix $vol.mountPath .Values.model.path)) -}}
{{- fail (printf "model.path %q is not under the model volume's mountPath %q" .Values.model.path $vol.mountPath) -}}
{{- end -}}
{{- with .Values.serve.autoscale -}}{{- if and .enabled (or (kindIs "invalid" .ttft) (kindIs "invalid" .tpot)) -}}
{{- fail "serve.autoscale.enabled needs the SLO it scales for: serve.autoscale.ttft and serve.autoscale.tpot (seconds)" -}}
{{- end -}}{{- end -}}
{{- if ge (int .Values.ports.metrics) 10002 -}}
{{- fail (printf "ports.metrics=%d is inside Ray's worker port range (10002 and up); pick a lower port such as 8080" (int .Values.ports.metrics)) -}}
{{- end -}}
{{- end -}}

{{/*
The Serve config (ServeDeploySchema) as YAML, built as a dict so quoting is toYaml's job. The args
are raypd.cluster.serve_app:app_builder's (cluster/serve/config.py ServeConfig fields; unknown keys are an
error there). The API key is not an arg: the builder reads $RAYPD_API_KEY, set from the Secret.
The path before raypd had one root package, cluster.serve_app:app_builder, still works here: it is
rewritten to the installed one, since a top-level `cluster` module no longer exists.
*/}}
{{- define "raypd.serveConfig" -}}
{{- $args := dict
  "model" (.Values.model.path | default nil)
  "prefill_nodes" (include "raypd.roleNodes" (list . "prefill") | int)
  "decode_nodes" (include "raypd.roleNodes" (list . "decode") | int)
  "mixed_nodes" (include "raypd.roleNodes" (list . "mixed") | int)
  "gpus_per_node" (int .Values.gpusPerNode)
  "place_by_role" true
  "policy" .Values.serve.policy
-}}
{{- $_ := set $args "request_timeout_s" (float64 .Values.serve.requestTimeoutSeconds) -}}
{{- $transfer := dict "nixl_backend" .Values.nixl.backend -}}
{{- with .Values.nixl.devices -}}{{- $_ := set $transfer "nixl_devices" . -}}{{- end -}}
{{- $_ := set $args "transfer_options" $transfer -}}
{{- $engine := dict -}}
{{- with .Values.engine -}}
{{- if not (kindIs "invalid" .dtype) -}}{{- $_ := set $engine "dtype" .dtype -}}{{- end -}}
{{- if not (kindIs "invalid" .gpuMemoryUtilization) -}}{{- $_ := set $engine "gpu_memory_utilization" (float64 .gpuMemoryUtilization) -}}{{- end -}}
{{- if not (kindIs "invalid" .kvCacheMemoryMb) -}}{{- $_ := set $engine "kv_cache_memory_mb" (int .kvCacheMemoryMb) -}}{{- end -}}
{{- if not (kindIs "invalid" .quantization) -}}{{- $_ := set $engine "quantization" .quantization -}}{{- end -}}
{{- if not (kindIs "invalid" .schedulePolicy) -}}{{- $_ := set $engine "schedule_policy" .schedulePolicy -}}{{- end -}}
{{- end -}}
{{- if .Values.topology.config -}}
{{- $_ := set $args "topology" (printf "%s/topology.yaml" .Values.topology.mountPath) -}}
{{- end -}}
{{- with .Values.apiKeysFile -}}{{- if .existingSecret -}}
{{- $_ := set $args "api_keys_file" (printf "%s/%s" .mountPath .secretKey) -}}
{{- end -}}{{- end -}}
{{- if .Values.serve.adaptive -}}
{{- $_ := set $args "adaptive" true -}}
{{- $_ := set $args "local_prefill_budget" (int .Values.serve.localPrefillBudget) -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.serve.tpotTarget) -}}{{- $_ := set $args "tpot_target_s" (float64 .Values.serve.tpotTarget) -}}{{- end -}}
{{- with .Values.serve.admission -}}
{{- if not (kindIs "invalid" .ttftSlo) -}}{{- $_ := set $args "ttft_slo_s" (float64 .ttftSlo) -}}{{- end -}}
{{- if not (kindIs "invalid" .maxOngoingRequests) -}}{{- $_ := set $args "max_ongoing_requests" (int .maxOngoingRequests) -}}{{- end -}}
{{- if not (kindIs "invalid" .maxQueuedRequests) -}}{{- $_ := set $args "max_queued_requests" (int .maxQueuedRequests) -}}{{- end -}}
{{- if not (kindIs "invalid" .maxWaitingRequests) -}}{{- $_ := set $engine "max_waiting_requests" (int .maxWaitingRequests) -}}{{- end -}}
{{- end -}}
{{- with .Values.serve.autoscale -}}{{- if .enabled -}}
{{- $_ := set $args "autoscale" (include "raypd.autoscaleRanges" $) -}}
{{- $_ := set $args "autoscale_ttft_s" (float64 .ttft) -}}
{{- $_ := set $args "autoscale_tpot_s" (float64 .tpot) -}}
{{- $_ := set $args "autoscale_attainment" (float64 .attainment) -}}
{{- $_ := set $args "autoscale_window_s" (float64 .windowSeconds) -}}
{{- with .options -}}{{- $_ := set $args "autoscale_options" . -}}{{- end -}}
{{- end -}}{{- end -}}
{{- if $engine -}}{{- $_ := set $args "engine_options" $engine -}}{{- end -}}
{{- $args = merge $args (deepCopy .Values.serve.extraArgs) -}}
{{- $importPath := .Values.serve.importPath -}}
{{- if hasPrefix "cluster.serve_app:" $importPath -}}
{{- $importPath = printf "raypd.%s" $importPath -}}
{{- end -}}
{{- $app := dict "name" .Values.serve.appName "route_prefix" "/" "import_path" $importPath "args" $args -}}
{{- if .Values.serve.runtimeEnv -}}
{{- $_ := set $app "runtime_env" .Values.serve.runtimeEnv -}}
{{- end -}}
{{- $http := dict "host" "0.0.0.0" "port" (int .Values.ports.serve) -}}
{{- toYaml (dict "proxy_location" "EveryNode" "http_options" $http "applications" (list $app)) -}}
{{- end -}}

{{/* Environment shared by every Ray container: the API key and data plane secret (if any), the user's env. */}}
{{- define "raypd.env" -}}
{{- $root := index . 0 -}}
{{- $extra := index . 1 -}}
{{- $secret := include "raypd.apiKeySecretName" $root -}}
{{- if $secret }}
- name: RAYPD_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $root.Values.apiKey.secretKey }}
{{- end }}
{{- with $root.Values.dataPlaneSecret.existingSecret }}
- name: RAYPD_DATA_PLANE_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.dataPlaneSecret.secretKey }}
{{- end }}
{{- with $extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "raypd.volumeMounts" -}}
{{- if ne .Values.model.volume.type "none" }}
- name: model
  mountPath: {{ .Values.model.volume.mountPath }}
  readOnly: {{ .Values.model.volume.readOnly }}
{{- end }}
{{- if .Values.topology.config }}
- name: topology
  mountPath: {{ .Values.topology.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.apiKeysFile.existingSecret }}
- name: api-keys
  mountPath: {{ .Values.apiKeysFile.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.shm.sizeLimit }}
- name: dshm
  mountPath: /dev/shm
{{- end }}
{{- end -}}

{{- define "raypd.volumes" -}}
{{- $vol := .Values.model.volume -}}
{{- if eq $vol.type "hostPath" }}
- name: model
  hostPath:
    path: {{ $vol.hostPath.path }}
    {{- with $vol.hostPath.type }}
    type: {{ . }}
    {{- end }}
{{- else if eq $vol.type "persistentVolumeClaim" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ include "raypd.fullname" . }}-model
    readOnly: {{ and $vol.readOnly (not .Values.model.download.enabled) }}
{{- else if eq $vol.type "existingClaim" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ $vol.existingClaim }}
    readOnly: {{ and $vol.readOnly (not .Values.model.download.enabled) }}
{{- else if eq $vol.type "emptyDir" }}
- name: model
  emptyDir: {}
{{- end }}
{{- if .Values.topology.config }}
- name: topology
  configMap:
    name: {{ include "raypd.fullname" . }}-topology
{{- end }}
{{- with .Values.apiKeysFile.existingSecret }}
- name: api-keys
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.apiKeysFile.secretKey }}
        path: {{ $.Values.apiKeysFile.secretKey }}
{{- end }}
{{- with .Values.shm.sizeLimit }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "raypd.initContainers" -}}
{{- $dl := .Values.model.download -}}
{{- if $dl.enabled }}
- name: model-download
  image: {{ $dl.image }}
  command: {{ toJson $dl.command }}
  {{- with $dl.env }}
  env: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $dl.envFrom }}
  envFrom: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $dl.resources }}
  resources: {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.volume.mountPath }}
{{- end }}
{{- end -}}

{{- define "raypd.httpProbe" -}}
{{- $p := index . 0 -}}
httpGet:
  path: {{ $p.path }}
  port: serve
initialDelaySeconds: {{ $p.initialDelaySeconds }}
periodSeconds: {{ $p.periodSeconds }}
timeoutSeconds: {{ $p.timeoutSeconds }}
failureThreshold: {{ $p.failureThreshold }}
{{- end -}}
