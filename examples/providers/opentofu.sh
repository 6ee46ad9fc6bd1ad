#!/bin/sh
# An ironclaim external provider that runs an OpenTofu workflow per server
# (docs/providers.md). Each server is a workspace of one root module, whose
# variable `power` ("on" or "off") the workflow applies and whose output
# `power_state` ("On" or "Off") says what it reads. The module does the
# real work: a Redfish or IPMI provider, a PDU outlet, a cloud-like API of
# the lab.
#
# The state must live in a backend that locks (pg, s3 with
# use_lockfile = true, http with lock_address, consul): two applies of one
# workspace never run at once, even from two controllers or a person at a
# terminal. ironclaim runs one action per server at a time by itself; the
# lock covers everyone else. `-lock-timeout` waits for a lock held by
# someone else rather than failing at once.
#
# The providers file:
#
#   providers:
#   - name: tofu
#     command: [/etc/ironclaim/providers/opentofu.sh]
#     timeout: 15m           # an apply that powers a machine can take long
#     concurrency: 2
#     readConcurrency: 4
#
# A Server: spec.provider.external: {name: tofu, parameters: {outlet: pdu-3/12}}
# Its parameters reach the module as variables (-var outlet=pdu-3/12).
set -u

action="${1:-}"
server="${IRONCLAIM_SERVER:?}"
module="${TOFU_MODULE_DIR:-/etc/ironclaim/tofu}"
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
export TF_IN_AUTOMATION=1 TF_INPUT=0

fail() {
    message="$(printf '%s' "$2" | tr -d '"\\' | tr '\n\t' '  ' | cut -c1-300)"
    printf '{"error": {"reason": "%s", "message": "%s"}}\n' "$1" "$message"
    exit 1
}

tofu_in() {
    tofu -chdir="$module" "$@" 2>"$errors" || {
        said="$(cat "$errors")"
        case "$said" in
            *"state lock"*) fail PowerActionFailed "the state of workspace $server stayed locked: $said" ;;
            *"No valid credential"* | *"403"* | *"401"*) fail BmcAuthenticationFailed "$said" ;;
            *) fail PowerActionFailed "tofu $1 for $server: $said" ;;
        esac
    }
}

# Every IRONCLAIM_PARAMETER_X=v as -var x=v.
vars() {
    env | sed -n 's/^IRONCLAIM_PARAMETER_\([A-Z0-9_]*\)=\(.*\)$/\1 \2/p' | while IFS=' ' read -r key value; do
        printf -- '-var\n%s=%s\n' "$(printf '%s' "$key" | tr 'A-Z' 'a-z')" "$value"
    done
}

tofu_in workspace select -or-create "$server" >/dev/null

apply() {
    # shellcheck disable=SC2046
    IFS='
'
    tofu_in apply -auto-approve -lock-timeout=120s -var "power=$1" $(vars) >/dev/null
    unset IFS
}

case "$action" in
    status)
        IFS='
'
        # shellcheck disable=SC2046
        tofu_in apply -refresh-only -auto-approve -lock-timeout=120s $(vars) >/dev/null
        unset IFS
        state="$(tofu_in output -raw power_state)"
        case "$state" in On | Off) ;; *) state=Unknown ;; esac
        printf '{"powerState": "%s"}\n' "$state"
        ;;
    power-on) apply on; printf '{}\n' ;;
    power-off) apply off; printf '{}\n' ;;
    *) fail PowerActionFailed "unknown action '$action'" ;;
esac
