{{/* Names and labels. */}}
{{- define "delaybridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delaybridge.fullname" -}}
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

{{- define "delaybridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delaybridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delaybridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "delaybridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "delaybridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "delaybridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The store mode, checked. */}}
{{- define "delaybridge.store" -}}
{{- $t := .Values.store.type -}}
{{- if not (has $t (list "bbolt" "postgres")) -}}
{{- fail (printf "store.type must be bbolt or postgres, not %q" $t) -}}
{{- end -}}
{{- $t -}}
{{- end -}}

{{/* Replicas: 1 with bbolt (a bbolt file serves one process, and a second
bridge on one endpoint stops at start), 2 by default with postgres. */}}
{{- define "delaybridge.replicas" -}}
{{- $n := .Values.replicaCount -}}
{{- if eq (include "delaybridge.store" .) "bbolt" -}}
{{- if and (not (kindIs "invalid" $n)) (ne (int $n) 1) -}}
{{- fail (printf "replicaCount %v: store.type=bbolt runs exactly one replica; use store.type=postgres for several" $n) -}}
{{- end -}}
1
{{- else -}}
{{- if kindIs "invalid" $n }}2{{ else }}{{ int $n }}{{ end -}}
{{- end -}}
{{- end -}}

{{/* The Secret the chart creates when a URL is given in values. */}}
{{- define "delaybridge.secretName" -}}
{{- printf "%s-secrets" (include "delaybridge.fullname" .) -}}
{{- end -}}

{{- define "delaybridge.amqpSecret" -}}
{{- if .Values.amqp.existingSecret -}}
{{- .Values.amqp.existingSecret -}}
{{- else if .Values.amqp.url -}}
{{- include "delaybridge.secretName" . -}}
{{- else -}}
{{- fail "amqp.existingSecret is required: a Secret with the AMQP URL under amqp.existingSecretKey (or, to try the chart, amqp.url)" -}}
{{- end -}}
{{- end -}}

{{- define "delaybridge.postgresSecret" -}}
{{- if .Values.store.postgres.existingSecret -}}
{{- .Values.store.postgres.existingSecret -}}
{{- else if .Values.store.postgres.url -}}
{{- include "delaybridge.secretName" . -}}
{{- else -}}
{{- fail "store.postgres.existingSecret is required with store.type=postgres: a Secret with the DSN under store.postgres.existingSecretKey (or, to try the chart, store.postgres.url)" -}}
{{- end -}}
{{- end -}}

{{/* Whether the chart creates a Secret from URLs given in values. */}}
{{- define "delaybridge.createsSecret" -}}
{{- if or (and .Values.amqp.url (not .Values.amqp.existingSecret)) (and (eq (include "delaybridge.store" .) "postgres") .Values.store.postgres.url (not .Values.store.postgres.existingSecret)) -}}
true
{{- end -}}
{{- end -}}

{{/* The variables the chart sets itself; env must not set them. */}}
{{- define "delaybridge.managedEnv" -}}
{{- list "DELAYBRIDGE_STORE" "DELAYBRIDGE_STORE_PATH" "DELAYBRIDGE_POSTGRES_URL" "DELAYBRIDGE_POSTGRES_SCHEMA" "DELAYBRIDGE_AMQP_URL" "DELAYBRIDGE_AMQP_FAILOVER_URLS" "DELAYBRIDGE_HTTP_ADDR" "DELAYBRIDGE_ADMIN_TOKEN" "DELAYBRIDGE_ADMIN_TOKEN_FILE" | toJson -}}
{{- end -}}
