# Sheepfold Bash kernel driver. Each request on fd 3 is a header line
# "MARKER CODE_BYTES POST_BYTES" followed by the code and a postlude (which
# restores per-execution variables); it answers "done STATUS" on fd 4.
trap : INT
while IFS=' ' read -r __sf_marker __sf_n __sf_p <&3; do
	IFS= LC_ALL=C read -r -N "$__sf_n" __sf_code <&3
	IFS= LC_ALL=C read -r -N "$__sf_p" __sf_post <&3
	eval "$__sf_code" </dev/null
	__sf_rc=$?
	eval "$__sf_post"
	printf '\036%s\n' "$__sf_marker"
	printf '\036%s\n' "$__sf_marker" >&2
	printf 'done %d\n' "$__sf_rc" >&4
done
