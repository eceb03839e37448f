#!/usr/bin/env bash
# Runs a command so that DDS discovery never leaves this machine:
#  * ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST unless the caller set it;
#  * inside a fresh network namespace with only loopback up, when we may create one
#    (root, or unprivileged user namespaces). AV_INFER_NETNS=0 turns the namespace off
#    (e.g. to watch the demo with `ros2 topic echo` from a second terminal).
set -euo pipefail
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
if [ "${AV_INFER_NETNS:-1}" != "0" ] && [ -z "${AV_INFER_IN_NETNS:-}" ]; then
  if unshare -n true 2>/dev/null; then
    export AV_INFER_IN_NETNS=1
    exec unshare -n bash -c 'ip link set lo up && exec "$@"' netns "$@"
  elif unshare -rn true 2>/dev/null; then
    export AV_INFER_IN_NETNS=1
    exec unshare -rn bash -c 'ip link set lo up 2>/dev/null; exec "$@"' netns "$@"
  else
    echo "netns_run: cannot create a network namespace; using LOCALHOST discovery only" >&2
  fi
fi
exec "$@"
