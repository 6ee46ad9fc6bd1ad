#!/bin/sh
# An ironclaim external provider that powers servers over IPMI with
# ipmitool (docs/providers.md). The providers file:
#
#   providers:
#   - name: ipmi
#     command: [/etc/ironclaim/providers/ipmitool.sh]
#     timeout: 60s
#     concurrency: 8
#
# A Server:
#
#   spec:
#     provider:
#       type: External
#       external: {name: ipmi, parameters: {address: 10.0.0.21}}
#
# The credentials come from the controller's environment, not the Server:
# IPMI_USERNAME, and IPMI_PASSWORD_FILE naming a file that holds the
# password (a mounted Secret). ipmitool reads the password from that file,
# so it never appears in a process list.
#
# The action is the last argument: power-on, power-off or status. The
# answer is one JSON object on stdout; a failure exits non-zero with
# {"error": {"reason": ..., "message": ...}}.
set -u

action="${1:-}"
address="${IRONCLAIM_PARAMETER_ADDRESS:-}"
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT

# fail REASON MESSAGE: the typed failure, its message kept to one line
# without quotes or backslashes.
fail() {
    message="$(printf '%s' "$2" | tr -d '"\\' | tr '\n\t' '  ' | cut -c1-300)"
    printf '{"error": {"reason": "%s", "message": "%s"}}\n' "$1" "$message"
    exit 1
}

[ -n "$address" ] || fail BmcConfigInvalid "spec.provider.external.parameters.address is missing"
[ -n "${IPMI_USERNAME:-}" ] || fail BmcCredentialsMissing "IPMI_USERNAME is not set in the controller's environment"
[ -r "${IPMI_PASSWORD_FILE:-}" ] || fail BmcCredentialsMissing "IPMI_PASSWORD_FILE does not name a readable file"

ipmi() {
    ipmitool -I lanplus -H "$address" -U "$IPMI_USERNAME" -f "$IPMI_PASSWORD_FILE" -N 5 -R 2 "$@" 2>"$errors"
}

# A failed ipmitool call, typed by what it wrote.
failed() {
    said="$(cat "$errors")"
    case "$said" in
        *"unauthorized name"* | *"HMAC is invalid"* | *"Invalid user name"* | *"password"*)
            fail BmcAuthenticationFailed "$address refused the credentials: $said" ;;
        *"Unable to establish"* | *"No response"* | *"timeout"* | *"Connection refused"*)
            fail BmcUnreachable "$address did not answer: $said" ;;
        *) fail PowerActionFailed "ipmitool $*: $said" ;;
    esac
}

case "$action" in
    status)
        out="$(ipmi chassis power status)" || failed chassis power status
        case "$out" in
            *"is on"*) state=On ;;
            *"is off"*) state=Off ;;
            *) state=Unknown ;;
        esac
        # DCMI power reading, where the BMC has it.
        watts="$(ipmi dcmi power reading | awk '/Instantaneous power reading/ {print $4; exit}')"
        uuid="$(ipmi mc guid | awk -F': *' '/System GUID/ {print $2; exit}')"
        printf '{"powerState": "%s"' "$state"
        case "$watts" in '' | *[!0-9.]*) ;; *) printf ', "watts": %s' "$watts" ;; esac
        [ -n "$uuid" ] && printf ', "identity": {"systemUUID": "%s"}' "$uuid"
        printf '}\n'
        ;;
    power-on)
        ipmi chassis power on >/dev/null || failed chassis power on
        # The BMC takes the command; the controller confirms with status.
        printf '{}\n'
        ;;
    power-off)
        # A hard power-off: ironclaim has drained the node already.
        ipmi chassis power off >/dev/null || failed chassis power off
        printf '{}\n'
        ;;
    *)
        fail PowerActionFailed "unknown action '$action'"
        ;;
esac
