{{- define "switchyard.name" -}}{{ .Release.Name }}{{- end -}}

{{- define "switchyard.labels" -}}
app.kubernetes.io/name: switchyard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* On every Ray pod template: what the NetworkPolicies, the serve Service and the
PodMonitor select (KubeRay's own ray.io/cluster label changes with every new RayCluster). */}}
{{- define "switchyard.rayPodLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ray
{{- end -}}

{{- define "switchyard.stateUrl" -}}
{{- if .Values.redis.enabled -}}
redis://{{ include "switchyard.name" . }}-redis:6379/0
{{- else -}}
{{ required "redis.url is required when redis.enabled is false" .Values.redis.url }}
{{- end -}}
{{- end -}}

{{- define "switchyard.env" -}}
- name: SWITCHYARD_STATE_URL
  value: {{ include "switchyard.stateUrl" . | quote }}
- name: RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH
  value: "app.api.proxy_guard:middlewares"
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
- name: SWITCHYARD_ADMIN_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.secretName }}, key: admin-token}
- name: SWITCHYARD_JWT_JWKS
  valueFrom:
    secretKeyRef: {name: {{ .Values.secretName }}, key: jwks, optional: true}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ .Values.secretName }}, key: aws-access-key-id, optional: true}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.secretName }}, key: aws-secret-access-key, optional: true}
{{- with .Values.objectStore.endpointUrl }}
- name: SWITCHYARD_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.objectStore.region }}
- name: SWITCHYARD_S3_REGION
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "switchyard.routesMount" -}}
{{- if .Values.routes }}
- name: routes
  mountPath: /etc/switchyard
  readOnly: true
{{- end }}
{{- end -}}

{{- define "switchyard.routesVolume" -}}
{{- if .Values.routes }}
- name: routes
  configMap:
    name: {{ include "switchyard.name" . }}-routes
{{- end }}
{{- end -}}

{{/* The arguments of app.builders:build_app (AppArgs). */}}
{{- define "switchyard.appArgs" -}}
{{- $args := dict "models" .Values.models "ingress_replicas" .Values.ingressReplicas "graceful_shutdown_timeout_s" .Values.gracefulShutdownTimeoutS -}}
{{- if .Values.defaultModel }}{{- $_ := set $args "default_model" .Values.defaultModel -}}{{- end -}}
{{- if .Values.gateway }}{{- $_ := set $args "gateway" .Values.gateway -}}{{- end -}}
{{- if .Values.limits }}{{- $_ := set $args "limits" .Values.limits -}}{{- end -}}
{{- if .Values.routes }}{{- $_ := set $args "routes_file" "/etc/switchyard/routes.yaml" -}}{{- end -}}
{{- toYaml $args -}}
{{- end -}}
