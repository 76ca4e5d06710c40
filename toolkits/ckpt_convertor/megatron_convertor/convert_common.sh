# Sourced (POSIX `.`) by hf2mg_3b.sh and mg2hf_3b.sh once they have set SCRIPT_DIR and defined usage().

# need_args N "$@": the usage for -h/--help (exit 0) or when fewer than N arguments are given (exit 2).
need_args() {
    n=$1
    shift
    case "${1:-}" in -h|--help) usage; exit 0 ;; esac
    if [ "$#" -lt "$n" ]; then
        usage >&2
        exit 2
    fi
}

# run_convert VERB ARGS...: `rlinf-ext convert VERB ARGS...`, with the repository root on PYTHONPATH so the
# converter is found even when rlinf_ext is not pip-installed. Environment: PYTHON (default python3).
run_convert() {
    REPO_ROOT=$(CDPATH= cd -- "$SCRIPT_DIR/../../.." && pwd)
    PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
    exec "${PYTHON:-python3}" -m rlinf_ext.cli convert "$@"
}
