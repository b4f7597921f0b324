#!/usr/bin/env bash
# Branches on a runtime's name outside provisioner/runtime/ (the lab included: it asks each
# runtime for its node recipe): a comparison, a table keyed by names, a name as a default or
# passed where a runtime goes. No output: none. Usage: scripts/runtime_name_grep.sh [DIR]
# (DIR: the package folder, default provisioner). tests/unit/test_layering.py runs this
# and the same check on the code's syntax.
dir=${1:-provisioner}
names=${RUNTIME_NAMES:-docker|host|podman}  # provisioner.runtime.registry.names(), joined by |
q="[\"']"
grep -rnE --include='*.py' \
  -e "runtime[A-Za-z_.]*[)]?\s*(==|!=|not in|in)\s*[(\[{]?[^#]*$q($names)$q" \
  -e "$q($names)$q\s*(==|!=)\s*[A-Za-z_.]*runtime" \
  -e "runtime[A-Za-z_]*\s*(:\s*str)?\s*=\s*$q($names)$q" \
  -e "runtime$q,\s*$q($names)$q" \
  -e ",\s*$q($names)$q\)" \
  -e "$q($names)$q:\s*$q[a-z]*\.log" \
  -e "host_mode|RUNTIME_LOG" \
  "$dir" | grep -v "^$dir/runtime/\|DEFAULT_RUNTIME = "
exit 0
