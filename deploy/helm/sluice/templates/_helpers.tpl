{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Kubernetes kills what still runs after the grace period: it covers the preStop wait and the drain. */}}
{{- define "sluice.gracePeriod" -}}
{{- $s := .Values.shutdown -}}
{{- $need := add (ternary 0 $s.preStopSleepSeconds .Values.sidecar.native) $s.drainTimeoutSeconds 5 -}}
{{- if $s.terminationGracePeriodSeconds -}}
{{- if lt (int $s.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must cover the preStop wait and the drain: at least %d" (int $s.terminationGracePeriodSeconds) (int $need)) -}}
{{- end -}}
{{- $s.terminationGracePeriodSeconds -}}
{{- else -}}
{{- $need -}}
{{- end -}}
{{- end -}}

{{- define "sluice.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef: {name: {{ .secret.name | quote }}, key: {{ .secret.key | quote }}}
{{- end -}}

{{/* The Sluice container: the same in both sidecar forms, but for restartPolicy and the preStop wait. */}}
{{- define "sluice.container" -}}
{{- $v := .Values -}}
{{- $broker := eq $v.mode "broker" -}}
- name: sluice
  image: {{ printf "%s:%s" $v.image.repository (default .Chart.AppVersion $v.image.tag) | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $v.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args: ["run", "--config", "/etc/sluice/config/sluice.toml"]
  env:
    {{- if $broker }}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    {{- end }}
    - name: SLUICE_UPSTREAM__BOOTSTRAP_SERVERS
      value: {{ join "," $v.upstream.bootstrapServers | quote }}
    - name: SLUICE_LISTEN__HOST
      value: {{ ternary "0.0.0.0" "127.0.0.1" $broker | quote }}
    - name: SLUICE_LISTEN__ADVERTISED_HOST
      value: {{ ternary (printf "$(POD_NAME).%s-headless.$(POD_NAMESPACE).svc" (include "sluice.fullname" .)) "localhost" $broker | quote }}
    - name: SLUICE_LISTEN__BOOTSTRAP_PORT
      value: {{ $v.listen.port | quote }}
    - name: SLUICE_LISTEN__BROKER_PORT_BASE
      value: {{ $v.listen.brokerPortBase | quote }}
    {{- /* the kubelet probes and Prometheus reach the admin port on the pod's address */}}
    - name: SLUICE_ADMIN__HOST
      value: "0.0.0.0"
    - name: SLUICE_ADMIN__PORT
      value: {{ $v.admin.port | quote }}
    - name: SLUICE_SHUTDOWN__DRAIN_TIMEOUT_S
      value: {{ $v.shutdown.drainTimeoutSeconds | quote }}
    - name: SLUICE_LOGGING__LEVEL
      value: {{ $v.logging.level | quote }}
    - name: SLUICE_LOGGING__ACCESS_LOG
      value: {{ $v.logging.accessLog | quote }}
    - name: SLUICE_LOGGING__FORMAT
      value: {{ $v.logging.format | quote }}
    {{- if $v.admin.tokenSecret.name }}
    {{- include "sluice.secretEnv" (dict "name" "SLUICE_ADMIN__TOKEN" "secret" $v.admin.tokenSecret) | nindent 4 }}
    {{- end }}
    {{- with $v.upstream.sasl }}
    {{- if .mechanism }}
    - name: SLUICE_UPSTREAM__SASL__MECHANISM
      value: {{ .mechanism | quote }}
    - name: SLUICE_UPSTREAM__SASL__USERNAME
      value: {{ .username | quote }}
    {{- include "sluice.secretEnv" (dict "name" "SLUICE_UPSTREAM__SASL__PASSWORD" "secret" .passwordSecret) | nindent 4 }}
    {{- end }}
    {{- end }}
    {{- if $v.upstream.tls.enabled }}
    - name: SLUICE_UPSTREAM__TLS__ENABLED
      value: "true"
    - name: SLUICE_UPSTREAM__TLS__CA_FILE
      value: /etc/sluice/upstream-tls/ca.crt
    {{- if $v.upstream.tls.clientCertificate }}
    - name: SLUICE_UPSTREAM__TLS__CERT_FILE
      value: /etc/sluice/upstream-tls/tls.crt
    - name: SLUICE_UPSTREAM__TLS__KEY_FILE
      value: /etc/sluice/upstream-tls/tls.key
    {{- end }}
    {{- end }}
    {{- if $v.listen.tls.enabled }}
    - name: SLUICE_LISTEN__TLS__ENABLED
      value: "true"
    - name: SLUICE_LISTEN__TLS__CERT_FILE
      value: /etc/sluice/listen-tls/tls.crt
    - name: SLUICE_LISTEN__TLS__KEY_FILE
      value: /etc/sluice/listen-tls/tls.key
    - name: SLUICE_LISTEN__TLS__CLIENT_AUTH
      value: {{ $v.listen.tls.clientAuth | quote }}
    {{- if ne $v.listen.tls.clientAuth "none" }}
    - name: SLUICE_LISTEN__TLS__CA_FILE
      value: /etc/sluice/listen-tls/ca.crt
    {{- end }}
    {{- end }}
    {{- with $v.fleet }}
    {{- if .enabled }}
    - name: SLUICE_FLEET__ENABLED
      value: "true"
    - name: SLUICE_FLEET__NAME
      value: {{ required "fleet.name is required when fleet.enabled" .name | quote }}
    - name: SLUICE_FLEET__CONTROL_TOPIC
      value: {{ .controlTopic | quote }}
    - name: SLUICE_FLEET__STATUS_TOPIC
      value: {{ .statusTopic | quote }}
    - name: SLUICE_FLEET__BOOTSTRAP_SERVERS
      value: {{ join "," .bootstrapServers | quote }}
    - name: SLUICE_FLEET__CREDENTIALS
      value: {{ .credentials | quote }}
    {{- /* each instance's id in the status topic: the pod's name (unique, and what `kubectl get pods` shows) */}}
    - name: SLUICE_FLEET__INSTANCE_ID
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    {{- end }}
    {{- end }}
  ports:
    - {name: kafka, containerPort: {{ $v.listen.port }}}
    - {name: admin, containerPort: {{ $v.admin.port }}}
  startupProbe:
    httpGet: {path: /healthz, port: admin}
    {{- toYaml $v.probes.startup | nindent 4 }}
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  {{- if not $v.sidecar.native }}
  lifecycle:
    preStop:
      sleep: {seconds: {{ $v.shutdown.preStopSleepSeconds }}}
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    {{- /* the directory, not a subPath: Kubernetes updates it in place when the ConfigMap changes (SIGHUP applies
    the run-time sections), and Podman's kube play mounts no subPath of a ConfigMap */}}
    - {name: sluice-config, mountPath: /etc/sluice/config, readOnly: true}
    {{- if $v.upstream.tls.enabled }}
    - {name: sluice-upstream-tls, mountPath: /etc/sluice/upstream-tls, readOnly: true}
    {{- end }}
    {{- if $v.listen.tls.enabled }}
    - {name: sluice-listen-tls, mountPath: /etc/sluice/listen-tls, readOnly: true}
    {{- end }}
{{- end -}}
