{{/*
The Kontinuum store: an etcd v3 API private to the hub, either the chart's own StatefulSet
(templates/store.yaml) or store.external.endpoints. Only etcd-proxy and registry use it;
these helpers give both the same endpoints and client TLS.
*/}}

{{/* Name of the store's StatefulSet and client Service (52 characters at most: the
StatefulSet's controller-revision-hash label adds 11). */}}
{{- define "kontinuum.store.name" -}}
{{- printf "%s-store" (include "kontinuum.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* The headless Service that gives each member its DNS name (peer URLs). */}}
{{- define "kontinuum.store.peers" -}}
{{- printf "%s-peers" (include "kontinuum.store.name" .) -}}
{{- end -}}

{{/* "true" when the store is not the chart's own. */}}
{{- define "kontinuum.store.isExternal" -}}
{{- if .Values.store.external.endpoints -}}true{{- end -}}
{{- end -}}

{{/* The store endpoints, comma separated, as --store takes them. */}}
{{- define "kontinuum.store.endpoints" -}}
{{- if .Values.store.external.endpoints -}}
{{- join "," .Values.store.external.endpoints -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "kontinuum.store.name" .) .Release.Namespace (int .Values.store.clientPort) -}}
{{- end -}}
{{- end -}}

{{/* Client TLS towards an external store: only with store.external.tls.secretName. */}}
{{- define "kontinuum.store.tlsSecret" -}}
{{- if .Values.store.external.endpoints -}}{{- .Values.store.external.tls.secretName -}}{{- end -}}
{{- end -}}

{{/* The store flags of etcd-proxy and registry (the same names in both binaries). */}}
{{- define "kontinuum.store.args" -}}
- --store={{ include "kontinuum.store.endpoints" . }}
{{- if include "kontinuum.store.tlsSecret" . }}
- --store-ca=/etc/kontinuum/store-tls/ca.crt
{{- if .Values.store.external.tls.clientCertificate }}
- --store-cert=/etc/kontinuum/store-tls/tls.crt
- --store-key=/etc/kontinuum/store-tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "kontinuum.store.volumes" -}}
{{- with include "kontinuum.store.tlsSecret" . }}
- name: store-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "kontinuum.store.volumeMounts" -}}
{{- if include "kontinuum.store.tlsSecret" . }}
- name: store-tls
  mountPath: /etc/kontinuum/store-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Labels of the store's objects, and the subset its Services and policy select by. */}}
{{- define "kontinuum.store.labels" -}}
{{ include "kontinuum.labels" . }}
app.kubernetes.io/component: store
{{- end -}}

{{- define "kontinuum.store.selectorLabels" -}}
{{ include "kontinuum.selectorLabels" . }}
app.kubernetes.io/component: store
{{- end -}}
