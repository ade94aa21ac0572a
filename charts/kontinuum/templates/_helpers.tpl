{{/*
The usual name and label helpers, and the per-operator resolution every template shares.
*/}}

{{- define "kontinuum.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's prefix of every object name. */}}
{{- define "kontinuum.fullname" -}}
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

{{- define "kontinuum.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; `component` is added per operator. */}}
{{- define "kontinuum.labels" -}}
helm.sh/chart: {{ include "kontinuum.chart" . }}
{{ include "kontinuum.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kontinuum
{{- end -}}

{{- define "kontinuum.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kontinuum.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ConfigMap of installation-wide KONTINUUM_* settings. */}}
{{- define "kontinuum.envConfigMap" -}}
{{- printf "%s-env" (include "kontinuum.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kontinuum.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
The enabled operators as a map from values key (camelCase) to its resolved values:
operatorDefaults with the operator's own keys replacing them key by key (a plain override
rather than a merge, so that `false` and `0` override too), plus
  binary: the binary's name (kebab-case of the key), e.g. pool-claimer
  name:   the name of its objects, <fullname>-<binary>
  traits: how it differs from the common shape (kontinuum.traits.<key>, see
          _operators.tpl), with leaderElection and events defaulting to true
Use: {{ $operators := include "kontinuum.operators" . | fromYaml }}
*/}}
{{- define "kontinuum.operators" -}}
{{- $fullname := include "kontinuum.fullname" . -}}
{{- $out := dict -}}
{{- range $key, $own := .Values.operators -}}
{{- $op := dict -}}
{{- range $k, $v := $.Values.operatorDefaults -}}
{{- $_ := set $op $k $v -}}
{{- end -}}
{{- range $k, $v := ($own | default dict) -}}
{{- $_ := set $op $k $v -}}
{{- end -}}
{{- if $op.enabled -}}
{{- $binary := kebabcase $key -}}
{{- $_ := set $op "binary" $binary -}}
{{- $_ := set $op "name" (printf "%s-%s" $fullname $binary | trunc 63 | trimSuffix "-") -}}
{{- $_ := set $op "leaseName" ($op.leaseName | default (printf "%s-%s" $fullname $binary | trunc 63 | trimSuffix "-")) -}}
{{- $traits := include (printf "kontinuum.traits.%s" $key) (dict "root" $ "op" $op) | fromYaml -}}
{{- if hasKey $traits "Error" -}}
{{- fail (printf "kontinuum.traits.%s is not valid YAML: %s" $key $traits.Error) -}}
{{- end -}}
{{- range $trait := list "leaderElection" "events" -}}
{{- if not (hasKey $traits $trait) -}}
{{- $_ := set $traits $trait true -}}
{{- end -}}
{{- end -}}
{{- $_ := set $op "traits" $traits -}}
{{- $_ := set $out $key $op -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Labels of one operator's objects: (list $ $op). */}}
{{- define "kontinuum.operatorLabels" -}}
{{- $root := index . 0 -}}{{- $op := index . 1 -}}
{{ include "kontinuum.labels" $root }}
app.kubernetes.io/component: {{ $op.binary }}
{{- end -}}

{{- define "kontinuum.operatorSelectorLabels" -}}
{{- $root := index . 0 -}}{{- $op := index . 1 -}}
{{ include "kontinuum.selectorLabels" $root }}
app.kubernetes.io/component: {{ $op.binary }}
{{- end -}}

{{/*
Env entries for an operator's own settings: (list $op "PREFIX_" (list "settingKey" ...)).
Each key becomes PREFIX_<KEY IN SCREAMING_SNAKE_CASE>; empty strings are left out (the
binary's default applies), and so are unset (null) ones. Numbers are printed as integers (values files parse them as
floats, which would print 1e+06).
*/}}
{{- define "kontinuum.settingsEnv" -}}
{{- $op := index . 0 -}}{{- $prefix := index . 1 -}}
{{- range $key := index . 2 -}}
{{- $v := index $op $key -}}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) }}
- name: {{ printf "%s%s" $prefix (snakecase $key | upper) }}
  value: {{ if or (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) }}{{ int64 $v | toString | quote }}{{ else }}{{ $v | toString | quote }}{{ end }}
{{- end -}}
{{- end -}}
{{- end -}}
