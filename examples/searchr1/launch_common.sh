# Sourced by the run_main_*.sh scripts: one place for what they share.
# rlinf_ext_run_launcher SCRIPT DEFAULT_CONFIG VERB [CONFIG_NAME|CONFIG.yaml] [key=value ...]
#   SCRIPT: the calling script (its header comment is the --help text); VERB: the `rlinf-ext` verb it runs
#   (train or eval), with this clone's code first on the path (no `pip install -e .` needed).
# Python: the active virtual environment, else the repo's .venv, else python3 on PATH.
rlinf_ext_run_launcher() {
  local script="$1" config="$2" verb="$3"
  shift 3
  local repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [ $# -gt 0 ]; then
    case "$1" in
      -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$script"; exit 0 ;;
      *=*) ;;                       # only overrides given: keep the default config
      *) config="$1"; shift ;;
    esac
  fi
  local python_bin
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    python_bin="$VIRTUAL_ENV/bin/python"
  elif [ -x "$repo/.venv/bin/python" ]; then
    python_bin="$repo/.venv/bin/python"
  else
    python_bin="$(command -v python3 || command -v python)"
  fi
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  exec "$python_bin" -m rlinf_ext.cli "$verb" "$config" "$@"
}
