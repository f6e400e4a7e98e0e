# cella's bash driver for the code interpreter (run by cella-envd as `bash --noprofile --norc -c`).
#
# Same protocol as every driver, except that commands are one line of three base64 fields
# (setup, code, teardown; "-" when empty) because bash cannot parse JSON: setup and teardown set
# and restore the cell's environment variables. Each cell is sourced, so variables, functions and
# the working directory persist. A non-zero status of the cell is reported as an error. SIGINT
# returns from the running cell.
__cella_marker=$CELLA_INTERP_MARKER
unset CELLA_INTERP_MARKER
__cella_dir=$(mktemp -d "${TMPDIR:-/tmp}/cella-bash.XXXXXX") || exit 1
trap 'rm -rf "$__cella_dir"' EXIT
__cella_n=0
__cella_decode() { if [ "$1" = "-" ]; then :; else printf '%s' "$1" | base64 -d; fi; }
printf '{"type":"ready","kernel":"bash"}\n' >&3
while IFS=' ' read -r __cella_setup __cella_code __cella_teardown <&4; do
  __cella_n=$((__cella_n + 1))
  printf '{"type":"number_of_executions","execution_count":%d}\n' "$__cella_n" >&3
  eval "$(__cella_decode "$__cella_setup")"
  __cella_decode "$__cella_code" >"$__cella_dir/cell"
  trap 'return 130' INT
  . "$__cella_dir/cell" </dev/null 3>&- 4<&-
  __cella_status=$?
  trap '' INT
  eval "$(__cella_decode "$__cella_teardown")"
  if [ "$__cella_status" -ne 0 ]; then
    printf '{"type":"error","name":"ExitStatus","value":"%d","traceback":"the cell ended with exit status %d"}\n' \
      "$__cella_status" "$__cella_status" >&3
  fi
  printf '%s' "$__cella_marker"
  printf '%s' "$__cella_marker" >&2
  printf '{"type":"end"}\n' >&3
done
