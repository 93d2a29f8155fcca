{{/*
Expand the name of the chart.
*/}}
{{- define "idemproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
If release name contains chart name it will be used as a full name.
*/}}
{{- define "idemproxy.fullname" -}}
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

{{/*
Create chart name and version as used by the chart label.
*/}}
{{- define "idemproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels
*/}}
{{- define "idemproxy.labels" -}}
helm.sh/chart: {{ include "idemproxy.chart" . }}
{{ include "idemproxy.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels
*/}}
{{- define "idemproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Create the name of the service account to use
*/}}
{{- define "idemproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "idemproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository:tag, or repository@digest when image.digest is set.
*/}}
{{- define "idemproxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Seconds in a Go duration string ("90s", "1h30m", "1.5m", "250ms", "0"), printed as a number.
Call with (dict "name" "SHUTDOWN_TIMEOUT (config.shutdownTimeout)" "value" "30s").
Fails the render with a message naming the value when it is not a Go duration.
*/}}
{{- define "idemproxy.durationSeconds" -}}
{{- $d := toString .value }}
{{- if not (regexMatch "^(0|(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h))+)$" $d) }}
{{- fail (printf "%s=%q is not a Go duration (examples: 90s, 2m, 1h30m)" .name $d) }}
{{- end }}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h)" $d -1 }}
{{- $num := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" . }}
{{- $unit := trimPrefix $num . }}
{{- $total = addf $total (mulf (float64 $num) (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
The port of a Go listen address (":8080", "0.0.0.0:8080"). Call with (dict "name" ... "value" ...).
*/}}
{{- define "idemproxy.addrPort" -}}
{{- $port := regexFind "[0-9]+$" (toString .value) }}
{{- if or (not (regexMatch ":[0-9]+$" (toString .value))) (lt (atoi $port) 1) (gt (atoi $port) 65535) }}
{{- fail (printf "%s=%q must be a listen address with a port, e.g. \":8080\"" .name (toString .value)) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
"true" when the pod would run the embedded in-process Redis (miniredis): REDIS_MODE standalone
and no REDIS_URL from redis.existingSecret, redis.url or extraEnv. Empty otherwise.
*/}}
{{- define "idemproxy.embeddedRedis" -}}
{{- $fromExtraEnv := false }}
{{- range .Values.extraEnv }}
{{- if eq .name "REDIS_URL" }}{{ $fromExtraEnv = true }}{{ end }}
{{- end }}
{{- if and (eq .Values.config.redisMode "standalone") (not .Values.redis.existingSecret) (not .Values.redis.url) (not $fromExtraEnv) -}}
true
{{- end }}
{{- end }}

{{/*
Name of the Secret holding the Redis credentials.
*/}}
{{- define "idemproxy.redisSecretName" -}}
{{- default (printf "%s-redis" (include "idemproxy.fullname" .)) .Values.redis.existingSecret }}
{{- end }}

{{/*
"true" when the chart creates the Redis Secret itself (inline credentials, no existingSecret).
*/}}
{{- define "idemproxy.createRedisSecret" -}}
{{- if and (not .Values.redis.existingSecret) (or .Values.redis.url .Values.redis.username .Values.redis.password .Values.redis.sentinelUsername .Values.redis.sentinelPassword) -}}
true
{{- end }}
{{- end }}

{{/*
Number of replicas the Deployment runs at least: autoscaling.minReplicas with autoscaling on,
replicaCount otherwise.
*/}}
{{- define "idemproxy.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.minReplicas | int }}
{{- else }}
{{- .Values.replicaCount | int }}
{{- end }}
{{- end }}

{{/*
The ROUTES string built from config.routes: rules joined by ";", each
"METHOD PATTERN [ttl=D] [lock=D] [required] [off] [upgrade] [fail=open|closed] [wait=D] [on5xx=release|store]
[key=SOURCE] [scope=H1,H2] [unknown=expire|hold] [observe|enforce] [fingerprint=strict|json|none]
[verify=VAR,...] [record4xx=all|except-401-403]". A scope given as an empty list renders
"scope=" (no scope on this route); a rule without scope renders nothing (SCOPE_HEADERS applies).
A rule's verify names the keys of a Secret; the secrets reach the pod as the variables
idemproxy.verifyEnv names (never through the ConfigMap), and the rule renders verify= with them.
*/}}
{{- define "idemproxy.routes" -}}
{{- $rules := list }}
{{- $seen := dict }}
{{- range $i, $r := .Values.config.routes }}
{{- $where := printf "config.routes[%d]" $i }}
{{- if not $r.method }}{{ fail (printf "%s: method is required" $where) }}{{ end }}
{{- if not $r.pattern }}{{ fail (printf "%s: pattern is required" $where) }}{{ end }}
{{- $method := upper $r.method }}
{{- if not (has $method (list "GET" "HEAD" "POST" "PUT" "PATCH" "DELETE" "OPTIONS" "TRACE" "CONNECT")) }}
{{- fail (printf "%s: method %q must be an HTTP method such as POST" $where $r.method) }}
{{- end }}
{{- if not (regexMatch "^/[^\\s;]*$" $r.pattern) }}
{{- fail (printf "%s: pattern %q must start with / and hold no whitespace or ;" $where $r.pattern) }}
{{- end }}
{{- $id := printf "%s %s" $method $r.pattern }}
{{- if hasKey $seen $id }}
{{- fail (printf "%s: a rule for %q is already defined" $where $id) }}
{{- end }}
{{- $_ := set $seen $id true }}
{{- $parts := list $method $r.pattern }}
{{- /* YAML 1.1 (which Helm's parser follows) reads a bare `off:` key as false: accept both spellings. */}}
{{- $off := or (index $r "off") (index $r "false") }}
{{- if or $off $r.upgrade }}
{{- range $opt := list "ttl" "lock" "required" "fail" "wait" "on5xx" "key" "scope" "fingerprint" "unknown" "observe" "verify" "record4xx" }}
{{- /* hasKey for scope and observe: an empty list (scope=) and false (enforce) are options too. */}}
{{- if or (index $r $opt) (and (has $opt (list "scope" "observe")) (hasKey $r $opt)) }}
{{- fail (printf "%s (%s): off means plain pass-through (and upgrade implies off), so %s would be ignored; remove it" $where $id $opt) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $opt := list "ttl" "lock" "wait" }}
{{- if index $r $opt }}
{{- $secs := include "idemproxy.durationSeconds" (dict "name" (printf "%s.%s" $where $opt) "value" (index $r $opt)) | float64 }}
{{- if and (ne $opt "wait") (le $secs 0.0) }}
{{- fail (printf "%s (%s): %s=%s must be above zero" $where $id $opt (index $r $opt)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $r.ttl }}{{ $parts = append $parts (printf "ttl=%s" $r.ttl) }}{{ end }}
{{- if $r.lock }}{{ $parts = append $parts (printf "lock=%s" $r.lock) }}{{ end }}
{{- if $r.required }}{{ $parts = append $parts "required" }}{{ end }}
{{- if $off }}{{ $parts = append $parts "off" }}{{ end }}
{{- if $r.upgrade }}{{ $parts = append $parts "upgrade" }}{{ end }}
{{- if $r.fail }}
{{- if not (has $r.fail (list "open" "closed")) }}{{ fail (printf "%s: fail must be open or closed, not %q" $where $r.fail) }}{{ end }}
{{- $parts = append $parts (printf "fail=%s" $r.fail) }}
{{- end }}
{{- if $r.wait }}{{ $parts = append $parts (printf "wait=%s" $r.wait) }}{{ end }}
{{- if $r.on5xx }}
{{- if not (has $r.on5xx (list "release" "store")) }}{{ fail (printf "%s: on5xx must be release or store, not %q" $where $r.on5xx) }}{{ end }}
{{- $parts = append $parts (printf "on5xx=%s" $r.on5xx) }}
{{- end }}
{{- if hasKey $r "key" }}
{{- $source := toString $r.key }}
{{- $presets := list "github" "standard-webhooks" "stripe-events" "shopify" "sns" "cloudevents" }}
{{- if not (has $source $presets) }}
{{- if not (regexMatch "^[^\\s;]+$" $source) }}
{{- fail (printf "%s (%s): key %q must be a SOURCE without whitespace or ; (ROUTES separates options with spaces and rules with ;)" $where $id $source) }}
{{- end }}
{{- range $alt := splitList "|" $source }}
{{- range $part := splitList "+" $alt }}
{{- if not (regexMatch "^(header:[!#$%&'*.^_`~0-9A-Za-z-]+|query:.+|json:/.*)$" $part) }}
{{- fail (printf "%s (%s): key %q: part %q must be header:NAME, query:NAME or json:/POINTER (or the whole key one preset: %s)" $where $id $source $part (join ", " $presets)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $parts = append $parts (printf "key=%s" $source) }}
{{- end }}
{{- if hasKey $r "scope" }}
{{- if not (kindIs "slice" $r.scope) }}
{{- fail (printf "%s (%s): scope must be a list of header names ([] for no scope)" $where $id) }}
{{- end }}
{{- $parts = append $parts (printf "scope=%s" (join "," $r.scope)) }}
{{- end }}
{{- if $r.unknown }}
{{- if not (has $r.unknown (list "expire" "hold")) }}{{ fail (printf "%s: unknown must be expire or hold, not %q" $where $r.unknown) }}{{ end }}
{{- $parts = append $parts (printf "unknown=%s" $r.unknown) }}
{{- end }}
{{- if hasKey $r "observe" }}
{{- if not (kindIs "bool" $r.observe) }}{{ fail (printf "%s: observe must be true (observe) or false (enforce), not %v" $where $r.observe) }}{{ end }}
{{- $parts = append $parts (ternary "observe" "enforce" $r.observe) }}
{{- end }}
{{- if $r.fingerprint }}
{{- if not (has $r.fingerprint (list "strict" "json" "none")) }}{{ fail (printf "%s: fingerprint must be strict, json or none, not %q" $where $r.fingerprint) }}{{ end }}
{{- $parts = append $parts (printf "fingerprint=%s" $r.fingerprint) }}
{{- end }}
{{- with $r.verify }}
{{- if not (has (toString $r.key) (list "github" "stripe-events" "standard-webhooks" "shopify")) }}
{{- fail (printf "%s (%s): verify checks the signature of github, stripe-events, standard-webhooks or shopify deliveries; set key to one of them" $where $id) }}
{{- end }}
{{- if not .secretName }}{{ fail (printf "%s (%s): verify.secretName is required: the Secret that holds the sender's signing secret" $where $id) }}{{ end }}
{{- if not .keys }}{{ fail (printf "%s (%s): verify.keys lists the Secret's keys that hold the signing secrets (two while rotating)" $where $id) }}{{ end }}
{{- $vars := list }}
{{- range $j, $_ := .keys }}{{ $vars = append $vars (include "idemproxy.verifyVar" (list $i $j)) }}{{ end }}
{{- $parts = append $parts (printf "verify=%s" (join "," $vars)) }}
{{- end }}
{{- if $r.record4xx }}
{{- if not (has $r.record4xx (list "all" "except-401-403")) }}{{ fail (printf "%s: record4xx must be all or except-401-403, not %q" $where $r.record4xx) }}{{ end }}
{{- $parts = append $parts (printf "record4xx=%s" $r.record4xx) }}
{{- end }}
{{- $rules = append $rules (join " " $parts) }}
{{- end }}
{{- join ";" $rules }}
{{- end }}

{{/*
The variable that carries the signing secret j of config.routes[i] (verify), from its Secret.
*/}}
{{- define "idemproxy.verifyVar" -}}
{{- printf "IDEMPROXY_VERIFY_%d_%d" (index . 0) (index . 1) -}}
{{- end }}

{{/*
The container's env entries of every route's verify: secretKeyRef, never the ConfigMap.
*/}}
{{- define "idemproxy.verifyEnv" -}}
{{- range $i, $r := .Values.config.routes }}
{{- with $r.verify }}
{{- $secret := .secretName }}
{{- range $j, $key := .keys }}
- name: {{ include "idemproxy.verifyVar" (list $i $j) }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: false
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Render-time checks. Each fails with a message that names the value to change.
*/}}
{{- define "idemproxy.validate" -}}
{{- $c := .Values.config }}
{{- if not $c.upstreamURL }}
{{- fail "config.upstreamURL (UPSTREAM_URL) is required: the base URL of the API to protect, e.g. http://legacy-api:8080" }}
{{- end }}
{{- if not (regexMatch "^https?://[^\\s/]+" $c.upstreamURL) }}
{{- fail (printf "config.upstreamURL (UPSTREAM_URL)=%q must be an http:// or https:// URL" $c.upstreamURL) }}
{{- end }}
{{- if not $c.adminAddr }}
{{- fail "config.adminAddr (ADMIN_ADDR) must not be empty in Kubernetes: the probes (/healthz, /readyz) and /metrics are served on the admin listener" }}
{{- end }}
{{- $_ := include "idemproxy.addrPort" (dict "name" "config.listenAddr (LISTEN_ADDR)" "value" $c.listenAddr) }}
{{- $_ = include "idemproxy.addrPort" (dict "name" "config.adminAddr (ADMIN_ADDR)" "value" $c.adminAddr) }}
{{- /* A loopback listener is unreachable from the Service and the kubelet: with listenAddr every request is refused while /readyz says ready; with adminAddr the probes fail and the pod restarts forever. */}}
{{- range $name, $addr := dict "config.listenAddr (LISTEN_ADDR)" $c.listenAddr "config.adminAddr (ADMIN_ADDR)" $c.adminAddr }}
{{- if regexMatch "^(localhost|127\\.[0-9.]+|\\[::1\\]|\\[::ffff:127\\.[0-9.]+\\]):[0-9]+$" (lower (toString $addr)) }}
{{- fail (printf "%s=%q listens on loopback only: in a pod neither the Service nor the kubelet's probes reach it. Give the port alone (e.g. \":8080\") to listen on every interface" $name (toString $addr)) }}
{{- end }}
{{- end }}
{{- if eq (include "idemproxy.addrPort" (dict "name" "" "value" $c.listenAddr)) (include "idemproxy.addrPort" (dict "name" "" "value" $c.adminAddr)) }}
{{- fail "config.listenAddr and config.adminAddr must use different ports" }}
{{- end }}
{{- if include "idemproxy.embeddedRedis" . }}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "embedded Redis with %s: no Redis is configured (REDIS_MODE=standalone and neither redis.existingSecret nor redis.url is set), so every replica would start its own in-memory Redis and the same Idempotency-Key could execute once per replica: no guarantee at all. Set redis.existingSecret (or redis.url), or config.redisMode sentinel/cluster with config.redisAddrs; or run a single replica without autoscaling." (ternary "autoscaling.enabled=true" (printf "replicaCount=%d" (int .Values.replicaCount)) .Values.autoscaling.enabled)) }}
{{- end }}
{{- end }}
{{- if and .Values.tracing.enabled (not .Values.tracing.endpoint) }}
{{- fail "tracing.endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) is required with tracing.enabled=true: the OTLP collector's URL, e.g. http://otel-collector.observability:4318" }}
{{- end }}
{{- if and (ne $c.redisMode "standalone") (not $c.redisAddrs) }}
{{- fail (printf "config.redisAddrs (REDIS_ADDRS) is required with config.redisMode=%s: list the %s as host:port" $c.redisMode (ternary "sentinels" "cluster seed nodes" (eq $c.redisMode "sentinel"))) }}
{{- end }}
{{- if and (ne $c.redisMode "standalone") .Values.redis.url }}
{{- fail (printf "redis.url is only read with config.redisMode=standalone (it is %s): put the credentials in redis.username/redis.password or in redis.existingSecret" $c.redisMode) }}
{{- end }}
{{- if and (eq $c.redisMode "standalone") (not .Values.redis.existingSecret) (or .Values.redis.username .Values.redis.password) }}
{{- fail "redis.username and redis.password are for sentinel/cluster mode; in standalone mode put the credentials in redis.url (redis://user:password@host:6379/0)" }}
{{- end }}
{{- if and (ne $c.redisMode "sentinel") (or .Values.redis.sentinelUsername .Values.redis.sentinelPassword) }}
{{- fail (printf "redis.sentinelUsername and redis.sentinelPassword (REDIS_SENTINEL_USERNAME, REDIS_SENTINEL_PASSWORD) authenticate to the sentinels and are only used with config.redisMode=sentinel (it is %s)" $c.redisMode) }}
{{- end }}
{{- if and .Values.redis.sentinelUsername (not .Values.redis.sentinelPassword) }}
{{- fail "redis.sentinelUsername (REDIS_SENTINEL_USERNAME) needs redis.sentinelPassword (REDIS_SENTINEL_PASSWORD)" }}
{{- end }}
{{- if and .Values.redis.url (not (regexMatch "^rediss?://" .Values.redis.url)) }}
{{- fail "redis.url must start with redis:// or rediss://" }}
{{- end }}
{{- if and (eq $c.redisMode "standalone") (or $c.redisAddrs $c.redisTLS) }}
{{- fail "config.redisAddrs and config.redisTLS are for config.redisMode sentinel/cluster; in standalone mode give a rediss:// URL in redis.url or redis.existingSecret" }}
{{- end }}
{{- range $k := list "ttl" "lockTTL" "upstreamTimeout" "waitTimeout" "shutdownTimeout" "redisWaitTimeout" "requestReadTimeout" }}
{{- $secs := include "idemproxy.durationSeconds" (dict "name" (printf "config.%s" $k) "value" (index $c $k)) | float64 }}
{{- if and (ne $k "waitTimeout") (le $secs 0.0) }}
{{- fail (printf "config.%s=%s must be above zero" $k (index $c $k)) }}
{{- end }}
{{- end }}
{{- $upstream := include "idemproxy.durationSeconds" (dict "name" "config.upstreamTimeout (UPSTREAM_TIMEOUT)" "value" $c.upstreamTimeout) | float64 }}
{{- $lock := include "idemproxy.durationSeconds" (dict "name" "config.lockTTL (LOCK_TTL)" "value" $c.lockTTL) | float64 }}
{{- if ge $upstream $lock }}
{{- fail (printf "config.upstreamTimeout (UPSTREAM_TIMEOUT=%s) must be below config.lockTTL (LOCK_TTL=%s): a claim must outlive the upstream call it guards" $c.upstreamTimeout $c.lockTTL) }}
{{- end }}
{{- /* With WAIT the claim's answer comes back only after REDIS_WAIT_TIMEOUT at most, and the lock runs from the claim (as the proxy checks at start). */}}
{{- $wait := 0.0 }}
{{- if gt (int $c.redisWaitReplicas) 0 }}
{{- $wait = include "idemproxy.durationSeconds" (dict "name" "config.redisWaitTimeout (REDIS_WAIT_TIMEOUT)" "value" $c.redisWaitTimeout) | float64 }}
{{- end }}
{{- if ge (addf $wait $upstream) $lock }}
{{- fail (printf "config.redisWaitTimeout (REDIS_WAIT_TIMEOUT=%s) + config.upstreamTimeout (UPSTREAM_TIMEOUT=%s) must be below config.lockTTL (LOCK_TTL=%s) with config.redisWaitReplicas: WAIT holds the claim's answer before the request is forwarded, and a lock that ends first lets a retry execute the key again (the proxy refuses to start with it)" $c.redisWaitTimeout $c.upstreamTimeout $c.lockTTL) }}
{{- end }}
{{- $one := add (int64 $c.maxBodyBytes) 16384 (int64 $c.maxStoredResponseBytes) }}
{{- if and (not (kindIs "invalid" $c.maxBufferedBytes)) (lt (int64 $c.maxBufferedBytes) $one) }}
{{- fail (printf "config.maxBufferedBytes (MAX_BUFFERED_BYTES=%d) must hold one keyed request's body and answer, at least config.maxBodyBytes (MAX_BODY_BYTES=%d) + config.maxStoredResponseBytes (MAX_STORED_RESPONSE_BYTES=%d) + 16384 = %d (the proxy refuses to start with less)" (int64 $c.maxBufferedBytes) (int64 $c.maxBodyBytes) (int64 $c.maxStoredResponseBytes) $one) }}
{{- end }}
{{- $shutdown := include "idemproxy.durationSeconds" (dict "name" "config.shutdownTimeout (SHUTDOWN_TIMEOUT)" "value" $c.shutdownTimeout) | float64 }}
{{- $read := include "idemproxy.durationSeconds" (dict "name" "config.requestReadTimeout (REQUEST_READ_TIMEOUT)" "value" $c.requestReadTimeout) | float64 }}
{{- if lt $shutdown (addf $read $upstream $wait 16.0) }}
{{- fail (printf "config.shutdownTimeout (SHUTDOWN_TIMEOUT=%s) must be at least config.requestReadTimeout (REQUEST_READ_TIMEOUT=%s) + config.upstreamTimeout (UPSTREAM_TIMEOUT=%s) + 16s, and + config.redisWaitTimeout (REDIS_WAIT_TIMEOUT=%s) with config.redisWaitReplicas: on SIGTERM a request may still arrive for 6s on a connection accepted just before, may then still be receiving its body, wait for its claim's WAIT and UPSTREAM_TIMEOUT for its answer, and up to 10s to record it; a shorter shutdown leaves its claim in flight and the retry executes again after LOCK_TTL (the proxy refuses to start with it)" $c.shutdownTimeout $c.requestReadTimeout $c.upstreamTimeout $c.redisWaitTimeout) }}
{{- end }}
{{- range $i, $r := $c.routes }}
{{- if $r.lock }}
{{- $rl := include "idemproxy.durationSeconds" (dict "name" (printf "config.routes[%d].lock" $i) "value" $r.lock) | float64 }}
{{- if ge $upstream $rl }}
{{- fail (printf "config.routes[%d] (%s %s): lock=%s must be above config.upstreamTimeout (UPSTREAM_TIMEOUT=%s)" $i (upper $r.method) $r.pattern $r.lock $c.upstreamTimeout) }}
{{- end }}
{{- if ge (addf $wait $upstream) $rl }}
{{- fail (printf "config.routes[%d] (%s %s): lock=%s must be above config.redisWaitTimeout (REDIS_WAIT_TIMEOUT=%s) + config.upstreamTimeout (UPSTREAM_TIMEOUT=%s) with config.redisWaitReplicas" $i (upper $r.method) $r.pattern $r.lock $c.redisWaitTimeout $c.upstreamTimeout) }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ = include "idemproxy.routes" . }}
{{- $_ = include "idemproxy.terminationGracePeriodSeconds" . }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the value given, which must be above SHUTDOWN_TIMEOUT plus a
preStop sleep, or ceil(SHUTDOWN_TIMEOUT) + the preStop sleep + terminationGraceExtraSeconds.
*/}}
{{- define "idemproxy.terminationGracePeriodSeconds" -}}
{{- $shutdown := include "idemproxy.durationSeconds" (dict "name" "config.shutdownTimeout (SHUTDOWN_TIMEOUT)" "value" .Values.config.shutdownTimeout) | float64 }}
{{- /* Kubernetes counts a preStop hook inside the grace period: SIGTERM comes after it. A sleep hook's seconds are known; an exec or httpGet hook's are not (terminationGraceExtraSeconds must cover it). */}}
{{- $preStop := 0 }}
{{- with .Values.lifecycle }}{{ with .preStop }}{{ with .sleep }}{{ $preStop = int .seconds }}{{ end }}{{ end }}{{ end }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (ceil $shutdown | int) $preStop (int .Values.terminationGraceExtraSeconds) }}
{{- else }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if le (float64 $grace) (addf $shutdown $preStop) }}
{{- fail (printf "terminationGracePeriodSeconds=%d must be above config.shutdownTimeout (SHUTDOWN_TIMEOUT=%s) + the preStop sleep (%ds): Kubernetes counts the preStop hook inside the grace period and would SIGKILL the proxy before in-flight requests are recorded. Raise it, or leave it null to derive it" $grace .Values.config.shutdownTimeout $preStop) }}
{{- end }}
{{- $grace }}
{{- end }}
{{- end }}

{{/*
idemproxy.env: one ConfigMap entry, indented for data:, as NAME: "value";
nothing when the value is null. Lists are joined with commas, whole numbers
written without an exponent (YAML numbers reach templates as float64).
*/}}
{{- define "idemproxy.env" -}}
{{- $v := .value -}}
{{- if not (kindIs "invalid" $v) -}}
{{- if kindIs "slice" $v -}}
{{- $v = join "," $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) -}}
{{- if eq (float64 $v) (floor (float64 $v)) -}}
{{- $v = int64 $v | toString -}}
{{- else -}}
{{- $v = toString $v -}}
{{- end -}}
{{- else -}}
{{- $v = toString $v -}}
{{- end }}
  {{ .name }}: {{ $v | quote }}
{{- end -}}
{{- end -}}
