# Sheepfold Bash kernel driver. Each request on fd 3 is a header line
# "MARKER CODE_BYTES POST_BYTES" followed by the code and a postlude (which
# restores per-execution variables); it answers "done STATUS" on fd 4.
# Both move first to fds the shell picks (10 and up, which scripts leave
# to the shell), so that a cell's own fds 3 and 4 (exec 3<>/dev/tcp/...)
# leave the driver's channels alone.
exec {__sf_req}<&3 {__sf_msg}>&4 3<&- 4>&-
trap : INT
while IFS=' ' read -r __sf_marker __sf_n __sf_p <&"$__sf_req"; do
	IFS= LC_ALL=C read -r -N "$__sf_n" __sf_code <&"$__sf_req"
	IFS= LC_ALL=C read -r -N "$__sf_p" __sf_post <&"$__sf_req"
	eval "$__sf_code" </dev/null
	__sf_rc=$?
	eval "$__sf_post"
	printf '\036%s\n' "$__sf_marker"
	printf '\036%s\n' "$__sf_marker" >&2
	printf 'done %d\n' "$__sf_rc" >&"$__sf_msg"
done
